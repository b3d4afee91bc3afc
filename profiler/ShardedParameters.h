// ZeRO stage 3 (FSDP's FULL_SHARD) as one data-parallel rank holds it: each
// parameter lives as the rank's shard; its full storage exists only while
// gathered. Used by the training steps (Step.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "profiler/Chain.h"

namespace torch::autograd {
class Node;
}

namespace metamem {

// A parameter's shard is 1/ranks of its elements, rounded up (DeepSpeed pads
// each parameter so). Its full storage is allocated (all-gathered) for the
// forward of its unit — a unit of the model's chain; the other parameters
// form the root unit, gathered when forward begins — freed after it, gathered
// again when the unit's backward begins (the unit before it too: FSDP's
// BACKWARD_PRE prefetch), and freed once autograd has accumulated its
// gradient, which is then reduce-scattered into the rank's gradient shard
// (added to it under gradient accumulation) and freed. With forward
// prefetch, a unit's forward gathers the next unit as well (FSDP's
// forward_prefetch). Collectives are stand-ins: the memory of their
// outputs, not their values.
class ShardedParameters final : public UnitHooks {
 public:
  // `units`: the parameters of each unit of the chain, in order.
  ShardedParameters(std::vector<at::Tensor> params, const std::vector<std::vector<at::Tensor>>& units, int ranks,
                    bool forward_prefetch = false);
  ~ShardedParameters() override;  // where autograd's Node is complete

  // The rank's shards: leaf tensors whose gradients are the gradient shards.
  const std::vector<at::Tensor>& shards() const { return shards_; }
  // A forward pass begins (gathers the root unit) or its backward does.
  void begin_forward();
  void begin_backward() { in_backward_ = true; }

  void before_unit(std::int32_t unit) override;
  void after_unit(std::int32_t unit, const at::Tensor& output) override;

 private:
  void gather(std::size_t param);
  void release(std::size_t param);
  void gather_unit(std::int32_t unit);
  // After autograd accumulated the parameter's gradient.
  void hand_off(std::size_t param);

  std::vector<at::Tensor> params_, shards_;
  std::vector<std::vector<std::size_t>> units_;  // parameter indices of each unit
  std::vector<std::size_t> root_;                // parameters in no unit
  std::vector<std::size_t> full_bytes_;         // of each parameter, whole
  std::vector<bool> gathered_;
  std::vector<c10::intrusive_ptr<torch::autograd::Node>> accumulators_;  // keep the hooks alive
  bool forward_prefetch_;
  bool in_backward_ = false;
};

}  // namespace metamem
