// One training step of a model, run either traced on a fake device or for
// real on CPU, from the same code.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "profiler/Trace.h"

namespace metamem {

// Owns a model's parameters, buffers and inputs (made when it is built) and
// computes the loss of one forward pass.
class TrainingStep {
 public:
  virtual ~TrainingStep() = default;
  virtual at::Tensor forward_loss() = 0;
  virtual std::vector<at::Tensor> parameters() = 0;
  // Host memory the step holds that is no tensor of the model and would not
  // be on a device (the TorchScript loader keeps its debug records): left
  // out of the achieved CPU peak.
  virtual std::int64_t host_only_bytes() const { return 0; }
};

// Builds a step on whatever device factories produce now: MetaTensors under
// a Tracer, real CPU tensors otherwise.
using StepBuilder = std::function<std::unique_ptr<TrainingStep>()>;

enum class Optimizer { None, Sgd, Momentum, Adam, AdamW };

// "none", "sgd", "momentum", "adam", "adamw"; throws std::invalid_argument.
Optimizer parse_optimizer(const std::string& name);
// Tensors of optimizer state per parameter: momentum 1, adam(w) 2.
int optimizer_states_per_parameter(Optimizer optimizer);

struct StepOptions {
  Optimizer optimizer = Optimizer::None;
  // Mixed precision: the optimizer updates fp32 copies of the parameters
  // (made at setup) and the model's low-precision ones are copied back.
  bool fp32_master_weights = false;
};

// Setup (build, optimizer), forward, loss, backward, optimizer step on
// `fake_device`; the peak is the step's, from forward on.
Trace trace_step(const StepBuilder& build, c10::Device fake_device, const StepOptions& options = {});

// The same step on real CPU tensors: peak bytes held through the CPU
// allocator from the step's start (model and inputs live) to its end.
std::int64_t achieved_cpu_peak(const StepBuilder& build, const StepOptions& options = {});

}  // namespace metamem
