// Byte counts worked out by hand: identity by storage, saved tensors once.
#include <gtest/gtest.h>
#include <torch/types.h>

#include "meta/MetaMode.h"
#include "profiler/Tracer.h"
#include "tests/FunctionStep.h"
#include "tests/KnownGaps.h"

namespace metamem {
namespace {

using testing::function_step;
using testing::Tensors;

const c10::Device kCpu(c10::kCPU);

std::size_t buffers_made_in(const Trace& trace, Phase phase) {
  std::size_t n = 0;
  for (const Buffer& b : trace.buffers) n += b.phase == phase;
  return n;
}

TEST(Accounting, ViewsAndDetachAddNothing) {
  Tracer tracer(kCpu);
  at::Tensor x = torch::randn({4, 8});  // 128 bytes
  tracer.begin_forward();
  at::Tensor v = x.view({32});
  at::Tensor d = x.detach();
  at::Tensor t = x.t();
  at::Tensor s = x.select(0, 1);
  EXPECT_EQ(buffer_of(v), buffer_of(x));
  EXPECT_EQ(buffer_of(d), buffer_of(x));
  EXPECT_EQ(buffer_of(t), buffer_of(x));
  EXPECT_EQ(buffer_of(s), buffer_of(x));
  const Trace trace = tracer.finish();
  EXPECT_EQ(buffers_made_in(trace, Phase::Forward), 0u);
  EXPECT_EQ(trace.measured().peak_bytes, 128);
}

TEST(Accounting, InPlaceOpsWriteTheirInputsBuffer) {
  Tracer tracer(kCpu);
  at::Tensor x = torch::randn({256});  // 1024 bytes
  tracer.begin_forward();
  at::Tensor y = x + x;  // the only new buffer: 1024 bytes
  at::Tensor same = y.relu_().add_(x).mul_(x);
  EXPECT_TRUE(same.is_same(y));
  const Trace trace = tracer.finish();
  EXPECT_EQ(buffers_made_in(trace, Phase::Forward), 1u);
  EXPECT_EQ(trace.measured().peak_bytes, 2048);
  const OpEvent& relu = trace.ops[trace.ops.size() - 3];
  EXPECT_EQ(trace.op_name(relu), "aten::relu_");
  EXPECT_EQ(trace.outputs(relu), trace.inputs(relu));
}

// relu's output is saved by ReluBackward, sin and cos: one buffer, counted once.
TEST(Accounting, TensorSavedByThreeNodesCountsOnce) {
  Tracer tracer(kCpu);
  at::Tensor x = torch::randn({256}).requires_grad_();
  tracer.begin_forward();
  at::Tensor r = torch::relu(x);
  at::Tensor loss = (r.sin() + r.cos()).sum();
  tracer.begin_backward({loss});
  const Trace trace = tracer.finish();
  EXPECT_EQ(trace.saved_for_backward_bytes(), 1024);
}

// W is used twice; its gradient is accumulated into one buffer.
TEST(Accounting, SharedWeightHasOneGradientBuffer) {
  at::Tensor weight_grad;
  Tracer tracer(kCpu);
  at::Tensor w = torch::randn({16, 16}).requires_grad_();  // 1024 bytes
  at::Tensor x = torch::randn({4, 16});                    // 256 bytes
  tracer.begin_forward();
  at::Tensor loss = torch::mm(torch::mm(x, w), w).pow(2).sum();
  tracer.begin_backward({loss});
  loss.backward();
  EXPECT_NE(buffer_of(w.grad()), 0u);
  const Trace trace = tracer.finish();
  std::int64_t live_grads = 0;
  for (const Buffer& b : trace.buffers)
    if (b.phase == Phase::Backward && b.free_event == Buffer::kAlive) live_grads += b.bytes;
  EXPECT_EQ(live_grads, 1024);
}

TEST(Accounting, SharedWeightParityOnCpu) {
  const StepBuilder build = function_step(
      [] { return Tensors{torch::randn({64, 64}).requires_grad_(), torch::randn({32, 64})}; },
      [](Tensors& t) { return torch::mm(torch::relu(torch::mm(t[1], t[0])), t[0]).pow(2).sum(); });
  testing::expect_cpu_parity(trace_step(build, kCpu).measured().peak_bytes, achieved_cpu_step_peaks(build).back());
}

}  // namespace
}  // namespace metamem
