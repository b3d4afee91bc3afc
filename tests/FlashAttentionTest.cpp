// metamem::flash_attention: computes softmax attention (its CPU kernel
// against the textbook formula) and holds FlashAttention-2's memory.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/types.h>

#include <cmath>
#include <string>

#include "meta/FlashAttention.h"
#include "profiler/Step.h"
#include "tests/FunctionStep.h"

namespace metamem {
namespace {

using testing::function_step;
using testing::Tensors;

struct Shape {
  std::int64_t batch, seq_q, seq_k, heads, kv_heads, head_dim;
  bool causal;
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << "q " << s.seq_q << " k " << s.seq_k << " heads " << s.heads << "/" << s.kv_heads
      << (s.causal ? " causal" : "");
}

// softmax(q·kᵀ·scale + mask)·v over (batch, heads, seq, head_dim), each
// key/value head repeated for its group of query heads.
at::Tensor reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
  const std::int64_t group = q.size(2) / k.size(2), seq_q = q.size(1), seq_k = k.size(1);
  const at::Tensor qh = q.transpose(1, 2), kh = k.repeat_interleave(group, 2).transpose(1, 2),
                   vh = v.repeat_interleave(group, 2).transpose(1, 2);
  at::Tensor scores = torch::matmul(qh, kh.transpose(2, 3)) / std::sqrt(static_cast<double>(q.size(3)));
  if (causal) {
    const at::Tensor hidden = torch::ones({seq_q, seq_k}, torch::kBool).triu(seq_k - seq_q + 1);
    scores = scores.masked_fill(hidden, -INFINITY);
  }
  return torch::matmul(torch::softmax(scores, -1), vh).transpose(1, 2);
}

class FlashAttentionValues : public ::testing::TestWithParam<Shape> {};

TEST_P(FlashAttentionValues, OutputAndGradientsAreSoftmaxAttentions) {
  const Shape s = GetParam();
  torch::manual_seed(0);
  const auto options = torch::dtype(torch::kFloat).requires_grad(true);
  const at::Tensor q = torch::randn({s.batch, s.seq_q, s.heads, s.head_dim}, options),
                   k = torch::randn({s.batch, s.seq_k, s.kv_heads, s.head_dim}, options),
                   v = torch::randn({s.batch, s.seq_k, s.kv_heads, s.head_dim}, options);
  const at::Tensor weights = torch::randn({s.batch, s.seq_q, s.heads, s.head_dim}, torch::kFloat);

  const at::Tensor flash = flash_attention(q, k, v, 0.0, s.causal);
  const at::Tensor expected = reference(q, k, v, s.causal);
  // Both accumulate in fp32, in different orders.
  EXPECT_TRUE(torch::allclose(flash, expected, 1e-4, 1e-5));
  const auto flash_grads = torch::autograd::grad({(flash * weights).sum()}, {q, k, v});
  const auto expected_grads = torch::autograd::grad({(expected * weights).sum()}, {q, k, v});
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(torch::allclose(flash_grads[i], expected_grads[i], 1e-4, 1e-5)) << "gradient " << i;
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashAttentionValues,
                         ::testing::Values(Shape{2, 16, 16, 4, 4, 8, false}, Shape{2, 16, 16, 4, 4, 8, true},
                                           Shape{1, 12, 20, 6, 2, 16, true}, Shape{2, 7, 7, 4, 1, 8, true},
                                           Shape{1, 9, 13, 2, 2, 24, false}));

// Two query heads per key/value head, a head_dim that the dq accumulator
// rounds up (40 -> 64) and sequences it rounds up (200 -> 256).
constexpr std::int64_t b = 2, s = 200, h = 4, kv = 2, d = 40;

StepBuilder flash_step(at::ScalarType dtype) {
  return function_step(
      [dtype] {
        const auto options = torch::dtype(dtype).requires_grad(true);
        return Tensors{torch::randn({b, s, h, d}, options), torch::randn({b, s, kv, d}, options),
                       torch::randn({b, s, kv, d}, options)};
      },
      // Scaled, q, k and v are activations the op keeps.
      [](Tensors& t) { return flash_attention(t[0] * 2, t[1] * 2, t[2] * 2, 0.0, true).sum(); });
}

std::size_t op_event(const Trace& trace, const std::string& name) {
  for (std::size_t e = 0; e < trace.events.size(); ++e)
    if (trace.events[e].kind == EventKind::Op && trace.op_name(trace.ops[trace.events[e].index]) == name) return e;
  ADD_FAILURE() << name << " not traced";
  return 0;
}

TEST(FlashAttentionMemory, KeepsOutputLogSumExpAndRngStateNoScores) {
  const Trace trace = trace_step(flash_step(at::kBFloat16), c10::Device(c10::kCUDA));
  const OpEvent& forward = trace.ops[trace.events[op_event(trace, "metamem::flash_attention")].index];
  std::vector<std::int64_t> output_bytes;
  for (std::uint32_t buffer : trace.outputs(forward)) output_bytes.push_back(trace.buffers[buffer].bytes);
  const std::int64_t out = b * s * h * d * 2, log_sum_exp = b * h * s * 4, rng_state = 16;
  EXPECT_EQ(output_bytes, (std::vector<std::int64_t>{out, log_sum_exp, rng_state}));
  const std::int64_t q = b * s * h * d * 2, k = b * s * kv * d * 2;
  EXPECT_EQ(trace.saved_for_backward_bytes(), q + 2 * k + out + log_sum_exp + rng_state);
}

TEST(FlashAttentionMemory, BackwardHoldsFp32AccumulatorsAndPerHeadKeyValueGradients) {
  const Trace trace = trace_step(flash_step(at::kBFloat16), c10::Device(c10::kCUDA));
  const std::size_t e = op_event(trace, "metamem::flash_attention_backward");
  // Its scratch is made after its outputs and freed before the op is recorded.
  ASSERT_EQ(trace.events[e - 1].kind, EventKind::Free);
  ASSERT_EQ(trace.events[e - 2].kind, EventKind::Alloc);
  ASSERT_EQ(trace.events[e - 1].index, trace.events[e - 2].index);
  const std::int64_t row_dots = b * h * 256 * 4, dq_accum = b * 256 * h * 64 * 4, per_head = b * s * h * d * 2;
  EXPECT_EQ(trace.buffers[trace.events[e - 2].index].bytes, row_dots + dq_accum + 2 * per_head);
}

TEST(FlashAttentionMemory, TracedPeakIsTheRealCpuRuns) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const StepBuilder build = flash_step(dtype);
    EXPECT_EQ(trace_step(build, c10::Device(c10::kCPU)).measured().peak_bytes,
              achieved_cpu_step_peaks(build).back())
        << dtype;
  }
}

TEST(FlashAttentionFlops, CountVisibleScoresOnly) {
  EXPECT_EQ(flash_attention_scores(4, 4, false), 16);
  EXPECT_EQ(flash_attention_scores(4, 4, true), 10);  // 1 + 2 + 3 + 4
  EXPECT_EQ(flash_attention_scores(2, 4, true), 7);   // bottom right: 3 + 4
  const Trace trace = trace_step(flash_step(at::kBFloat16), c10::Device(c10::kCUDA));
  const std::int64_t scores = b * h * s * (s + 1) / 2;
  EXPECT_EQ(trace.ops[trace.events[op_event(trace, "metamem::flash_attention")].index].flops, 4 * scores * d);
  EXPECT_EQ(trace.ops[trace.events[op_event(trace, "metamem::flash_attention_backward")].index].flops,
            10 * scores * d);
}

TEST(FlashAttentionErrors, Fp32OnFakeCudaIsRefusedAsOnAGpu) {
  try {
    trace_step(flash_step(at::kFloat), c10::Device(c10::kCUDA));
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("FlashAttention-2 runs f16 and bf16 only"), std::string::npos) << e.what();
  }
}

TEST(FlashAttentionErrors, HeadsMustGroupEvenly) {
  const at::Tensor q = torch::randn({1, 4, 3, 8}), kv = torch::randn({1, 4, 2, 8});
  EXPECT_THROW(flash_attention(q, kv, kv), c10::Error);
  EXPECT_THROW(flash_attention(torch::randn({1, 4, 8, 4}).transpose(2, 3), kv, kv), c10::Error);  // strided last dim
  EXPECT_THROW(flash_attention(torch::randn({1, 4, 4, 8}), kv, kv, 1.0), c10::Error);
}

}  // namespace
}  // namespace metamem
