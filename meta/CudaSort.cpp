// What CUDA's sort holds beside its outputs, in its order, and the kernels
// that sort through it or through cub (topk, a whole tensor's median,
// randperm, multinomial): libtorch's own buffers (torch 2.14.1's Sort.cpp,
// SortStable.cu, TensorTopK.cu, Sorting.cpp, Randperm.cu, Sampling's
// multinomial_out and MultinomialKernel.cu) and the
// temporary storage cub asks for, computed as cub 3.0 (the CUDA 13.0
// wheel's, the toolkit's headers here) computes it from its tuning for the
// GPU's architecture. Checked allocation by allocation against real torch
// on the fake GPU, on the H100, the A100 and the T4 (test_cuda_kernels.py).
#include <ATen/ATen.h>
#include <ATen/ceil_div.h>
#include <c10/core/WrapDimMinimal.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "meta/CudaAttention.h"
#include "meta/CudaKernelPlans.h"
#include "meta/CudaReduction.h"
#include "meta/MetaMode.h"

namespace metamem {
namespace {

constexpr std::int64_t kIndexBytes = 8;  // the indices' int64, and the int2 (index, slice) pairs

// The temporary storage cub 3.0's DeviceRadixSort asks for (see
// make_cub_radix_sort_storage). nullopt for keys under 4 bytes with values
// other than libtorch's 8-byte indices, for 1-byte keys before sm90, and
// before sm70.
std::optional<std::int64_t> cub_radix_sort_bytes(std::int64_t n, std::int64_t key_bytes, std::int64_t value_bytes,
                                                 int bits) {
  constexpr std::int64_t kDigits = 256, kOffsetBytes = 8, kAtomicBytes = 4, kSharedMemory = 48 * 1024;
  // cub's RegBoundScaling: items per thread scaled down for 8-byte keys or
  // values, threads to what fits in a block's shared memory.
  const std::int64_t dominant = std::max({key_bytes, value_bytes, std::int64_t{1}});
  const auto tile = [&](std::int64_t threads, std::int64_t items) {
    items = std::max<std::int64_t>(1, items * 4 / std::max<std::int64_t>(4, dominant));
    return std::min(threads, at::round_up(kSharedMemory / (dominant * items), std::int64_t{32})) * items;
  };
  if (n <= tile(256, 19)) return 1;  // one block sorts all: cub asks for a byte
  if (key_bytes < 4 && value_bytes != 8) return std::nullopt;  // small keys: with libtorch's indices alone
  const int arch = traced_sm();
  const bool keys_only = value_bytes == 0;
  std::int64_t threads = 384, items = 0;
  if (arch >= 900 && key_bytes < 4) {
    // sm90_small_key_tuning for 8-byte values and offsets: torch's 1- and
    // 2-byte keys with their indices.
    threads = key_bytes == 1 ? 384 : 512, items = key_bytes == 1 ? 18 : 23;
  } else if (arch < 700) {
    return std::nullopt;
  } else if (key_bytes < 4) {
    // Before sm90 such keys take cub's older passes (upsweep, scan,
    // downsweep), whose storage is a spine of each block's digit counts
    // (7 radix bits: 128) for five times as many blocks as the SMs run of
    // the downsweep kernels at once, with a scan tile (512 threads of 11
    // offsets), then third buffers of keys and values. For 2-byte keys
    // with 8-byte values both downsweep kernels run one block an SM on
    // sm75, sm80 and sm86 (sm89 runs sm86's): 512 threads of 98 to 104
    // registers, and 256 of 170 to 254 (the wheel's cubins, cuobjdump
    // -res-usage). 1-byte keys' second kernel runs 2 or 3, which the fake
    // GPU, answering 1 for any kernel, cannot check.
    if (key_bytes != 2) return std::nullopt;
    const std::int64_t spine = traced_gpu().multi_processor_count * 5 * 128 + 512 * 11;
    return cub_alias_temporaries({spine * kOffsetBytes, n * key_bytes, n * value_bytes});
  } else if (arch >= 900) {
    // 4-byte keys alone as integers (cub gives f32 keys one item fewer;
    // libtorch sorts none alone).
    items = key_bytes == 8 ? (value_bytes < 8 ? 30 : 24) : keys_only ? 19 : (value_bytes < 8 ? 17 : 29);
  } else if (arch >= 800) {
    items = key_bytes == 4 && !keys_only ? 17 : 21;
  } else {
    threads = 256, items = key_bytes == 4 && value_bytes == 4 ? 46 : 23;
  }
  const std::int64_t tile_items = tile(threads, items);
  const std::int64_t portion = ((std::int64_t{1} << 28) - 1) / tile_items * tile_items;
  const std::int64_t portions = at::ceil_div(n, portion), blocks = at::ceil_div(std::min(n, portion), tile_items);
  const std::int64_t passes = at::ceil_div(bits, 8);
  const bool alternates = passes > 1;
  return cub_alias_temporaries({portions * passes * kDigits * kOffsetBytes, blocks * kDigits * kAtomicBytes,
                                alternates ? n * key_bytes : 0, alternates ? n * value_bytes : 0,
                                portions * passes * kAtomicBytes});
}

}  // namespace

std::int64_t cub_alias_temporaries(std::initializer_list<std::int64_t> pieces) {
  constexpr std::int64_t kAlign = 256;
  std::int64_t bytes = kAlign - 1;
  for (const std::int64_t piece : pieces) bytes += at::round_up(piece, kAlign);
  return bytes;
}

void make_cub_radix_sort_storage(ScratchPlan& plan, std::int64_t n, std::int64_t key_bytes, std::int64_t value_bytes,
                                 int bits) {
  if (const auto bytes = cub_radix_sort_bytes(n, key_bytes, value_bytes, bits)) plan.free(plan.make(*bytes));
}

int traced_sm() {
  const GpuTraits gpu = traced_gpu();
  return gpu.major * 100 + gpu.minor * 10;
}

CubTuning cub_tuning() {
  const int sm = traced_sm();
  return sm >= 900 ? CubTuning::Sm90 : sm >= 800 && sm < 860 ? CubTuning::Sm80 : CubTuning::Default;
}

// DeviceSelect's tiles (unique's without flags; unique_by_key's with the
// positions libtorch counts as values of the keys' type) by cub_tuning.
std::int64_t cub_select_tile(std::int64_t key_bytes, bool by_key) {
  const bool wide = key_bytes == 8;
  switch (cub_tuning()) {
    case CubTuning::Sm90:
      return by_key ? (wide ? 448 * 11 : 512 * 14) : (wide ? 384 * 11 : 384 * 17);
    case CubTuning::Sm80:
      return by_key ? (wide ? 192 * 7 : 256 * 11) : (wide ? 192 * 10 : 256 * 18);
    case CubTuning::Default:
      break;
  }
  return by_key ? 64 * std::clamp<std::int64_t>(44 / key_bytes, 1, 11)
                : 128 * std::clamp<std::int64_t>(40 / key_bytes, 1, 10);
}

// One tile state a tile and 32 of padding, aliased twice (the tile state's
// own blob inside the select's). Unique counts within int32 partitions (a
// 4-byte status and count in one 8-byte word); unique_by_key in the 64-bit
// offsets its int64 item count becomes (16 bytes). libtorch's INT_MAX
// limit leaves out the streaming of larger inputs.
std::int64_t cub_select_bytes(std::int64_t n, std::int64_t key_bytes, bool by_key) {
  constexpr std::int64_t kPadding = 32;
  const std::int64_t state_bytes = by_key ? 16 : 8;
  const std::int64_t states = at::ceil_div(n, cub_select_tile(key_bytes, by_key)) + kPadding;
  return cub_alias_temporaries({cub_alias_temporaries({states * state_bytes})});
}

void make_cub_unique_storage(ScratchPlan& plan, std::int64_t n, std::int64_t key_bytes, bool by_key) {
  plan.free(plan.make(cub_select_bytes(n, key_bytes, by_key)));
}

int cub_num_bits(std::int64_t max_key) {
  int bits = 1;
  for (; max_key > 1; max_key >>= 1) ++bits;
  return bits;
}

namespace {

// The slices' strides with `dim` innermost and the others in the order of
// self's strides (torch's infer_dense_strides_dim_last).
std::vector<std::int64_t> dense_strides_dim_last(const at::Tensor& self, std::int64_t dim) {
  const std::int64_t rank = self.dim();
  std::vector<std::int64_t> order(rank);
  for (std::int64_t d = 0; d < rank; ++d) order[d] = d;
  const auto key = [&](std::int64_t d) { return d == dim ? -1 : self.stride(d); };
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return key(a) > key(b); });
  std::vector<std::int64_t> strides(rank);
  std::int64_t step = 1;
  for (std::int64_t i = rank - 1; i >= 0; --i) {
    strides[order[i]] = step;
    step *= self.size(order[i]);
  }
  return strides;
}

// aten::sort(self, dim, descending) and aten::sort.stable(self, stable,
// dim, descending); CUDA's sort is stable either way. Slices of up to 4,096
// sort in place beside an arange of one slice's indices. Longer ones go to
// cub, in batches of up to INT_MAX elements, from a copy of the input with
// the slice innermost where it is not so (and copies of the outputs where
// their strides differ from the copy's):
// - one slice, or slices of a million or more: each by DeviceRadixSort,
//   from one slice's indices;
// - under 128 slices: all at once, the (index, slice) pairs as values,
//   then the pairs by slice (a sort of int64 keys on the slice's bits);
// - from 128: DeviceSegmentedRadixSort, from every slice's indices.
void plan_sort(ScratchPlan& plan, const at::Tensor& self, std::int64_t dim) {
  if (self.dim() == 0 || self.numel() == 0) return;
  dim = c10::maybe_wrap_dim(dim, self.dim());
  const std::int64_t nsort = self.size(dim), numel = self.numel();
  const std::int64_t key_bytes = static_cast<std::int64_t>(self.element_size());
  if (nsort <= 4096) {
    plan.free(plan.make(nsort * kIndexBytes));
    return;
  }
  const bool in_place = self.is_non_overlapping_and_dense() && self.stride(dim) == 1;
  const std::vector<std::int64_t> sorted_strides = in_place ? self.strides().vec() : dense_strides_dim_last(self, dim);
  const std::vector<std::int64_t> output_strides = self.is_non_overlapping_and_dense()
                                                       ? self.strides().vec()
                                                       : at::infer_dense_strides(self.sizes(), self.strides());
  if (!in_place) plan.make(numel * key_bytes);
  if (output_strides != sorted_strides) {
    plan.make(numel * key_bytes);
    plan.make(numel * kIndexBytes);
  }
  const int key_bits = static_cast<int>(key_bytes * 8);
  const std::int64_t batch = std::min<std::int64_t>(numel, std::numeric_limits<int>::max()) / nsort * nsort;
  for (std::int64_t remaining = numel; remaining > 0; remaining -= std::min(remaining, batch)) {
    const std::int64_t n = std::min(remaining, batch), slices = n / nsort;
    if (slices == 1 || nsort >= 1000000) {
      const std::size_t indices = plan.make(nsort * kIndexBytes);
      for (std::int64_t s = 0; s < slices; ++s)
        make_cub_radix_sort_storage(plan, nsort, key_bytes, kIndexBytes, key_bits);
      plan.free(indices);
    } else if (slices < 128) {
      const int slice_bits = std::max(1, static_cast<int>(std::ceil(std::log2(static_cast<double>(slices)))));
      const std::size_t pairs = plan.make(n * kIndexBytes), sorted_pairs = plan.make(n * kIndexBytes);
      const std::size_t keys_out = plan.make(n * key_bytes);
      make_cub_radix_sort_storage(plan, n, key_bytes, kIndexBytes, key_bits);
      plan.free(keys_out);
      make_cub_radix_sort_storage(plan, n, kIndexBytes, 0, slice_bits);
      plan.free(sorted_pairs);
      plan.free(pairs);
    } else {
      const std::size_t indices = plan.make(n * kIndexBytes);
      plan.free(plan.make(cub_alias_temporaries({n * key_bytes, n * kIndexBytes})));
      plan.free(indices);
    }
  }
}

// A sort inside another kernel (topk's, median's), which frees the
// copies the sort holds until it returns before the kernel goes on.
void plan_inner_sort(ScratchPlan& plan, const at::Tensor& self, std::int64_t dim) {
  const std::size_t first = plan.pieces;
  plan_sort(plan, self, dim);
  for (std::size_t piece = plan.pieces; piece-- > first;) plan.free(piece);
}

template <std::size_t dim_argument>
ScratchPlan sort_op_plan(c10::ArrayRef<c10::IValue> arguments) {
  ScratchPlan plan;
  plan_sort(plan, arguments[0].toTensor(), arguments[dim_argument].toInt());
  return plan;
}

// Whether topk selects across blocks (mbtopk) rather than a block a slice:
// torch's heuristic, by the number of slices and their size.
bool selects_across_blocks(std::int64_t slices, std::int64_t slice) {
  return (slices <= 20 && slice >= 20000) || (slices > 20 && slices <= 40 && slice >= 10000) ||
         (slices > 40 && slices <= 80 && slice >= 8000) || (slices > 80 && slices < 200 && slice >= 5000) ||
         (slices >= 200 && slices < 800 && slice >= 3000) || (slices >= 800 && slices <= 4000 && slice >= 800) ||
         (slices > 4000 && slice >= 400);
}

// aten::topk(self, k, dim, largest, sorted) after its outputs: the input
// made contiguous, then over large slices mbtopk's radix selection, each
// pass counting digits per block (blocks of 256 threads, as many items a
// thread as spread the input over six blocks per SM, 4 to 64), the blocks'
// counts scanned by slice through cub (InclusiveSumByKey). Sorted results
// of more than 4,096 per slice are sorted again into copies, and the
// indices gathered through them.
void plan_topk(ScratchPlan& plan, const at::Tensor& self, std::int64_t k, std::int64_t dim, bool sorted) {
  if (k == 0 || self.numel() == 0) return;
  dim = c10::maybe_wrap_dim(dim, std::max<std::int64_t>(self.dim(), 1));
  const std::int64_t slice = self.dim() == 0 ? 1 : self.size(dim), slices = self.numel() / slice;
  const std::int64_t value_bytes = static_cast<std::int64_t>(self.element_size());
  const std::size_t input = plan.make(copy_unless_contiguous(self));
  if (selects_across_blocks(slices, slice)) {
    constexpr std::int64_t kThreads = 256, kDigits = 256, kBlocksPerSm = 6, kCountBytes = 2, kWordBytes = 4;
    const std::int64_t radix_bytes = value_bytes <= 4 ? 4 : 8;
    const std::int64_t spread = traced_gpu().multi_processor_count * kBlocksPerSm * kThreads;
    const std::int64_t items = std::clamp<std::int64_t>(at::ceil_div(self.numel(), spread), 4, 64);
    const std::int64_t blocks = slices * at::ceil_div(slice, items * kThreads);
    std::vector<std::size_t> pieces = {plan.make(slices * value_bytes),
                                       plan.make(2 * slices * kWordBytes),
                                       plan.make(2 * slices * radix_bytes),
                                       plan.make(blocks * kDigits * kCountBytes),
                                       plan.make(slices * kDigits * kWordBytes),
                                       plan.make(blocks * kWordBytes),
                                       plan.make(blocks * kWordBytes)};
    // The counts within k and of the k-th value, each summed by slice.
    for (int scan = 0; scan < 2; ++scan) make_cub_scan_by_key_storage(plan, blocks, kWordBytes);
    for (auto piece = pieces.rbegin(); piece != pieces.rend(); ++piece) plan.free(*piece);
  }
  plan.free(input);
  if (!sorted || k * slices <= 1 || k <= 4096) return;
  std::vector<std::int64_t> sizes = self.sizes().vec();
  if (!sizes.empty()) sizes[dim] = k;
  at::Tensor values;
  {
    OutsideMetaMode outside;
    values = at::empty(sizes, self.options().device(c10::kMeta));
  }
  plan.make(values.numel() * kIndexBytes);
  plan.make(values.numel() * value_bytes);
  plan_inner_sort(plan, values, dim);
  plan.free(plan.make(values.numel() * kIndexBytes));  // indices.gather(dim, sortedIndices)
}

// aten::topk(self, k, dim, largest, sorted).
ScratchPlan topk_plan(c10::ArrayRef<c10::IValue> arguments) {
  ScratchPlan plan;
  plan_topk(plan, arguments[0].toTensor(), arguments[1].toInt(), arguments[2].toInt(), arguments[4].toBool());
  return plan;
}

// aten::median(self) and aten::nanmedian(self) of a whole tensor, as
// median_impl runs them: self.flatten() (a copy where self is not
// contiguous) sorted, the sort's indices dropped; then median answers
// where(sorted[-1].isnan(), sorted[-1], sorted[k]) (a 0-dim bool before
// the result), nanmedian indexes sorted at (size - 1 - count of NaNs) / 2,
// counted through isnan, a sum of bools (its int64 copy and staging),
// rsub, a true division and a cast to int64.
template <bool ignore_nan>
ScratchPlan median_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& self = arguments[0].toTensor();
  ScratchPlan plan;
  const std::int64_t n = self.numel();
  if (n == 0) return plan;
  at::Tensor flat, nans, count;
  {
    OutsideMetaMode outside;
    // flatten() keeps a vector as it is, strided or not; sort copies that itself.
    flat = self.dim() == 1 ? meta_twin(self) : at::empty({n}, self.options().device(c10::kMeta));
    nans = at::empty({n}, flat.options().dtype(at::kBool));
    count = at::empty({}, flat.options().dtype(at::kLong));
  }
  const std::size_t flattened = plan.make(self.dim() > 1 ? copy_unless_contiguous(self) : 0);
  const std::size_t sorted = plan.make(n * static_cast<std::int64_t>(self.element_size()));
  const std::size_t indices = plan.make(n * kIndexBytes);
  plan_inner_sort(plan, flat, 0);
  plan.free(indices);
  plan.free(flattened);
  if (!ignore_nan) {
    const std::size_t last_is_nan = plan.make(1);
    plan.output(0);
    plan.free(last_is_nan);
  } else {
    const std::size_t is_nan = plan.make(n), sum = plan.make(kIndexBytes);
    add_staging(plan, cuda_reduction_staging(CudaReduction::Sum, nans, count, std::nullopt, false));
    const std::size_t rsub = plan.make(kIndexBytes);
    const std::size_t half = plan.make(static_cast<std::int64_t>(at::get_default_dtype().itemsize()));
    const std::size_t k = plan.make(kIndexBytes);
    for (const std::size_t piece : {half, rsub, sum, is_nan}) plan.free(piece);
    plan.output(0);
    plan.free(k);
  }
  plan.free(sorted);
  return plan;
}

// aten::randperm(n, dtype, ...), randperm.generator(n, generator, dtype,
// ...) and their out overloads (n, [generator,] out): after checking that
// n - 1 fits the result's dtype (a 0-dim tensor of it), an arange of n
// shuffled by sorting it on random keys through cub, into the result (or a
// contiguous copy of a strided out=); the keys take 32 bits where a
// permutation of n repeats few of them, 64 otherwise.
template <std::size_t dtype_argument>
ScratchPlan randperm_plan(c10::ArrayRef<c10::IValue> arguments) {
  const std::int64_t n = arguments[0].toInt();
  const bool out = arguments.back().isTensor();
  const at::ScalarType dtype = out ? arguments.back().toTensor().scalar_type()
                                   : arguments[dtype_argument].toOptional<at::ScalarType>().value_or(at::kLong);
  const std::int64_t value_bytes = static_cast<std::int64_t>(c10::elementSize(dtype));
  ScratchPlan plan;
  plan.free(plan.make(value_bytes));
  plan.make(n * value_bytes);  // the arange
  if (n == 0) return plan;
  plan.make(out && !arguments.back().toTensor().is_contiguous() ? n * value_bytes : 0);
  const double log_threshold_12 = std::log(0.9) * 12, nd = static_cast<double>(n);
  const int bits = std::min(64, static_cast<int>(std::ceil(std::log2(nd - (6 * nd * nd + 1) / log_threshold_12))));
  const std::int64_t key_bytes = bits <= 32 ? 4 : 8;
  plan.make(n * key_bytes);
  plan.make(n * key_bytes);
  make_cub_radix_sort_storage(plan, n, key_bytes, value_bytes, bits);
  return plan;
}

// aten::multinomial(self, num_samples, replacement, generator) and its
// out= form, as multinomial_out runs them into the result. Without
// replacement, or for one sample, by the Gumbel trick: self's aminmax (two
// 0-dim, self made contiguous, the reduction's staging) checked by two
// comparisons and their &, the sum of each distribution compared with 0
// (and any of them for several), its ~; then noise q like self, divided in
// place, and its argmax (with its staging), or its topk into the result
// (the values made first). With replacement, origDist, normDist and their
// prefix sum (self's size each, contiguous); one distribution's sum is a
// scan of one slice.
ScratchPlan multinomial_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& self = arguments[0].toTensor();
  const std::int64_t samples = arguments[1].toInt();
  ScratchPlan plan;
  if (self.numel() == 0 || samples == 0) return plan;
  const auto element = static_cast<std::int64_t>(self.element_size());
  const std::int64_t self_bytes = self.numel() * element;
  if (arguments[2].toBool() && samples > 1) {
    for (int copy = 0; copy < 3; ++copy) plan.make(self_bytes);
    if (self.dim() == 1) make_cumulative_sum_storage(plan, self.numel(), self.scalar_type());
    return plan;
  }
  OutsideMetaMode outside;
  const at::Tensor meta_self = meta_twin(self);
  plan.make(element);  // aminmax's minimum
  plan.make(element);  // and maximum
  add_aminmax_of_all(plan, self);
  const std::size_t finite = plan.make(1), not_negative = plan.make(1);
  plan.make(1);  // is_valid
  plan.free(finite);
  plan.free(not_negative);
  const at::Tensor sums = self.dim() == 1 ? at::sum(meta_self) : at::sum(meta_self, 1);
  const std::size_t summed = plan.make(static_cast<std::int64_t>(sums.nbytes()));
  add_staging(plan, cuda_reduction_staging(CudaReduction::Sum, meta_self, sums,
                                           self.dim() == 1 ? std::nullopt : at::OptionalIntArrayRef({1}), false));
  if (self.dim() == 1) {
    plan.make(1);  // sum == 0
  } else {
    const std::size_t zero = plan.make(sums.numel());
    plan.make(1);  // any
    plan.free(zero);
  }
  plan.free(summed);
  plan.free(plan.make(1));  // ~zero_prob_condition
  const at::Tensor noise = at::empty_like(meta_self);  // dense strides kept
  const std::size_t q = plan.make(self_bytes);
  if (samples == 1) {
    std::vector<std::int64_t> sizes = self.sizes().vec();
    sizes.back() = 1;
    const std::int64_t last = -1;
    add_staging(plan, cuda_reduction_staging(CudaReduction::IndexedExtremum, noise,
                                             at::empty(sizes, noise.options().dtype(at::kLong)), last, true));
  } else {
    const std::size_t values = plan.make(self.numel() / self.size(-1) * samples * element);
    plan_topk(plan, noise, samples, -1, true);
    plan.free(values);
  }
  plan.free(q);
  return plan;
}

// aten::embedding_renorm_(self, indices, max_norm, norm_type)
// (embedding_renorm_cuda_, torch 2.14.1): a buffer of the ids' size, then
// the ids sorted as one flat slice (at::sort: its values and positions, the
// positions freed as it returns), the distinct ids' buffer and their
// count, and cub's storage to select them; all freed at its end.
ScratchPlan embedding_renorm_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& ids = arguments[1].toTensor();
  const std::int64_t n = ids.numel(), id_bytes = static_cast<std::int64_t>(ids.element_size());
  ScratchPlan plan;
  const std::size_t buffer = plan.make(n * id_bytes);
  const std::size_t sorted = plan.make(n * id_bytes);
  const std::size_t positions = plan.make(n * kIndexBytes);
  at::Tensor flat;
  {
    OutsideMetaMode outside;
    flat = at::empty({n}, ids.options().device(c10::kMeta));
  }
  plan_inner_sort(plan, flat, 0);
  plan.free(positions);
  const std::size_t distinct = plan.make(n * id_bytes);
  const std::size_t count = plan.make(kIndexBytes);
  make_cub_unique_storage(plan, n, id_bytes, /*by_key=*/false);
  for (const std::size_t piece : {count, distinct, sorted, buffer}) plan.free(piece);
  return plan;
}

}  // namespace

ScratchPlanModel cuda_sort_plan_model(const std::string& qualified_name) {
  if (qualified_name == "aten::sort") return &sort_op_plan<1>;
  if (qualified_name == "aten::sort.stable") return &sort_op_plan<2>;
  if (qualified_name == "aten::randperm" || qualified_name == "aten::randperm.out") return &randperm_plan<1>;
  if (qualified_name == "aten::randperm.generator" || qualified_name == "aten::randperm.generator_out")
    return &randperm_plan<2>;
  if (qualified_name == "aten::median") return &median_plan<false>;
  if (qualified_name == "aten::nanmedian") return &median_plan<true>;
  if (qualified_name == "aten::multinomial" || qualified_name == "aten::multinomial.out") return &multinomial_plan;
  if (qualified_name == "aten::embedding_renorm_") return &embedding_renorm_plan;
  return qualified_name == "aten::topk" ? &topk_plan : nullptr;
}

}  // namespace metamem
