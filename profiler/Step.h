// One training step of a model, run either traced on a fake device or for
// real on CPU, from the same code.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "profiler/Trace.h"

namespace metamem {

// Owns a model's parameters, buffers and inputs (made when it is built) and
// computes the loss of one forward pass.
class TrainingStep {
 public:
  virtual ~TrainingStep() = default;
  virtual at::Tensor forward_loss() = 0;
};

// Builds a step on whatever device factories produce now: MetaTensors under
// a Tracer, real CPU tensors otherwise.
using StepBuilder = std::function<std::unique_ptr<TrainingStep>()>;

// Setup (build), forward, backward on `fake_device`; the peak is the step's.
Trace trace_step(const StepBuilder& build, c10::Device fake_device);

// The same step on real CPU tensors: peak bytes held through the CPU
// allocator from the step's start (model and inputs live) to its end.
std::int64_t achieved_cpu_peak(const StepBuilder& build);

}  // namespace metamem
