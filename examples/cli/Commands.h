// The metamem commands: each parses its arguments (the command name
// excluded) and returns the exit code; mistakes throw UsageError.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "estimator/FakeGpuRecordings.h"

namespace metamem::cli {

int profile_command(const std::vector<std::string>& args);
int plan_command(const std::vector<std::string>& args);
int fit_command(const std::vector<std::string>& args);
int checkpoint_command(const std::vector<std::string>& args);

// Whether the Python engine runs the command: `run SCRIPT` (a training
// script), or one that names a transformers or timm model (--hf, --timm).
bool runs_on_python_engine(const std::vector<std::string>& args);

// Runs `python -m metamem ARGS` in this process's place (metamem/cli.py):
// the interpreter $METAMEM_PYTHON, else the python3 beside this program (a
// virtual environment's bin/), else python3 on the PATH. Throws
// std::runtime_error when none starts.
[[noreturn]] void run_python_engine(const std::vector<std::string>& args);

// The fake GPU that $METAMEM_FAKE_GPU names (as for Python's traces), run by
// that Python with metamem's child program; none when it is unset.
// std::invalid_argument where that Python has no metamem package.
std::optional<FakeGpu> fake_gpu_of_environment();

}  // namespace metamem::cli
