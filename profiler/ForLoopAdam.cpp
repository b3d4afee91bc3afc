#include "profiler/ForLoopAdam.h"

#include <ATen/ops/zeros_like.h>

#include <cmath>

namespace metamem {

ForLoopAdam::ForLoopAdam(std::vector<at::Tensor> params, const torch::optim::AdamWOptions& options,
                         bool decoupled)
    : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                              std::make_unique<torch::optim::AdamWOptions>(options)),
      decoupled_(decoupled) {}

at::Tensor ForLoopAdam::step(LossClosure closure) {
  at::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  const std::vector<at::Tensor>& params = param_groups_.front().params();
  const auto& options = static_cast<const torch::optim::AdamWOptions&>(param_groups_.front().options());
  const auto [beta1, beta2] = options.betas();
  const double lr = options.lr(), weight_decay = options.weight_decay();
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
    const double bias_correction1 = 1 - std::pow(beta1, step);
    const double bias_correction2_sqrt = std::sqrt(1 - std::pow(beta2, step));
    if (decoupled_)
      p.mul_(1 - lr * weight_decay);
    else if (weight_decay != 0)
      grad = grad.add(p, weight_decay);
    exp_avg_[i].mul_(beta1).add_(grad, 1 - beta1);
    exp_avg_sq_[i].mul_(beta2).addcmul_(grad, grad, 1 - beta2);
    denom = (exp_avg_sq_[i].sqrt() / bias_correction2_sqrt).add_(options.eps());
    p.addcdiv_(exp_avg_[i], denom, -lr / bias_correction1);
  }
  return loss;
}

}  // namespace metamem
