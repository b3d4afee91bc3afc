// What CUDA's index_put_ holds beside self where it sorts its indices: with
// accumulate (the gradient of x[ids], Swin's relative position table), or
// under deterministic algorithms. torch 2.14.1's _index_put_impl_ and
// index_put_with_sort_kernel (Indexing.cu): each index range-checked and
// wrapped, the linear index, the sorted indices with their positions, and
// cub's temporary storage for the sort. Every buffer is sized by the number
// of indices and self's shape: nothing is read back. Checked allocation by
// allocation against real torch on the fake GPU, on the H100, the A100 and
// the T4 (test_cuda_kernels.py).
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/ExpandUtils.h>
#include <ATen/native/IndexingUtils.h>

#include <algorithm>
#include <optional>
#include <tuple>
#include <vector>

#include "meta/CudaKernelPlans.h"
#include "meta/CudaReduction.h"
#include "meta/MetaMode.h"

namespace metamem {
namespace {

constexpr std::int64_t kIndexBytes = 8;  // int64 indices

// wrapIndexOnce(index, ...) * stride, moved to the device: unless
// `unsafe`, the index's minimum and maximum (aminmax of it made contiguous,
// a reduction with a (min, max) pair per block) and a bool for each bound
// it checks, then the index wrapped (remainder) and scaled by the stride.
// The scaled index is the returned piece; the rest is freed. An index on
// the host is all that on the host, then copied.
std::size_t make_linear_part(ScratchPlan& plan, const at::Tensor& index, bool on_host, bool unsafe) {
  const std::int64_t bytes = index.numel() * kIndexBytes;
  if (on_host) return plan.make(bytes);
  if (!unsafe && index.numel() != 0) {
    const std::size_t min = plan.make(kIndexBytes), max = plan.make(kIndexBytes);
    add_aminmax_of_all(plan, index);
    plan.free(plan.make(1));  // max < size
    plan.free(plan.make(1));  // min >= -size
    plan.free(min);
    plan.free(max);
  }
  const std::size_t wrapped = plan.make(bytes), scaled = plan.make(bytes);
  plan.free(wrapped);
  return scaled;
}

// aten::_index_put_impl_(self, indices, values, accumulate, unsafe; unsafe
// from autograd's gradient of x[ids], which skips the range check), and
// the ops that run it whole on a fake device: index_put_ and index_put
// (self, indices, values, accumulate; the functional one on a clone of
// self made first, as its output), _unsafe_index_put (which calls
// index_put, so checks the range all the same).
template <bool kFunctional, bool kHasUnsafe>
ScratchPlan index_put_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& self = arguments[0].toTensor();
  const c10::List<std::optional<at::Tensor>> given = arguments[1].toOptionalTensorList();
  const at::Tensor& values = arguments[2].toTensor();
  const bool accumulate = arguments[3].toBool();
  const bool unsafe = kHasUnsafe && arguments[4].toBool();
  ScratchPlan plan;
  // Without sorting, a TensorIterator writes in place (nothing held); a
  // boolean mask becomes indices by its count of trues, a value.
  if (!accumulate && !(at::globalContext().deterministicAlgorithms() && values.numel() > 1)) return plan;
  if (self.dim() == 0 || given.size() > static_cast<std::size_t>(self.dim())) return plan;
  for (const std::optional<at::Tensor>& index : given)
    if (index && index->defined() && (index->scalar_type() == at::kBool || index->scalar_type() == at::kByte))
      return plan;

  OutsideMetaMode outside;
  // index_put's clone keeps self's strides where they are dense.
  const bool self_contiguous = (kFunctional && !self.is_non_overlapping_and_dense()) || self.is_contiguous();
  const std::int64_t self_bytes = self.numel() * static_cast<std::int64_t>(self.element_size());
  plan.make(self_contiguous ? 0 : self_bytes);  // self made contiguous, copied back at the end

  // makeLinearIndex: int32 indices made int64 (held until the linear
  // index is made), all broadcast together; indexed dimensions that are
  // not adjacent transposed to the front with self.
  std::vector<at::Tensor> indices;
  std::vector<std::size_t> widened;
  std::vector<bool> on_host;  // by defined index, in order (which transposing keeps)
  for (const std::optional<at::Tensor>& index : given) {
    if (!index || !index->defined()) {
      indices.emplace_back();
      continue;
    }
    on_host.push_back(index->is_cpu());
    if (index->scalar_type() == at::kInt && !index->is_cpu())
      widened.push_back(plan.make(index->numel() * kIndexBytes));
    indices.push_back(meta_twin(*index).to(at::kLong));
  }
  indices = at::expand_outplace(indices);
  while (indices.size() < static_cast<std::size_t>(self.dim())) indices.emplace_back();
  at::Tensor src = at::empty(self.sizes(), self.options().device(c10::kMeta));
  if (!at::native::hasContiguousSubspace(indices))
    std::tie(src, indices, std::ignore) = at::native::transposeToFrontAndInvPerm(src, indices);

  // computeLinearIndex: each index scaled by src's contiguous stride and
  // summed into the first.
  std::optional<std::size_t> linear;
  at::IntArrayRef index_sizes;
  std::int64_t slice = 1;  // the elements after the indexed dimensions
  std::size_t defined = 0;
  for (std::int64_t d = 0; d < src.dim(); ++d) {
    if (!indices[d].defined()) {
      if (linear) slice *= src.size(d);
      continue;
    }
    const std::size_t part = make_linear_part(plan, indices[d], on_host[defined++], unsafe);
    if (linear) {
      plan.free(part);
    } else {
      linear = part;
      index_sizes = indices[d].sizes();
    }
  }
  for (const std::size_t piece : widened) plan.free(piece);
  if (!linear) return plan;

  // The values broadcast to what the indices select, made contiguous.
  const std::int64_t num_indices = c10::multiply_integers(index_sizes);
  std::int64_t dims_before = 0;
  while (!indices[dims_before].defined()) ++dims_before;
  std::vector<std::int64_t> values_shape(src.sizes().begin(), src.sizes().end());
  const auto indexed = values_shape.begin() + dims_before;
  values_shape.insert(values_shape.erase(indexed, indexed + static_cast<std::int64_t>(defined)), index_sizes.begin(),
                      index_sizes.end());
  const at::Tensor expanded = meta_twin(values).expand(values_shape);
  plan.make(expanded.is_contiguous() ? 0 : expanded.numel() * static_cast<std::int64_t>(values.element_size()));
  if (num_indices == 0 || slice == 0) return plan;

  // Sorted by their rows (the linear index divided by the slice), on the
  // bits the largest row takes, with their positions.
  plan.make(src.is_contiguous() ? 0 : self_bytes);
  plan.make(num_indices * kIndexBytes);  // sorted indices
  plan.make(num_indices * kIndexBytes);  // their positions
  plan.make(num_indices * kIndexBytes);  // the positions in order, an arange, sorted with them
  plan.free(plan.make(deterministic_resize_fill(at::empty({num_indices}, at::dtype(at::kLong).device(c10::kMeta)))));
  make_cub_radix_sort_storage(plan, num_indices, kIndexBytes, kIndexBytes,
                              cub_num_bits(std::max<std::int64_t>(self.numel() - 1, 0) / slice));
  return plan;
}

// aten::scatter_reduce.two (self, dim, index, src, reduce, include_self),
// its in-place and out= forms: a "mean" counts what each element of the
// result took (scatter_reduce_two's epilogue): ones like src, the counts
// like the result, and count == 0, a bool, before the division.
ScratchPlan scatter_mean_plan(c10::ArrayRef<c10::IValue> arguments) {
  ScratchPlan plan;
  if (arguments[4].toStringRef() != "mean") return plan;
  const at::Tensor &self = arguments[0].toTensor(), &src = arguments[3].toTensor();
  plan.make(src.numel() * static_cast<std::int64_t>(src.element_size()));
  plan.make(self.numel() * static_cast<std::int64_t>(self.element_size()));
  plan.free(plan.make(self.numel()));
  return plan;
}

}  // namespace

ScratchPlanModel cuda_indexing_plan_model(const std::string& qualified_name) {
  if (qualified_name == "aten::_index_put_impl_") return &index_put_plan<false, true>;
  if (qualified_name == "aten::index_put_") return &index_put_plan<false, false>;
  if (qualified_name == "aten::index_put" || qualified_name == "aten::_unsafe_index_put")
    return &index_put_plan<true, false>;
  for (const char* scatter : {"aten::scatter_reduce.two", "aten::scatter_reduce_.two", "aten::scatter_reduce.two_out"})
    if (qualified_name == scatter) return &scatter_mean_plan;
  return nullptr;
}

}  // namespace metamem
