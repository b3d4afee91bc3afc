// Models written in Python: a TorchScript file, its inputs and a loss.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "profiler/Chain.h"
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
  // With a policy, the model's chain runs as units (Unit regions of the
  // trace), those of its segments recomputed in backward: the longest run
  // of submodules its forward calls one after the other, each taking the
  // last one's output alone (a Sequential's layers; a torchvision ResNet's
  // stem and stages), its own methods' calls inlined first. Without one,
  // the interpreter runs forward as it is.
  std::optional<CheckpointPolicy> checkpoint;
};

// Names a model file rather than a zoo model.
bool is_script_path(const std::string& model);

// Reads the file once, onto the meta device (no real weights); each traced
// build clones it into MetaTensors, each real build loads it on CPU. Module
// scopes come from the module hierarchy (layer1.0.conv1). Throws
// std::invalid_argument for a file that is not TorchScript, and for a
// policy outside the model's chain (or one given a model without one);
// inputs that do not fit the model's forward fail the step with
// std::invalid_argument.
StepBuilder script_step(const ScriptConfig& config);

}  // namespace metamem
