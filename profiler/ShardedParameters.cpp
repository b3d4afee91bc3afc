#include "profiler/ShardedParameters.h"

#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/function.h>

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

#include "meta/MetaMode.h"
#include "profiler/AccumulationHook.h"
#include "profiler/Tracer.h"

namespace metamem {

ShardedParameters::~ShardedParameters() = default;

ShardedParameters::ShardedParameters(std::vector<at::Tensor> params,
                                     const std::vector<std::vector<at::Tensor>>& units, int ranks,
                                     bool forward_prefetch)
    : params_(std::move(params)), gathered_(params_.size(), true), forward_prefetch_(forward_prefetch) {
  std::unordered_map<const c10::TensorImpl*, std::size_t> index;
  for (std::size_t i = 0; i < params_.size(); ++i) index[params_[i].unsafeGetTensorImpl()] = i;
  std::vector<bool> in_unit(params_.size(), false);
  for (const auto& unit : units) {
    units_.emplace_back();
    for (const at::Tensor& p : unit) {
      const auto found = index.find(p.unsafeGetTensorImpl());
      if (found == index.end()) throw std::logic_error("a unit's parameter is not one of the model's");
      units_.back().push_back(found->second);
      in_unit[found->second] = true;
    }
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    full_bytes_.push_back(static_cast<std::size_t>(p.numel()) * p.element_size());
    shards_.push_back(at::empty({(p.numel() + ranks - 1) / ranks}, p.options()).requires_grad_());
    if (!in_unit[i]) root_.push_back(i);
    if (auto accumulator = after_accumulation(p, [this, i] { hand_off(i); }))
      accumulators_.push_back(std::move(accumulator));
    release(i);
  }
}

void ShardedParameters::begin_forward() {
  in_backward_ = false;
  for (std::size_t i : root_) gather(i);
}

void ShardedParameters::before_unit(std::int32_t unit) {
  if (static_cast<std::size_t>(unit) >= units_.size()) return;
  gather_unit(unit);
  if (forward_prefetch_ && !in_backward_ && static_cast<std::size_t>(unit) + 1 < units_.size())
    gather_unit(unit + 1);
}

void ShardedParameters::after_unit(std::int32_t unit, const at::Tensor& output) {
  // A recomputation in backward keeps the parameters for the backward that follows.
  if (static_cast<std::size_t>(unit) >= units_.size() || in_backward_) return;
  for (std::size_t i : units_[static_cast<std::size_t>(unit)]) release(i);
  if (output.requires_grad())
    output.register_hook([this, unit](const at::Tensor&) {
      gather_unit(unit);
      if (unit > 0) gather_unit(unit - 1);
    });
}

void ShardedParameters::gather(std::size_t param) {
  if (gathered_[param]) return;
  resize_storage(params_[param], full_bytes_[param]);
  Tracer::mark({params_[param]}, Category::Parameter);
  gathered_[param] = true;
}

void ShardedParameters::release(std::size_t param) {
  if (!gathered_[param]) return;
  resize_storage(params_[param], 0);
  gathered_[param] = false;
}

void ShardedParameters::gather_unit(std::int32_t unit) {
  for (std::size_t i : units_[static_cast<std::size_t>(unit)]) gather(i);
}

void ShardedParameters::hand_off(std::size_t param) {
  at::Tensor& grad = params_[param].mutable_grad();
  if (!grad.defined()) return;
  at::Tensor& shard_grad = shards_[param].mutable_grad();
  const at::Tensor part = at::empty(shards_[param].sizes(), grad.options());  // the reduce-scatter's output
  const std::int64_t n = std::min(part.numel(), grad.numel());
  part.narrow(0, 0, n).copy_(grad.reshape({-1}).narrow(0, 0, n));
  if (shard_grad.defined())
    shard_grad.add_(part);
  else
    shard_grad = part;
  grad.reset();
  release(param);
}

}  // namespace metamem
