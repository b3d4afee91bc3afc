// What CUDA's cumulative sums, products and log-sum-exps hold beside their
// outputs, in their order (torch 2.14.1's ReduceOps.cpp, ScanKernels.cpp and
// ScanUtils.cuh): the input cast to the result's dtype, contiguous copies,
// and, for a scan of one slice, cub's DeviceScan storage (or, under
// deterministic algorithms, libtorch's own per-block sums). Checked
// allocation by allocation against real torch on the fake GPU
// (test_cuda_kernels.py).
#include <ATen/ATen.h>
#include <ATen/ceil_div.h>
#include <c10/core/WrapDimMinimal.h>

#include <algorithm>
#include <optional>

#include "meta/CudaAttention.h"
#include "meta/CudaKernelPlans.h"

namespace metamem {
namespace {

// The temporary storage cub 3.0's DeviceScan::InclusiveScan asks for to scan
// n values of `dtype` with libtorch's operators (std::plus, std::multiplies,
// a lambda): cub tunes none of them, so every architecture takes its
// default policy, 128 threads of 15 four-byte items scaled to the value's
// size (MemBoundScaling). The storage is one tile state per tile and 32 of
// padding: a status word and the value in one transaction word for
// arithmetic types, separate status, partial and inclusive arrays for
// torch's half, bfloat16 and complex types; aliased twice (the tile state's
// own blob inside the scan's).
std::int64_t cub_scan_bytes(std::int64_t n, at::ScalarType dtype) {
  constexpr std::int64_t kSharedMemory = 48 * 1024, kPadding = 32, kStatusBytes = 4;
  const std::int64_t size = static_cast<std::int64_t>(c10::elementSize(dtype));
  const std::int64_t items = std::max<std::int64_t>(1, std::min<std::int64_t>(15 * 4 / size, 30));
  const std::int64_t threads =
      std::min<std::int64_t>(128, at::round_up(kSharedMemory / (size * items), std::int64_t{32}));
  const std::int64_t states = at::ceil_div(n, threads * items) + kPadding;
  const bool word = at::isIntegralType(dtype, /*includeBool=*/true) || dtype == at::kFloat || dtype == at::kDouble;
  const std::int64_t tile_state = word ? cub_alias_temporaries({states * std::max<std::int64_t>(4, 2 * size)})
                                       : cub_alias_temporaries({states * kStatusBytes, states * size, states * size});
  return cub_alias_temporaries({tile_state});
}

// at::cuda::cub::inclusive_scan: cub scans at most 2^30 values a call; each
// further part first makes its first value (the carry from the part before).
void make_cub_scan_storage(ScratchPlan& plan, std::int64_t n, at::ScalarType dtype) {
  constexpr std::int64_t kMaxCubSize = std::int64_t{1} << 30;
  plan.free(plan.make(cub_scan_bytes(std::min(n, kMaxCubSize), dtype)));
  for (std::int64_t done = kMaxCubSize; done < n; done += kMaxCubSize) {
    const std::size_t first = plan.make(static_cast<std::int64_t>(c10::elementSize(dtype)));
    plan.free(plan.make(cub_scan_bytes(std::min(n - done, kMaxCubSize), dtype)));
    plan.free(first);
  }
}

// inclusive_deterministic_scan (a cumsum of floating or complex values
// under deterministic algorithms): one sum per block, at most one block per
// SM, each of 16 items a thread.
std::int64_t deterministic_scan_bytes(std::int64_t n, at::ScalarType dtype) {
  const std::int64_t size = static_cast<std::int64_t>(c10::elementSize(dtype));
  const std::int64_t threads = size >= 16 ? 128 : size >= 8 ? 256 : 512;
  return std::min<std::int64_t>(traced_gpu().multi_processor_count, at::ceil_div(n, threads * 16)) * size;
}

enum class Scan { Sum, Product, LogSumExp };

// The result's dtype and the tensor written in place (out= or self), from
// the op's arguments: (self, dim, dtype, [out]) for cumsum and cumprod,
// (self, dim) for logcumsumexp, which keeps self's dtype.
struct ScanResult {
  at::ScalarType dtype;
  std::optional<at::Tensor> written;
};

ScanResult scan_result(c10::ArrayRef<c10::IValue> arguments, Scan scan, bool in_place) {
  const at::Tensor& self = arguments[0].toTensor();
  if (in_place) return {self.scalar_type(), self};
  if (scan == Scan::LogSumExp) return {self.scalar_type(), std::nullopt};
  const std::optional<at::ScalarType> dtype = arguments[2].toOptional<at::ScalarType>();
  if (arguments.size() > 3 && arguments[3].isTensor()) {
    const at::Tensor& out = arguments[3].toTensor();
    return {dtype.value_or(out.scalar_type()), out};
  }
  const bool integral = at::isIntegralType(self.scalar_type(), /*includeBool=*/true);
  return {dtype.value_or(integral ? at::kLong : self.scalar_type()), std::nullopt};
}

// cumsum and cumprod scan self.to(the result's dtype) (impl_func_cum_ops),
// into a contiguous result (contiguous_out_arg, which copies back to a
// strided one), from a contiguous input (scan_dim's expect_contiguous).
// A scan of one slice goes to cub; of many, to libtorch's own kernels,
// which hold nothing more.
template <Scan scan, bool in_place>
ScratchPlan scan_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& self = arguments[0].toTensor();
  ScratchPlan plan;
  if (self.dim() == 0 || self.numel() == 0) return plan;
  const ScanResult result = scan_result(arguments, scan, in_place);
  const std::int64_t numel = self.numel(), dim = c10::maybe_wrap_dim(arguments[1].toInt(), self.dim());
  const std::int64_t bytes = numel * static_cast<std::int64_t>(c10::elementSize(result.dtype));
  const bool cast = self.scalar_type() != result.dtype;
  // A cast copy keeps self's strides where they are dense (to()'s preserve format).
  const bool input_contiguous = (cast && !self.is_non_overlapping_and_dense()) || self.is_contiguous();
  if (cast) plan.make(bytes);
  if (result.written && !result.written->is_contiguous()) plan.make(bytes);
  if (!input_contiguous) plan.make(bytes);
  if (numel != self.size(dim)) return plan;
  if (scan == Scan::Sum)
    make_cumulative_sum_storage(plan, numel, result.dtype);
  else
    make_cub_scan_storage(plan, numel, result.dtype);
  return plan;
}

}  // namespace

void make_cumulative_sum_storage(ScratchPlan& plan, std::int64_t n, at::ScalarType dtype) {
  const bool floating = at::isFloatingType(dtype) || at::isComplexType(dtype);
  if (floating && at::globalContext().deterministicAlgorithms())
    plan.free(plan.make(deterministic_scan_bytes(n, dtype)));
  else
    make_cub_scan_storage(plan, n, dtype);
}

// cub 3.0's tiles for DeviceScan's by-key scans of keys and values of
// `key_bytes` each with a primitive operator (cuda::std::plus, the
// maximum), by cub_tuning; the default 256 threads of 9 items. (sm100 has
// tiles of its own; no GPU of the table is one.)
std::int64_t cub_scan_by_key_tile(std::int64_t key_bytes) {
  const bool wide = key_bytes == 8;
  switch (cub_tuning()) {
    case CubTuning::Sm90:
      return wide ? 224 * 11 : 288 * 14;
    case CubTuning::Sm80:
      return wide ? 224 * 10 : 256 * 15;
    case CubTuning::Default:
      break;
  }
  return 256 * 9;
}

void make_cub_scan_by_key_storage(ScratchPlan& plan, std::int64_t n, std::int64_t key_bytes) {
  constexpr std::int64_t kPadding = 32, kStateBytes = 16;
  const std::int64_t tiles = at::ceil_div(n, cub_scan_by_key_tile(key_bytes));
  plan.free(plan.make(cub_alias_temporaries({(tiles + kPadding) * kStateBytes, (tiles + 1) * key_bytes})));
}

ScratchPlanModel cuda_scan_plan_model(const std::string& qualified_name) {
  if (qualified_name == "aten::cumsum" || qualified_name == "aten::cumsum.out") return &scan_plan<Scan::Sum, false>;
  if (qualified_name == "aten::cumsum_") return &scan_plan<Scan::Sum, true>;
  if (qualified_name == "aten::cumprod" || qualified_name == "aten::cumprod.out")
    return &scan_plan<Scan::Product, false>;
  if (qualified_name == "aten::cumprod_") return &scan_plan<Scan::Product, true>;
  const bool log_sum_exp = qualified_name == "aten::logcumsumexp" || qualified_name == "aten::_logcumsumexp";
  return log_sum_exp ? &scan_plan<Scan::LogSumExp, false> : nullptr;
}

}  // namespace metamem
