#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "examples/cli/Commands.h"

namespace metamem::cli {

bool runs_on_python_engine(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "run") return true;  // a training script
  return std::any_of(args.begin(), args.end(),
                     [](const std::string& a) { return a == "--hf" || a == "--timm" || a == "--torchtitan"; });
}

namespace {

// Whether `python` runs and finds the metamem package: a look, not an
// import (importing torch takes seconds), so that a Python that cannot run
// the engine is named instead of exiting with its own silent status.
bool finds_metamem(const std::string& python) {
  const pid_t child = fork();
  if (child == 0) {
    execlp(python.c_str(), python.c_str(), "-c",
           "import importlib.util, sys; sys.exit(importlib.util.find_spec('metamem') is None)", nullptr);
    _exit(127);
  }
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

void run_python_engine(const std::vector<std::string>& args) {
  std::string python = "python3";
  if (const char* chosen = std::getenv("METAMEM_PYTHON"); chosen != nullptr && *chosen != '\0') {
    python = chosen;
  } else {
    std::error_code error;
    const auto beside = std::filesystem::read_symlink("/proc/self/exe", error).parent_path() / "python3";
    if (!error && std::filesystem::exists(beside)) python = beside.string();
  }
  if (!finds_metamem(python))
    throw std::invalid_argument(python + " cannot run metamem's Python engine for --hf, --timm, --torchtitan and run (it fails, or has "
                                "no metamem package); set METAMEM_PYTHON to the Python that has metamem and "
                                "transformers or timm");
  std::vector<std::string> command{python, "-m", "metamem"};
  command.insert(command.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : command) argv.push_back(arg.data());
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  throw std::runtime_error("cannot run " + python + " -m metamem for --hf, --timm, --torchtitan and run (" + std::strerror(errno) +
                           "); set METAMEM_PYTHON to the Python that has metamem and transformers or timm");
}

}  // namespace metamem::cli
