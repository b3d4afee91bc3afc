// Tracing on a fake CUDA device with a CPU-only libtorch.
#include <gtest/gtest.h>
#include <torch/types.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "meta/CublasWorkspace.h"
#include "meta/CudaAttention.h"
#include "tests/SmallModels.h"
#include "tests/FunctionStep.h"

namespace metamem {
namespace {

const c10::Device kCuda(c10::kCUDA);

bool traced(const Trace& trace, const std::string& op) {
  return std::find(trace.op_names.begin(), trace.op_names.end(), op) != trace.op_names.end();
}

TEST(FakeCuda, EveryZooModelRunsForwardAndBackward) {
  for (const std::string& model : zoo_models()) {
    SCOPED_TRACE(model);
    const Trace trace = trace_step(zoo_step(testing::small_model(model, 2, 32)), kCuda);
    const bool has_backward = std::any_of(trace.ops.begin(), trace.ops.end(),
                                          [](const OpEvent& op) { return op.phase == Phase::Backward; });
    EXPECT_TRUE(has_backward);
    EXPECT_GT(trace.measured().peak_bytes, trace.measured().begin_bytes);
  }
}

// CUDA runs fused dropout; CPU runs bernoulli_ and a multiply.
TEST(FakeCuda, DropoutTakesTheCudaPath) {
  const StepBuilder mlp = zoo_step(testing::small_model("mlp", 2, 0));
  const Trace cuda = trace_step(mlp, kCuda);
  EXPECT_TRUE(traced(cuda, "aten::native_dropout"));
  EXPECT_FALSE(traced(cuda, "aten::bernoulli_.float"));
  const Trace cpu = trace_step(mlp, c10::Device(c10::kCPU));
  EXPECT_FALSE(traced(cpu, "aten::native_dropout"));
}

// The net that crashed the autograd engine's device thread in the prototype.
TEST(FakeCuda, WeightReusedTwice) {
  using testing::Tensors;
  const StepBuilder build = testing::function_step(
      [] { return Tensors{torch::randn({64, 64}).requires_grad_(), torch::randn({32, 64})}; },
      [](Tensors& t) { return torch::mm(torch::relu(torch::mm(t[1], t[0])), t[0]).sum(); });
  const Trace cuda = trace_step(build, kCuda);
  // cuBLAS's workspaces: forward's, and backward's on autograd's device thread
  EXPECT_EQ(cuda.measured().peak_bytes,
            trace_step(build, c10::Device(c10::kCPU)).measured().peak_bytes + 2 * cublas_workspace_bytes(9, 0));
}

// On fake cuda the first product of a thread makes cuBLAS's workspace for
// its handle, kept to the end and made once: forward's, and backward's (on
// autograd's device thread in a real run). The traced GPU sizes it, as does
// CUBLAS_WORKSPACE_CONFIG.
TEST(FakeCuda, EachThreadsFirstProductMakesCublassWorkspace) {
  using testing::Tensors;
  const StepBuilder build = testing::function_step(
      [] { return Tensors{torch::randn({64, 64}).requires_grad_(), torch::randn({32, 64})}; },
      [](Tensors& t) { return torch::mm(torch::mm(t[1], t[0]), t[0]).sum(); });
  auto workspaces = [](const Trace& trace) {
    std::vector<std::int64_t> bytes;
    for (const Buffer& buffer : trace.buffers)
      if (buffer.category == Category::Workspace) {
        bytes.push_back(buffer.bytes);
        EXPECT_EQ(buffer.free_event, Buffer::kAlive);
      }
    return bytes;
  };
  EXPECT_EQ(workspaces(trace_step(build, kCuda)), std::vector<std::int64_t>(2, 32 << 20));  // an H100 by default
  {
    const TracedGpuScope a100({8, 0});
    EXPECT_EQ(workspaces(trace_step(build, kCuda)), std::vector<std::int64_t>(2, (8 << 20) + (128 << 10)));
  }
  EXPECT_TRUE(workspaces(trace_step(build, c10::Device(c10::kCPU))).empty());
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:2:16:8", 1);
  EXPECT_EQ(cublas_workspace_bytes(9, 0), (8 << 20) + (128 << 10));
  setenv("CUBLAS_WORKSPACE_CONFIG", "nonsense", 1);  // torch warns and takes its default
  EXPECT_EQ(cublas_workspace_bytes(9, 0), 32 << 20);
  unsetenv("CUBLAS_WORKSPACE_CONFIG");
}

// scaled_dot_product_attention takes the kernel the traced GPU takes, in
// metamem's own programs too (libtorch's CPU library has no CUDA choice).
TEST(FakeCuda, AttentionRunsTheTracedGpusKernel) {
  using testing::Tensors;
  auto attention = [](c10::ScalarType dtype) {
    return testing::function_step(
        [dtype] {
          auto qkv = [dtype] { return torch::randn({2, 4, 128, 64}, torch::dtype(dtype)).requires_grad_(); };
          return Tensors{qkv(), qkv(), qkv()};
        },
        [](Tensors& t) { return at::scaled_dot_product_attention(t[0], t[1], t[2], {}, 0.0, true).sum(); });
  };
  struct Case {
    GpuTraits gpu;
    c10::ScalarType dtype;
    const char* kernel;
  };
  for (const Case& c : {Case{{9, 0}, c10::kBFloat16, "aten::_scaled_dot_product_cudnn_attention"},
                        Case{{8, 0}, c10::kBFloat16, "aten::_scaled_dot_product_flash_attention"},
                        Case{{7, 5}, c10::kHalf, "aten::_scaled_dot_product_efficient_attention"},
                        Case{{9, 0}, c10::kFloat, "aten::_scaled_dot_product_efficient_attention"}}) {
    SCOPED_TRACE(c.kernel);
    const TracedGpuScope gpu(c.gpu);
    const Trace trace = trace_step(attention(c.dtype), kCuda);
    EXPECT_TRUE(traced(trace, c.kernel));
    EXPECT_TRUE(traced(trace, std::string(c.kernel) + "_backward"));
  }
  // Without a GPU of its own, a traced cpu runs PyTorch's CPU flash kernel.
  const Trace cpu = trace_step(attention(c10::kFloat), c10::Device(c10::kCPU));
  EXPECT_TRUE(traced(cpu, "aten::_scaled_dot_product_flash_attention_for_cpu"));
}

}  // namespace
}  // namespace metamem
