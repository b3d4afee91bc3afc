#include "examples/zoo/Transformer.h"

#include <torch/types.h>

#include "profiler/Tracer.h"

namespace metamem {

TransformerStep::TransformerStep(const char* name, const ZooConfig& c)
    : tp_(c.tensor_parallel),
      stage_(c.pipeline),
      first_layer_(c.layers / stage_.stages * stage_.stage),
      end_layer_(first_layer_ + c.layers / stage_.stages),
      name_(name),
      checkpoint_(c.checkpoint),
      received_{c.batch, c.tensor_parallel.sequence_parallel ? tp_.shard(c.seq) : c.seq, c.width},
      dtype_(c.dtype) {
  // True above the diagonal: positions a token may not attend to.
  causal_mask_ = register_buffer(
      "causal_mask", torch::ones({c.seq, c.seq}, torch::kBool).triu(1).view({1, 1, c.seq, c.seq}));
  if (stage_.first()) tokens_ = register_buffer("tokens", torch::zeros({c.batch, c.seq}, torch::kLong));
  if (stage_.last()) targets_ = register_buffer("targets", torch::zeros({c.batch * c.seq}, torch::kLong));
}

void TransformerStep::add_block(const std::string& prefix, std::int64_t index,
                                std::shared_ptr<torch::nn::Module> block,
                                std::function<at::Tensor(const at::Tensor&)> forward) {
  blocks_.push_back(register_module(prefix + "_" + std::to_string(index), std::move(block)));
  units_.push_back({{prefix, std::to_string(index)}, std::move(forward)});
}

at::Tensor TransformerStep::forward_loss() {
  ModuleScope root(name_);
  at::Tensor x;
  if (stage_.first()) {
    x = embed();
  } else {
    // What the stage receives per micro-batch: a new buffer whose gradient
    // it sends back, on the model's device (a real run moves the model).
    ModuleScope recv("recv");
    x = torch::empty(received_, causal_mask_.options().dtype(dtype_)).requires_grad_();
  }
  x = run_chain(units_, std::move(x), checkpoint_);
  if (!stage_.last()) return x;
  const at::Tensor logits = head(x);
  return tp_.cross_entropy(logits.view({-1, logits.size(-1)}), targets_);
}

}  // namespace metamem
