// Models written in Python: a TorchScript file, its inputs and a loss.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "profiler/Step.h"

namespace metamem {

// "32x3x224x224" or "32x3x224x224:f32" (f32, f16, bf16, i64).
struct InputSpec {
  std::vector<std::int64_t> sizes;
  c10::ScalarType dtype = c10::kFloat;
};
InputSpec parse_input_spec(const std::string& text);  // throws std::invalid_argument

// "sum" or "cross_entropy:CLASSES" (targets: class 0 for every row).
struct LossSpec {
  std::int64_t classes = 0;  // 0: sum of the output
};
LossSpec parse_loss_spec(const std::string& text);  // throws std::invalid_argument

struct ScriptConfig {
  std::string path;
  std::vector<InputSpec> inputs;
  LossSpec loss;
};

// Names a model file rather than a zoo model.
bool is_script_path(const std::string& model);

// Reads the file once, onto the meta device (no real weights); each traced
// build clones it into MetaTensors, each real build loads it on CPU. Module
// scopes come from the module hierarchy (layer1.0.conv1). Throws
// std::invalid_argument for a file that is not TorchScript; inputs that do
// not fit the model's forward fail the step with std::invalid_argument.
StepBuilder script_step(const ScriptConfig& config);

}  // namespace metamem
