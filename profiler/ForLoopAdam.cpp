#include "profiler/ForLoopAdam.h"

#include <ATen/ops/zeros_like.h>
#include <torch/optim/adamw.h>

#include <cmath>

namespace metamem {
namespace {
constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;
}

ForLoopAdam::ForLoopAdam(std::vector<at::Tensor> params, double lr, double weight_decay, bool decoupled)
    : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                              std::make_unique<torch::optim::AdamWOptions>(lr)),
      lr_(lr),
      weight_decay_(weight_decay),
      decoupled_(decoupled) {}

at::Tensor ForLoopAdam::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  const std::vector<at::Tensor>& params = param_groups_.front().params();
  steps_.resize(params.size(), 0);
  exp_avg_.resize(params.size());
  exp_avg_sq_.resize(params.size());
  for (std::size_t i = 0; i < params.size(); ++i)
    if (params[i].grad().defined() && !exp_avg_[i].defined()) {
      exp_avg_[i] = at::zeros_like(params[i], at::MemoryFormat::Preserve);
      exp_avg_sq_[i] = at::zeros_like(params[i], at::MemoryFormat::Preserve);
    }
  at::Tensor denom;  // lives on into the next parameter's turn, as the Python local does
  for (std::size_t i = 0; i < params.size(); ++i) {
    at::Tensor p = params[i];
    at::Tensor grad = p.grad();
    if (!grad.defined()) continue;
    const auto step = static_cast<double>(++steps_[i]);
    const double bias_correction1 = 1 - std::pow(kBeta1, step);
    const double bias_correction2_sqrt = std::sqrt(1 - std::pow(kBeta2, step));
    if (decoupled_)
      p.mul_(1 - lr_ * weight_decay_);
    else if (weight_decay_ != 0)
      grad = grad.add(p, weight_decay_);
    exp_avg_[i].mul_(kBeta1).add_(grad, 1 - kBeta1);
    exp_avg_sq_[i].mul_(kBeta2).addcmul_(grad, grad, 1 - kBeta2);
    denom = (exp_avg_sq_[i].sqrt() / bias_correction2_sqrt).add_(kEps);
    p.addcdiv_(exp_avg_[i], denom, -lr_ / bias_correction1);
  }
  return loss;
}

}  // namespace metamem
