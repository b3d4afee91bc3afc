#include "examples/zoo/TensorParallel.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <map>
#include <tuple>

#include "profiler/Tracer.h"

namespace metamem {

using torch::autograd::variable_list;

at::Tensor dense(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!bias.defined()) return x.matmul(weight.t());
  auto sizes = x.sizes().vec();
  const at::Tensor y = bias.addmm(x.reshape({-1, sizes.back()}), weight.t());
  sizes.back() = y.size(1);
  return y.view(sizes);
}

namespace {

// The rank's chunk of the sequence: a new tensor (a reduce-scatter's output,
// or a split's, which Megatron clones).
at::Tensor chunk_of(const at::Tensor& x, std::int64_t ranks) {
  return x.narrow(1, 0, x.size(1) / ranks).clone(at::MemoryFormat::Contiguous);
}

// The whole sequence gathered from every rank's chunk, into `out`: one
// broadcast copy rather than one per rank, as tracing pays per op.
at::Tensor gather_into(at::Tensor out, const at::Tensor& chunk) {
  auto per_rank = chunk.sizes().vec();
  per_rank.insert(per_rank.begin() + 1, out.size(1) / chunk.size(1));
  out.view(per_rank).copy_(chunk.unsqueeze(1));
  return out;
}

std::vector<std::int64_t> gathered_sizes(const at::Tensor& chunk, std::int64_t ranks) {
  auto sizes = chunk.sizes().vec();
  sizes[1] *= ranks;
  return sizes;
}

at::Tensor all_gather(const at::Tensor& chunk, std::int64_t ranks) {
  return gather_into(at::empty(gathered_sizes(chunk, ranks), chunk.options()), chunk);
}

// Forward: reduce-scatter (or split) to the rank's chunk; backward: all-gather.
class ToSequenceChunk : public torch::autograd::Function<ToSequenceChunk> {
 public:
  static variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, std::int64_t ranks) {
    ctx->saved_data["ranks"] = ranks;
    return {chunk_of(x, ranks)};
  }
  static variable_list backward(torch::autograd::AutogradContext* ctx, variable_list grads) {
    return {all_gather(grads[0], ctx->saved_data["ranks"].toInt()), at::Tensor()};
  }
};

}  // namespace

// Megatron's global memory buffer: one persistent buffer per dtype that
// every sequence-parallel linear gathers its input into, grown when too small.
class GatherBuffer {
 public:
  at::Tensor gather(const at::Tensor& chunk, std::int64_t ranks) {
    const auto sizes = gathered_sizes(chunk, ranks);
    const std::int64_t numel = c10::multiply_integers(sizes);
    at::Tensor& buffer = buffers_[chunk.scalar_type()];
    if (!buffer.defined() || buffer.numel() < numel) {
      buffer = at::empty({numel}, chunk.options());
      Tracer::mark({buffer}, Category::Communication);
    }
    return gather_into(buffer.narrow(0, 0, numel).view(sizes), chunk);
  }

 private:
  std::map<at::ScalarType, at::Tensor> buffers_;
};

namespace {

// Megatron's LinearWithGradAccumulationAndAsyncCommunication under sequence
// parallelism: keeps the input chunk, gathers it again for the weight's
// gradient, and reduce-scatters the input's gradient.
class GatheredLinearBackward final : public torch::autograd::Node {
 public:
  GatheredLinearBackward(const at::Tensor& chunk, const at::Tensor& weight, bool bias, std::int64_t ranks,
                         std::shared_ptr<GatherBuffer> buffer)
      : chunk_(chunk, false), weight_(weight, false), bias_(bias), ranks_(ranks), buffer_(std::move(buffer)) {}

  std::string name() const override { return "GatheredLinearBackward"; }

  variable_list apply(variable_list&& grads) override {
    const at::Tensor chunk = chunk_.unpack(), weight = weight_.unpack();
    const at::Tensor total = buffer_->gather(chunk, ranks_);
    const at::Tensor grad = grads[0].reshape({-1, grads[0].size(-1)});
    variable_list out(3);
    if (should_compute_output(0)) out[0] = chunk_of(grad.mm(weight).view(total.sizes()), ranks_);
    if (should_compute_output(1)) out[1] = grad.t().mm(total.reshape({-1, total.size(-1)}));
    if (bias_ && should_compute_output(2)) out[2] = grad.sum(0);
    return out;
  }

  void release_variables() override {
    chunk_.reset_data();
    weight_.reset_data();
  }

 private:
  torch::autograd::SavedVariable chunk_, weight_;
  bool bias_;
  std::int64_t ranks_;
  std::shared_ptr<GatherBuffer> buffer_;
};

at::Tensor gathered_linear(const at::Tensor& chunk, const at::Tensor& weight, const at::Tensor& bias,
                           std::int64_t ranks, const std::shared_ptr<GatherBuffer>& buffer) {
  at::Tensor output;
  {
    at::NoGradGuard no_grad;
    output = dense(buffer->gather(chunk, ranks), weight, bias);
  }
  if (torch::autograd::compute_requires_grad(chunk, weight, bias)) {
    auto node = c10::make_intrusive<GatheredLinearBackward>(chunk, weight, bias.defined(), ranks, buffer);
    node->set_next_edges(torch::autograd::collect_next_edges(chunk, weight, bias));
    torch::autograd::set_history(output, node);
  }
  return output;
}

class VocabParallelCrossEntropy : public torch::autograd::Function<VocabParallelCrossEntropy> {
 public:
  // Per-row losses; the rank's columns are the vocabulary's first ones.
  static variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                               const at::Tensor& targets) {
    const std::int64_t columns = logits.size(1);
    const at::Tensor max = std::get<0>(logits.max(-1));  // all-reduced (max)
    at::Tensor exp = logits - max.unsqueeze(-1);
    const at::Tensor outside = targets.lt(0) | targets.ge(columns);
    const at::Tensor local = targets.masked_fill(outside, 0);
    // All-reduced: the logit of each row's target, from the rank that holds it.
    const at::Tensor predicted = exp.gather(1, local.unsqueeze(1)).squeeze(1).masked_fill_(outside, 0);
    exp.exp_();
    const at::Tensor sum = exp.sum(-1);  // all-reduced
    at::Tensor loss = sum.log() - predicted;
    exp.div_(sum.unsqueeze(-1));
    ctx->save_for_backward({exp, outside, local});
    return {loss};
  }
  static variable_list backward(torch::autograd::AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor grad = saved[0];  // the softmax
    grad.scatter_add_(1, saved[2].unsqueeze(1), (saved[1].to(grad.scalar_type()) - 1).unsqueeze(1));
    grad.mul_(grads[0].unsqueeze(-1));
    return {grad, at::Tensor()};
  }
};

}  // namespace

TensorParallelRank::TensorParallelRank(TensorParallel config)
    : config_(config), gather_buffer_(std::make_shared<GatherBuffer>()) {}

at::Tensor TensorParallelRank::column_linear(const at::Tensor& x, const at::Tensor& weight,
                                             const at::Tensor& bias) const {
  if (config_.ranks > 1 && config_.sequence_parallel)
    return gathered_linear(x, weight, bias, config_.ranks, gather_buffer_);
  return dense(x, weight, bias);
}

at::Tensor TensorParallelRank::row_linear(const at::Tensor& x, const at::Tensor& weight,
                                          const at::Tensor& bias) const {
  if (config_.ranks == 1) return dense(x, weight, bias);
  at::Tensor y = sequence_chunk(dense(x, weight));
  return bias.defined() ? y + bias : y;
}

at::Tensor TensorParallelRank::embedding(const at::Tensor& ids, const at::Tensor& weight) const {
  if (config_.ranks == 1) return at::embedding(weight, ids);
  const at::Tensor outside = ids.lt(0) | ids.ge(weight.size(0));
  return at::embedding(weight, ids.masked_fill(outside, 0)).masked_fill_(outside.unsqueeze(-1), 0.0);
}

at::Tensor TensorParallelRank::sequence_chunk(const at::Tensor& x) const {
  if (config_.ranks == 1 || !config_.sequence_parallel) return x;
  return ToSequenceChunk::apply(x, config_.ranks)[0];
}

at::Tensor TensorParallelRank::cross_entropy(const at::Tensor& logits, const at::Tensor& targets) const {
  if (config_.ranks == 1) return at::cross_entropy_loss(logits, targets);
  return VocabParallelCrossEntropy::apply(logits, targets)[0].mean();
}

}  // namespace metamem
