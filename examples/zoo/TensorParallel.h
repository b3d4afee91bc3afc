// Megatron-LM's tensor and sequence parallelism as one rank of the group
// runs it, on one process. Layers hold the rank's shard of each weight
// (rank 0's: ranks differ only in which rows they hold), and collectives are
// stand-ins with the memory of NCCL's, not their values: all-reduce works in
// place (so it costs nothing and is not run at all); all-gather and
// reduce-scatter write a new output, which here repeats or cuts the rank's
// own data. Tensors are batch x sequence x features.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

namespace metamem {

struct TensorParallel {
  std::int64_t ranks = 1;
  // Megatron's sequence parallelism: outside the tensor-parallel layers
  // (norms, dropout, residual adds) each rank holds its chunk of the sequence.
  bool sequence_parallel = false;
};

// x·Wᵀ + b over the last dimension: with a bias, one addmm on the flattened
// input, as PyTorch 2.x runs contiguous 3-d input (1.13 adds the bias in
// place after a matmul, which would change a kept product's output);
// without one, a matmul.
at::Tensor dense(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

class GatherBuffer;

// One rank's layers of a tensor-parallel group; with one rank, plain layers.
class TensorParallelRank {
 public:
  explicit TensorParallelRank(TensorParallel config);

  std::int64_t ranks() const { return config_.ranks; }
  // The rank's share of `n` (which must divide).
  std::int64_t shard(std::int64_t n) const { return n / config_.ranks; }
  // The rank's rows of a vocabulary, padded to a multiple of the ranks.
  std::int64_t vocab_rows(std::int64_t vocab) const { return (vocab + config_.ranks - 1) / config_.ranks; }

  // Column-parallel linear: `weight` holds the rank's output features. The
  // input is replicated and its gradient all-reduced. Under sequence
  // parallelism the input is the rank's chunk, all-gathered into the group's
  // persistent buffer (Megatron's global memory buffer) and gathered again in
  // backward, so that only the chunk is kept.
  at::Tensor column_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {}) const;
  // Row-parallel linear: `weight` holds the rank's input features. Partial
  // sums are all-reduced (reduce-scattered to the rank's chunk under
  // sequence parallelism), then the bias is added.
  at::Tensor row_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {}) const;
  // Vocab-parallel embedding: `weight` holds the rank's rows of the
  // vocabulary; ids outside them give zeros, and the sum is all-reduced.
  at::Tensor embedding(const at::Tensor& ids, const at::Tensor& weight) const;
  // Into the sequence-parallel region: a new tensor of the rank's chunk of
  // the sequence (its gradient all-gathered); without sequence parallelism,
  // `x` itself.
  at::Tensor sequence_chunk(const at::Tensor& x) const;
  // Mean cross-entropy of rows of logits over the rank's vocabulary columns,
  // as Megatron's _VocabParallelCrossEntropy: it keeps the softmax and turns
  // it into the gradient in place.
  at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets) const;

 private:
  TensorParallel config_;
  std::shared_ptr<GatherBuffer> gather_buffer_;
};

}  // namespace metamem
