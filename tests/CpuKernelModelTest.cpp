// What libtorch's CPU kernels hold beyond their outputs while they run
// (im2col columns, per-group copies), measured on real CPU and as traced:
// the meta kernels must model it to the byte.
#include <gtest/gtest.h>
#include <torch/types.h>

#include <functional>

#include "profiler/CpuMemoryCounter.h"
#include "profiler/Tracer.h"
#include "tests/FunctionStep.h"
#include "tests/NativeCpuKernels.h"

namespace metamem {
namespace {

using testing::Tensors;
using MakeInputs = std::function<Tensors()>;
using RunOp = std::function<Tensors(Tensors&)>;

std::int64_t bytes_of(const Tensors& tensors) {
  std::int64_t total = 0;
  for (const at::Tensor& t : tensors)
    if (t.defined()) total += t.numel() * static_cast<std::int64_t>(t.element_size());
  return total;
}

// Peak bytes during `op` above the live bytes before it and its outputs.
std::int64_t real_scratch(const MakeInputs& make, const RunOp& op) {
  CpuMemoryCounter counter;
  Tensors inputs = make();
  const std::int64_t before = counter.live_bytes();
  counter.reset_peak();
  const Tensors outputs = op(inputs);
  return counter.peak_bytes() - before - bytes_of(outputs);
}

std::int64_t traced_scratch(const MakeInputs& make, const RunOp& op) {
  Tracer tracer(c10::Device(c10::kCPU));
  Tensors inputs = make();
  tracer.begin_forward();
  const std::int64_t outputs = bytes_of(op(inputs));
  const Trace trace = tracer.finish();
  return trace.measured().peak_bytes - trace.measured().begin_bytes - outputs;
}

struct KernelCase {
  std::string name;
  MakeInputs make;
  RunOp op;
};

void PrintTo(const KernelCase& c, std::ostream* os) { *os << c.name; }

class CpuKernel : public ::testing::TestWithParam<KernelCase> {};

TEST_P(CpuKernel, ScratchMatchesTheRealKernel) {
  const KernelCase& c = GetParam();
  const testing::NativeCpuKernels native;  // the kernels metamem models, on both sides
  const std::int64_t real = real_scratch(c.make, c.op);
  RecordProperty("real_scratch", std::to_string(real));
  EXPECT_EQ(traced_scratch(c.make, c.op), real);
}

KernelCase conv(std::string name, std::vector<std::int64_t> input, std::vector<std::int64_t> weight,
                std::int64_t stride, std::int64_t padding, std::int64_t groups,
                c10::optional<std::array<bool, 3>> backward = c10::nullopt) {
  auto make = [=] {
    Tensors t{torch::randn(input), torch::randn(weight)};
    const at::Tensor out = at::convolution(t[0], t[1], {}, {stride, stride}, {padding, padding},
                                           {1, 1}, false, {0, 0}, groups);
    t.push_back(torch::randn(out.sizes()));
    return t;
  };
  auto op = [=](Tensors& t) -> Tensors {
    if (!backward)
      return {at::convolution(t[0], t[1], {}, {stride, stride}, {padding, padding}, {1, 1}, false,
                              {0, 0}, groups)};
    auto [gi, gw, gb] = at::convolution_backward(t[2], t[0], t[1], c10::nullopt, {stride, stride},
                                                 {padding, padding}, {1, 1}, false, {0, 0}, groups,
                                                 *backward);
    return {gi, gw, gb};
  };
  return {std::move(name), make, op};
}

constexpr std::array<bool, 3> kBoth{true, true, false}, kInput{true, false, false},
    kWeight{false, true, false};

INSTANTIATE_TEST_SUITE_P(
    Convolution, CpuKernel,
    ::testing::Values(conv("dense3x3", {2, 16, 16, 16}, {32, 16, 3, 3}, 1, 1, 1),
                      conv("dense3x3_backward", {2, 16, 16, 16}, {32, 16, 3, 3}, 1, 1, 1, kBoth),
                      conv("dense1x1", {2, 16, 16, 16}, {32, 16, 1, 1}, 1, 0, 1),
                      conv("dense1x1_stride2_backward", {2, 16, 16, 16}, {32, 16, 1, 1}, 2, 0, 1, kBoth),
                      conv("dense7x7_stride2", {2, 3, 32, 32}, {64, 3, 7, 7}, 2, 3, 1),
                      conv("depthwise", {2, 32, 16, 16}, {32, 1, 3, 3}, 1, 1, 32),
                      conv("depthwise_backward", {2, 32, 16, 16}, {32, 1, 3, 3}, 1, 1, 32, kBoth),
                      conv("depthwise_stride2", {2, 32, 16, 16}, {32, 1, 3, 3}, 2, 1, 32),
                      conv("depthwise_stride2_grad_input", {2, 32, 16, 16}, {32, 1, 3, 3}, 2, 1, 32, kInput),
                      conv("depthwise_stride2_grad_weight", {2, 32, 16, 16}, {32, 1, 3, 3}, 2, 1, 32, kWeight),
                      conv("depthwise_batch1_backward", {1, 32, 16, 16}, {32, 1, 3, 3}, 1, 1, 32, kBoth),
                      conv("groups4_3x3", {2, 32, 16, 16}, {64, 8, 3, 3}, 1, 1, 4),
                      conv("groups4_3x3_backward", {2, 32, 16, 16}, {64, 8, 3, 3}, 1, 1, 4, kBoth),
                      conv("groups4_1x1", {2, 32, 16, 16}, {64, 8, 1, 1}, 1, 0, 4),
                      conv("groups4_1x1_backward", {2, 32, 16, 16}, {64, 8, 1, 1}, 1, 0, 4, kBoth)),
    [](const auto& info) { return info.param.name; });

INSTANTIATE_TEST_SUITE_P(
    Norms, CpuKernel,
    ::testing::Values(
        KernelCase{"batch_norm",
                   [] { return Tensors{torch::randn({4, 16, 8, 8}), torch::randn({16}), torch::randn({16}),
                                       torch::zeros({16}), torch::ones({16})}; },
                   [](Tensors& t) {
                     auto [y, mean, invstd] = at::native_batch_norm(t[0], t[1], t[2], t[3], t[4], true, 0.1, 1e-5);
                     return Tensors{y, mean, invstd};
                   }},
        KernelCase{"batch_norm_backward",
                   [] {
                     Tensors t{torch::randn({4, 16, 8, 8}), torch::randn({16}), torch::randn({16}),
                               torch::zeros({16}), torch::ones({16})};
                     auto [y, mean, invstd] = at::native_batch_norm(t[0], t[1], t[2], t[3], t[4], true, 0.1, 1e-5);
                     t.insert(t.end(), {torch::randn(y.sizes()), mean, invstd});
                     return t;
                   },
                   [](Tensors& t) {
                     auto [gi, gw, gb] = at::native_batch_norm_backward(t[5], t[0], t[1], t[3], t[4], t[6], t[7],
                                                                        true, 1e-5, {true, true, true});
                     return Tensors{gi, gw, gb};
                   }},
        KernelCase{"layer_norm_backward",
                   [] {
                     Tensors t{torch::randn({4, 16, 64}), torch::randn({64}), torch::randn({64})};
                     auto [y, mean, rstd] = at::native_layer_norm(t[0], {64}, t[1], t[2], 1e-5);
                     t.insert(t.end(), {torch::randn(y.sizes()), mean, rstd});
                     return t;
                   },
                   [](Tensors& t) {
                     auto [gi, gw, gb] = at::native_layer_norm_backward(t[3], t[0], {64}, t[4], t[5], t[1], t[2],
                                                                        {true, true, true});
                     return Tensors{gi, gw, gb};
                   }},
        KernelCase{"layer_norm",
                   [] { return Tensors{torch::randn({4, 16, 64}), torch::randn({64}), torch::randn({64})}; },
                   [](Tensors& t) {
                     auto [y, mean, rstd] = at::native_layer_norm(t[0], {64}, t[1], t[2], 1e-5);
                     return Tensors{y, mean, rstd};
                   }}),
    [](const auto& info) { return info.param.name; });

KernelCase roll(std::string name, std::vector<std::int64_t> shifts, std::vector<std::int64_t> dims,
                bool transposed = false) {
  return {std::move(name), [] { return Tensors{torch::randn({2, 14, 14, 32})}; },
          [=](Tensors& t) { return Tensors{torch::roll(transposed ? t[0].transpose(1, 3) : t[0], shifts, dims)}; }};
}

// Swin's shifted windows: one concatenation per rolled dimension, the
// intermediate alive while the next is made.
INSTANTIATE_TEST_SUITE_P(Roll, CpuKernel,
                         ::testing::Values(roll("one_dim", {3}, {1}), roll("two_dims", {-3, -3}, {1, 2}),
                                           roll("flattened", {5}, {}), roll("transposed", {2, 2}, {1, 2}, true)),
                         [](const auto& info) { return info.param.name; });

KernelCase scalar_op(std::string name, c10::ScalarType dtype, RunOp op) {
  return {std::move(name), [dtype] { return Tensors{torch::ones({64}, torch::dtype(dtype))}; }, op};
}

// A Scalar operand is wrapped in a 0-dim tensor and cast to the tensor's dtype.
INSTANTIATE_TEST_SUITE_P(
    ScalarArithmetic, CpuKernel,
    ::testing::Values(
        scalar_op("mul_float", c10::kFloat, [](Tensors& t) { return Tensors{t[0].mul(2.5)}; }),
        scalar_op("div_inplace_float", c10::kFloat, [](Tensors& t) { t[0].div_(2.5); return Tensors{}; }),
        scalar_op("add_inplace_int_into_double", c10::kDouble, [](Tensors& t) { t[0].add_(2); return Tensors{}; }),
        scalar_op("sub_bfloat16", c10::kBFloat16, [](Tensors& t) { return Tensors{t[0].sub(0.5)}; }),
        scalar_op("mul_inplace_long", c10::kLong, [](Tensors& t) { t[0].mul_(3); return Tensors{}; })),
    [](const auto& info) { return info.param.name; });

KernelCase matmul(std::string name, std::function<Tensors()> make, RunOp op) {
  return {std::move(name), std::move(make), std::move(op)};
}

// BLAS reads a matrix with one contiguous dimension; others are copied.
INSTANTIATE_TEST_SUITE_P(
    Blas, CpuKernel,
    ::testing::Values(
        matmul("mm_contiguous", [] { return Tensors{torch::randn({64, 32}), torch::randn({32, 48})}; },
               [](Tensors& t) { return Tensors{torch::mm(t[0], t[1])}; }),
        matmul("mm_transposed", [] { return Tensors{torch::randn({32, 64}), torch::randn({48, 32})}; },
               [](Tensors& t) { return Tensors{torch::mm(t[0].t(), t[1].t())}; }),
        matmul("mm_expanded", [] { return Tensors{torch::ones({1, 1}), torch::randn({32, 48})}; },
               [](Tensors& t) { return Tensors{torch::mm(t[0].expand({64, 32}), t[1])}; }),
        matmul("mm_strided_columns", [] { return Tensors{torch::randn({64, 64}), torch::randn({32, 48})}; },
               [](Tensors& t) {
                 return Tensors{torch::mm(t[0].slice(1, 0, 64, 2), t[1])};
               }),
        matmul("addmm_expanded", [] {
                 return Tensors{torch::randn({48}), torch::ones({1, 1}), torch::randn({32, 48})};
               },
               [](Tensors& t) { return Tensors{torch::addmm(t[0], t[1].expand({64, 32}), t[2])}; }),
        matmul("bmm_transposed", [] { return Tensors{torch::randn({4, 16, 32}), torch::randn({4, 24, 16})}; },
               [](Tensors& t) { return Tensors{torch::bmm(t[0].transpose(1, 2), t[1].transpose(1, 2))}; }),
        matmul("bmm_permuted_heads", [] { return Tensors{torch::randn({2, 16, 4, 8}), torch::randn({2, 4, 8, 16})}; },
               [](Tensors& t) {
                 // Attention's q @ k^T with heads split out of the last dimension.
                 at::Tensor q = t[0].permute({0, 2, 1, 3}).reshape({8, 16, 8});
                 return Tensors{torch::bmm(q, t[1].reshape({8, 8, 16}))};
               }),
        matmul("bmm_expanded", [] { return Tensors{torch::ones({1, 1, 1}), torch::randn({4, 32, 24})}; },
               [](Tensors& t) { return Tensors{torch::bmm(t[0].expand({4, 16, 32}), t[1])}; }),
        matmul("bmm_small_loop", [] { return Tensors{torch::ones({1, 1, 1}), torch::randn({4, 4, 4})}; },
               [](Tensors& t) { return Tensors{torch::bmm(t[0].expand({4, 4, 4}), t[1])}; }),
        matmul("baddbmm_expanded", [] {
                 return Tensors{torch::randn({4, 16, 24}), torch::ones({1, 1, 1}), torch::randn({4, 32, 24})};
               },
               [](Tensors& t) { return Tensors{torch::baddbmm(t[0], t[1].expand({4, 16, 32}), t[2])}; })),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace metamem
