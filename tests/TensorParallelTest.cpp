// Megatron's tensor and sequence parallelism as one rank runs it: the shard
// a rank holds, its persistent gather buffer, the layers' values where a
// stand-in collective keeps them, and the configurations refused.
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/functional/loss.h>
#include <torch/types.h>

#include <stdexcept>

#include "examples/zoo/Zoo.h"
#include "tests/SmallModels.h"

namespace metamem {
namespace {

const c10::Device kCuda(c10::kCUDA);

ZooConfig gpt2(std::int64_t ranks, bool sequence_parallel) {
  ZooConfig config = testing::small_model("gpt2", 2, 32);
  config.vocab = 101;  // padded to 102 under 2 ranks
  config.tensor_parallel = {ranks, sequence_parallel};
  config.dtype = c10::kBFloat16;
  return config;
}

// Per layer: column-parallel c_attn (3d/t outputs) and c_fc (4d/t) with
// their biases; row-parallel projections (d/t and 4d/t inputs) with whole
// biases; two whole layer norms. Embeddings: the rank's vocabulary rows,
// all positions.
TEST(TensorParallel, RankHoldsMegatronsShardOfGpt2) {
  const std::int64_t d = 64, t = 2, layers = 2, seq = 32, vocab_rows = 102 / t;
  const std::int64_t per_layer = 12 * d * d / t + 7 * d / t + 6 * d;
  const Trace trace = trace_step(zoo_step(gpt2(t, false)), kCuda);
  EXPECT_EQ(trace.parameter_count, vocab_rows * d + seq * d + layers * per_layer + 2 * d);
}

// Under sequence parallelism, linears gather their input into one persistent
// buffer of the whole sequence (batch x seq x width, 16-bit), live from the
// first forward on: a communication buffer of the steady state.
TEST(TensorParallel, SequenceParallelKeepsOneGatherBuffer) {
  const Trace trace = trace_step(zoo_step(gpt2(2, true)), kCuda);
  const CategoryBytes at_start = trace.live_by_category(trace.measured().begin - 1);
  EXPECT_EQ(at_start[static_cast<std::size_t>(Category::Communication)], 2 * 32 * 64 * 2);
  const Trace plain = trace_step(zoo_step(gpt2(2, false)), kCuda);
  EXPECT_EQ(plain.live_by_category(plain.measured().begin - 1)[static_cast<std::size_t>(Category::Communication)],
            0);
}

// The stand-in collectives keep a rank's own values: with every target in the
// rank's columns, vocab-parallel cross-entropy is cross-entropy, gradient too.
TEST(TensorParallel, VocabParallelCrossEntropyIsCrossEntropyOnTheRanksColumns) {
  const at::Tensor logits = torch::randn({6, 10}, torch::requires_grad());
  const at::Tensor targets = torch::tensor({0, 3, 9, 2, 2, 7});
  const at::Tensor loss = TensorParallelRank({2, false}).cross_entropy(logits, targets);
  const auto grad = torch::autograd::grad({loss}, {logits})[0];
  const at::Tensor expected = torch::nn::functional::cross_entropy(logits, targets);
  const auto expected_grad = torch::autograd::grad({expected}, {logits})[0];
  EXPECT_TRUE(torch::allclose(loss, expected));
  EXPECT_TRUE(torch::allclose(grad, expected_grad));
}

// Column-parallel linear under sequence parallelism: the output and the
// weight's gradient are those of the gathered input (here, the chunk twice).
TEST(TensorParallel, GatheredLinearComputesOnTheGatheredSequence) {
  const TensorParallelRank rank({2, true});
  const at::Tensor chunk = torch::randn({2, 3, 8}, torch::requires_grad());
  const at::Tensor weight = torch::randn({5, 8}, torch::requires_grad());
  const at::Tensor bias = torch::randn({5}, torch::requires_grad());
  const at::Tensor y = rank.column_linear(chunk, weight, bias);
  const auto grads = torch::autograd::grad({y.sum()}, {chunk, weight, bias});
  const at::Tensor whole = torch::cat({chunk, chunk}, 1);
  const at::Tensor expected = torch::nn::functional::linear(whole, weight, bias);
  const auto expected_grads = torch::autograd::grad({expected.sum()}, {weight, bias});
  EXPECT_TRUE(torch::allclose(y, expected));
  EXPECT_TRUE(torch::allclose(grads[1], expected_grads[0]));
  EXPECT_TRUE(torch::allclose(grads[2], expected_grads[1]));
  EXPECT_EQ(grads[0].sizes(), chunk.sizes());
}

TEST(TensorParallel, RefusesWhatDoesNotSplit) {
  auto refused = [](ZooConfig config) {
    EXPECT_THROW(zoo_step(config), std::invalid_argument) << config.model;
  };
  refused(gpt2(3, false));  // 4 heads
  ZooConfig odd_seq = gpt2(2, true);
  odd_seq.seq = 31;
  refused(odd_seq);
  ZooConfig llama = testing::small_model("llama", 2, 32);  // 2 key/value heads
  llama.tensor_parallel = {4, false};
  refused(llama);
  ZooConfig mlp = testing::small_model("mlp", 2, 0);
  mlp.tensor_parallel = {2, false};
  refused(mlp);
  refused(gpt2(1, true));  // sequence parallelism without tensor parallelism
  ZooConfig selective_flash = gpt2(2, false);
  selective_flash.selective_recompute = true;
  selective_flash.flash_attention = true;
  refused(selective_flash);
}

}  // namespace
}  // namespace metamem
