// Adam and AdamW as PyTorch's Python optimizers run them with
// foreach=False (torch.optim's for-loop code, the default on CPU): the
// arithmetic of libtorch's C++ classes, with two differences in memory.
// A step makes every parameter's moments before it updates any, and its
// loop keeps the previous parameter's denominator (a local variable) alive
// while it makes the next one. Python's `step` counters, 4-byte CPU tensors,
// are not made: they are not device memory.
#pragma once

#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <vector>

namespace metamem {

class ForLoopAdam final : public torch::optim::Optimizer {
 public:
  // `decoupled`: AdamW (the parameters decay before the update); else Adam,
  // whose gradients take the weight decay. Amsgrad is not modelled.
  ForLoopAdam(std::vector<at::Tensor> params, const torch::optim::AdamWOptions& options, bool decoupled);
  at::Tensor step(LossClosure closure = nullptr) override;

 private:
  bool decoupled_;
  // Per parameter, from its first step with a gradient.
  std::vector<std::int64_t> steps_;
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
};

}  // namespace metamem
