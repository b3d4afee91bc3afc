#include "meta/CudaReduction.h"

#include <ATen/ATen.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/Reduction.h>
#include <ATen/ExpandUtils.h>
#include <ATen/OpMathType.h>
#include <ATen/native/ReduceOpsUtils.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

#include "meta/CudaAttention.h"
#include "meta/CudaKernelPlans.h"
#include "meta/MetaMode.h"

namespace metamem {

at::Tensor meta_twin(const at::Tensor& t) {
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
}

std::int64_t div_up(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

std::int64_t last_pow2(std::int64_t n) {
  std::int64_t p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

namespace {

constexpr int kWarpSize = 32;

// What a reduction's kernel is compiled for: its accumulator's size, its
// input element's, and how many input elements a thread loads at once
// where it vectorizes along the input.
struct Kernel {
  int accumulator_bytes, input_bytes, input_vec_size, max_threads;
};

// torch's ReduceConfig (ATen/native/cuda/Reduce.cuh, setReduceConfig): how
// the outputs and each output's inputs are split across lanes, warps and
// thread blocks. Only what decides the staging buffer is kept.
class LaunchShape {
 public:
  // `input_offset`: the input's storage offset, in elements.
  LaunchShape(const at::TensorIterator& iter, std::int64_t input_offset, const Kernel& kernel, const GpuTraits& gpu)
      : num_outputs_(iter.num_output_elements()), num_inputs_(iter.numel() / num_outputs_),
        accumulator_bytes_(kernel.accumulator_bytes) {
    const int input = iter.ntensors() - 1;
    const int reduce_dims = iter.num_reduce_dims();
    std::int64_t dim0 = 1, dim1 = 1, fastest_stride = kernel.input_bytes;
    bool reduce_fastest = true;
    if (iter.ndim() > 0) {
      const auto strides = iter.strides(input);
      reduce_fastest = reduce_dims == iter.ndim() || strides[0] < strides[reduce_dims];
      dim0 = reduce_fastest ? num_inputs_ : num_outputs_;
      dim1 = reduce_fastest ? num_outputs_ : num_inputs_;
      fastest_stride = strides[reduce_fastest ? 0 : reduce_dims];
    }
    if (fastest_stride == kernel.input_bytes) {
      if (reduce_fastest && dim0 >= 128 && reduce_dims == 1) {
        dim0 /= kernel.input_vec_size;
      } else if (!reduce_fastest) {
        output_vec_size_ = output_vec_size(iter, input_offset, kernel.input_bytes);
        dim0 /= output_vec_size_;
      }
    }
    set_block_dimension(dim0, dim1, kernel.max_threads / output_vec_size_);
    block_x_reduce_ = iter.ndim() == 0 || reduce_fastest;
    (block_x_reduce_ ? step_input_ : step_output_) *= block_width_;

    constexpr int min_values_per_thread = 16, max_values_per_thread = 256;
    const bool split_across_warps = values_per_thread() >= std::min(block_height_ * 16, max_values_per_thread);
    (split_across_warps ? step_input_ : step_output_) *= block_height_;

    const int blocks_per_sm = gpu.max_threads_per_multi_processor / (block_width_ * block_height_);
    const std::int64_t target_grid_size = std::int64_t{gpu.multi_processor_count} * blocks_per_sm;
    const std::int64_t grid = grid_x();
    if (split_across_warps && values_per_thread() >= max_values_per_thread && grid <= target_grid_size) {
      ctas_per_output_ = std::clamp(div_up(target_grid_size, grid), div_up(values_per_thread(), max_values_per_thread),
                                    div_up(values_per_thread(), min_values_per_thread));
      if (ctas_per_output_ > 1) step_input_ *= ctas_per_output_;
    }
  }

  ReductionStaging staging() const {
    if (ctas_per_output_ <= 1) return {};
    std::int64_t buffer = std::int64_t{accumulator_bytes_} * num_outputs_ * ctas_per_output_;
    if (!block_x_reduce_) buffer *= block_width_ * output_vec_size_;
    return {.buffer = buffer, .semaphores = static_cast<std::int64_t>(sizeof(int)) * grid_x()};
  }

 private:
  void set_block_dimension(std::int64_t dim0, std::int64_t dim1, int max_threads) {
    const int dim0_pow2 = dim0 < max_threads ? static_cast<int>(last_pow2(dim0)) : max_threads;
    const int dim1_pow2 = dim1 < max_threads ? static_cast<int>(last_pow2(dim1)) : max_threads;
    block_width_ = std::min(dim0_pow2, kWarpSize);
    block_height_ = std::min(dim1_pow2, max_threads / block_width_);
    block_width_ = std::min(dim0_pow2, max_threads / block_height_);
  }

  // How many outputs a thread's vector load covers: the input's offset,
  // the output dimension's size and the other strides must divide by it.
  // The caching allocator's blocks are 512-byte aligned, so the offset
  // stands for the address.
  static int output_vec_size(const at::TensorIterator& iter, std::int64_t input_offset, int input_bytes) {
    int vec_size = 4;
    const auto update = [&vec_size](std::int64_t n) {
      while (n % vec_size != 0) vec_size /= 2;
    };
    update(input_offset);
    const int output_index = iter.num_reduce_dims();
    update(iter.shape()[output_index]);
    const auto strides = iter.strides(iter.noutputs());
    for (int j = 0; j < static_cast<int>(strides.size()); ++j)
      if (j != output_index) update(strides[j] / input_bytes);
    return vec_size;
  }

  std::int64_t values_per_thread() const { return div_up(num_inputs_, step_input_); }
  std::int64_t grid_x() const { return div_up(num_outputs_ / output_vec_size_, step_output_); }

  std::int64_t num_outputs_, num_inputs_;
  int accumulator_bytes_;
  int output_vec_size_ = 1;
  int block_width_ = 1, block_height_ = 1;
  bool block_x_reduce_ = true;
  std::int64_t step_input_ = 1, step_output_ = 1, ctas_per_output_ = 1;
};

// aten::sum, aten::mean and their dim_IntList overloads (self, dim,
// keepdim, ...), sum's out overload (logsumexp's), aten::amax and amin,
// aten::linalg_vector_norm (self, ord, dim, keepdim, dtype; ConvNeXt-V2's
// global response norm over height and width), and aten::var.correction
// and its kin (self, dim, *, correction, keepdim; var_mean's mean has the
// variance's shape), aten::argmax, argmin, max.dim, min.dim,
// prod.dim_int, all.dim and any.dim (self, dim, keepdim; a single dim),
// nansum, all.dims and any.dims (self, dims, keepdim), and the whole-tensor
// max, min, prod, all and any (self): the reduction into the op's (first)
// result.
template <CudaReduction kind>
ReductionStaging reduction_staging(c10::ArrayRef<c10::IValue> arguments, c10::ArrayRef<c10::IValue> returns) {
  const std::size_t dim_at = kind == CudaReduction::Norm ? 2 : 1;
  const std::size_t keepdim_at = kind == CudaReduction::Welford ? 3 : dim_at + 1;  // after var's correction
  std::optional<at::DimVector> dims;
  bool keepdim = false;
  if (arguments.size() > dim_at + 1 && arguments[dim_at].isIntList())
    dims = at::DimVector(arguments[dim_at].toDimVector());
  if (arguments.size() > dim_at + 1 && arguments[dim_at].isInt()) dims = at::DimVector{arguments[dim_at].toInt()};
  if (arguments.size() > keepdim_at && arguments[keepdim_at].isBool()) keepdim = arguments[keepdim_at].toBool();
  return cuda_reduction_staging(kind, arguments[0].toTensor(), returns[0].toTensor(),
                                dims ? at::OptionalIntArrayRef(*dims) : std::nullopt, keepdim);
}

}  // namespace

// The iterator torch's sum_out, mean_out and linalg_vector_norm_out build
// (make_reduction), over plain meta tensors of the same layout, and the
// kernel for the input type: 16-bit floats accumulate in float (in their
// own type for amax and amin); sum's load 8 of them at once
// (sum_kernel_cuda), the others' 4.
ReductionStaging cuda_reduction_staging(CudaReduction kind, const at::Tensor& self, const at::Tensor& result,
                                        at::OptionalIntArrayRef dims, bool keepdim) {
  const bool low_precision = self.scalar_type() == at::kHalf || self.scalar_type() == at::kBFloat16;
  const bool indexed = kind == CudaReduction::IndexedExtremum, logical = kind == CudaReduction::Logical;
  const at::ScalarType in_dtype = indexed || logical || (low_precision && result.scalar_type() == at::kFloat)
                                      ? self.scalar_type()
                                      : result.scalar_type();
  // Complex halves take a jitted kernel; a complex norm reduces into a real
  // result through an iterator of its own (not modelled).
  if (self.scalar_type() == at::kComplexHalf || self.numel() == 0) return {};
  if ((kind == CudaReduction::Norm || kind == CudaReduction::Welford) && self.is_complex()) return {};

  OutsideMetaMode outside;
  // An input of another dtype is copied into in_dtype first (its layout
  // kept), and that copy is reduced.
  const at::Tensor input = meta_twin(self).to(in_dtype);
  const std::int64_t cast = self.scalar_type() == in_dtype ? 0 : static_cast<std::int64_t>(input.nbytes());
  // An index's or a bool's output is laid out as a value's would be.
  const at::Tensor output =
      at::empty_strided(result.sizes(), result.strides(), result.options().dtype(in_dtype).device(c10::kMeta));
  const auto mask = at::native::make_dim_mask(dims, input.dim());
  at::Tensor viewed = at::native::review_reduce_result(output, input.dim(), mask, keepdim);
  at::TensorIterator iter = at::TensorIterator::reduce_op(viewed, input);
  // Past 32-bit indexing the kernel runs on sub-iterators: not modelled.
  if (!iter.can_use_32bit_indexing()) return {.cast = cast};
  const int input_bytes = static_cast<int>(input.element_size());
  const bool complex_double = input.scalar_type() == at::kComplexDouble;
  const bool welford = kind == CudaReduction::Welford;
  const int vec_size = welford ? 2 : kind == CudaReduction::Sum && input_bytes == 2 ? 8 : 4;
  const bool own_dtype = kind == CudaReduction::Extremum || kind == CudaReduction::MinMax;
  const int accumulator_bytes =
      welford ? (input_bytes == 8 ? 32 : 16)
      : indexed ? 16
      : logical ? 1
                : (low_precision && !own_dtype ? 4 : input_bytes) * (kind == CudaReduction::MinMax ? 2 : 1);
  const Kernel kernel{accumulator_bytes, input_bytes, vec_size, complex_double ? 256 : 512};
  ReductionStaging staging =
      LaunchShape(iter, cast == 0 ? self.storage_offset() : 0, kernel, traced_gpu()).staging();
  staging.cast = cast;
  return staging;
}

namespace {

// The reduction a loss's `reduction` argument (Mean or Sum) asks for.
CudaReduction loss_reduction(std::int64_t reduction) {
  return reduction == at::Reduction::Mean ? CudaReduction::Mean : CudaReduction::Sum;
}

// The staging of reducing a whole contiguous tensor of these sizes (a
// loss's temporary) into a 0-dim result of its dtype.
ReductionStaging whole_reduction_staging(CudaReduction kind, at::IntArrayRef sizes, const at::TensorOptions& options) {
  OutsideMetaMode outside;
  const at::Tensor whole = at::empty(sizes, options.device(c10::kMeta));
  return cuda_reduction_staging(kind, whole, at::empty({}, whole.options()), at::IntArrayRef{}, false);
}

// aten::max and aten::min of a whole tensor, and aten::argmax and argmin
// without a dim: a strided input is copied after the result
// (whole_tensor_read_copy), and the copy reduced.
template <CudaReduction kind, bool flattened>
ReductionStaging whole_tensor_staging(c10::ArrayRef<c10::IValue> arguments, c10::ArrayRef<c10::IValue> returns) {
  const std::int64_t copy = whole_tensor_read_copy(arguments, flattened);
  if (copy == 0) return reduction_staging<kind>(arguments, returns);
  const at::Tensor& self = arguments[0].toTensor();
  ReductionStaging staging = whole_reduction_staging(kind, {self.numel()}, self.options());
  staging.cast += copy;
  return staging;
}

// mse_loss, smooth_l1_loss and huber_loss with a reduction (Loss.cpp): the
// elementwise loss into a temporary of the operands' broadcast shape, then
// its mean or sum into the result, with that reduction's staging. The
// structured kernels (mse, smooth L1) make their result first, as large as
// the loss then resized to 0-dim (their meta function builds an iterator
// on it); huber_loss makes the temporary first.
template <bool kTemporaryFirst>
ScratchPlan reduced_loss_plan(c10::ArrayRef<c10::IValue> arguments) {
  ScratchPlan plan;
  const std::int64_t reduction = arguments[2].toInt();
  if (reduction == at::Reduction::None) return plan;
  const at::Tensor& self = arguments[0].toTensor();
  const at::Tensor& target = arguments[1].toTensor();
  const at::DimVector sizes = at::infer_size_dimvector(self.sizes(), target.sizes());
  const at::ScalarType dtype = at::result_type(self, target);
  plan.make(c10::multiply_integers(sizes) * static_cast<std::int64_t>(c10::elementSize(dtype)));
  if (kTemporaryFirst) plan.before_outputs = 1;
  add_staging(plan, whole_reduction_staging(loss_reduction(reduction), sizes, self.options().dtype(dtype)));
  return plan;
}

// aten::count_nonzero.dim_IntList(self, dims) and count_nonzero(self,
// dim?) (count_nonzero_cuda): (self != 0).sum(dims), so the bool mask
// (none for a bool self) before the result, and after it the sum of bools:
// their int64 copy and the staging.
ScratchPlan count_nonzero_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& self = arguments[0].toTensor();
  at::DimVector dims;
  if (arguments[1].isIntList()) dims = at::DimVector(arguments[1].toDimVector());
  if (arguments[1].isInt()) dims.push_back(arguments[1].toInt());
  ScratchPlan plan;
  ReductionStaging staging;
  {
    OutsideMetaMode outside;
    const at::Tensor meta_self = meta_twin(self);
    const at::Tensor mask = self.scalar_type() == at::kBool ? meta_self : at::ne(meta_self, 0);
    plan.make(self.scalar_type() == at::kBool ? 0 : static_cast<std::int64_t>(mask.nbytes()));
    const at::Tensor count = at::sum(mask, dims, false, at::kLong);
    staging = cuda_reduction_staging(CudaReduction::Sum, mask, count, dims, false);
  }
  plan.before_outputs = 1;
  add_staging(plan, staging);
  return plan;
}

// aten::aminmax(self, dim?, keepdim): over a dim, the reduction's
// staging; over all of self, the reduction of self made contiguous.
ScratchPlan aminmax_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& self = arguments[0].toTensor();
  ScratchPlan plan;
  if (self.numel() == 0) return plan;
  if (arguments[1].isNone()) {
    add_aminmax_of_all(plan, self);
    return plan;
  }
  OutsideMetaMode outside;
  const at::Tensor meta = meta_twin(self);
  const std::int64_t dim = arguments[1].toInt();
  const bool keepdim = arguments[2].toBool();
  add_staging(plan, cuda_reduction_staging(CudaReduction::MinMax, meta, at::amin(meta, dim, keepdim), dim, keepdim));
  return plan;
}

// After histc's counts (_histc_cuda_template), where min == max, the
// input's range read back through aminmax into two 0-dim tensors, freed as
// histc returns.
void add_histc_range(ScratchPlan& plan, c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& self = arguments[0].toTensor();
  if (self.numel() == 0 || arguments[2].toScalar().toDouble() != arguments[3].toScalar().toDouble()) return;
  const auto element = static_cast<std::int64_t>(self.element_size());
  const std::size_t min = plan.make(element), max = plan.make(element);
  add_aminmax_of_all(plan, self);
  plan.free(max);
  plan.free(min);
}

// aten::histc(self, bins, min, max).
ScratchPlan histc_plan(c10::ArrayRef<c10::IValue> arguments) {
  ScratchPlan plan;
  add_histc_range(plan, arguments);
  return plan;
}

// aten::histc.out(self, bins, min, max, out) (histogram_histc_cuda_out):
// histc's counts in a result of their own, then out resized to them and
// the counts copied in.
ScratchPlan histc_out_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& self = arguments[0].toTensor();
  ScratchPlan plan;
  const std::size_t counts = plan.make(arguments[1].toInt() * static_cast<std::int64_t>(self.element_size()));
  add_histc_range(plan, arguments);
  plan.output(0);
  plan.free(counts);
  return plan;
}

// aten::_foreach_norm.Scalar(tensors, ord, dtype) on torch's fast route
// (foreach_tensor_norm_cuda: ord 1, 2 or inf over dense floating tensors
// of one dtype): a partial norm per chunk of 65,536 values of each tensor,
// as many chunks for each as the longest takes, in the result's opmath
// type, made before the results and freed after them. Off that route
// (foreach_tensor_norm_slow) each result is followed by its own norm's
// staging, between results this op's one return (a list) makes at once:
// not modelled.
ScratchPlan foreach_norm_plan(c10::ArrayRef<c10::IValue> arguments) {
  constexpr std::int64_t kChunkSize = 65536;
  const std::vector<at::Tensor> tensors = arguments[0].toTensorVector();
  const double ord = arguments[1].toScalar().toDouble();
  ScratchPlan plan;
  if (tensors.empty() || !(ord == 1 || ord == 2 || ord == std::numeric_limits<double>::infinity())) return plan;
  std::int64_t chunks = 0;
  for (const at::Tensor& t : tensors) {
    if (!at::isFloatingType(t.scalar_type()) || t.scalar_type() != tensors[0].scalar_type() ||
        !t.is_non_overlapping_and_dense())
      return plan;
    chunks = std::max(chunks, div_up(t.numel(), kChunkSize));
  }
  const at::ScalarType dtype = arguments[2].toOptional<at::ScalarType>().value_or(tensors[0].scalar_type());
  plan.make(static_cast<std::int64_t>(tensors.size()) * chunks *
            static_cast<std::int64_t>(c10::elementSize(at::toOpMathType(dtype))));
  plan.before_outputs = 1;
  return plan;
}

// The sum of a loss's per-sample temporary `losses` into its 0-dim result,
// with that sum's staging; the temporary freed after.
void sum_per_sample_losses(ScratchPlan& plan, std::size_t losses, const at::Tensor& self) {
  add_staging(plan, whole_reduction_staging(CudaReduction::Sum, {self.size(0)}, self.options()));
  plan.free(losses);
}

// aten::multi_margin_loss(self, target, p, margin, weight, reduction)
// (multi_margin_loss_cuda_out): the result, then the input, target and
// weight made contiguous, and over a batch with a reduction each sample's
// loss into a temporary, summed into the result.
ScratchPlan multi_margin_loss_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& self = arguments[0].toTensor();
  ScratchPlan plan;
  if (self.numel() == 0) return plan;
  plan.make(copy_unless_contiguous(self));
  plan.make(copy_unless_contiguous(arguments[1].toTensor()));
  if (const auto weight = arguments[4].toOptional<at::Tensor>(); weight && weight->defined())
    plan.make(copy_unless_contiguous(*weight));
  if (self.dim() == 2 && arguments[5].toInt() != at::Reduction::None)
    sum_per_sample_losses(plan, plan.make(self.size(0) * static_cast<std::int64_t>(self.element_size())), self);
  return plan;
}

// aten::multilabel_margin_loss_forward(self, target, reduction) ->
// (output, is_target) (multilabel_margin_loss_forward_out_cuda_template):
// the input and target made contiguous, is_target, then over a batch with a
// reduction each sample's loss into a temporary before the 0-dim output,
// summed into it.
ScratchPlan multilabel_margin_loss_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& self = arguments[0].toTensor();
  ScratchPlan plan;
  if (self.numel() > 0) {
    plan.make(copy_unless_contiguous(self));
    plan.make(copy_unless_contiguous(arguments[1].toTensor()));
  }
  plan.output(1);
  if (self.numel() == 0 || self.dim() != 2 || arguments[2].toInt() == at::Reduction::None) {
    plan.output(0);
    return plan;
  }
  const std::size_t losses = plan.make(self.size(0) * static_cast<std::int64_t>(self.element_size()));
  plan.output(0);
  sum_per_sample_losses(plan, losses, self);
  return plan;
}

// aten::multi_margin_loss_backward(grad_output, self, target, p, margin,
// weight, reduction) (multi_margin_loss_cuda_backward_out): after the
// input's gradient, the input, the output's gradient, the target and the
// weight made contiguous.
ScratchPlan multi_margin_loss_backward_plan(c10::ArrayRef<c10::IValue> arguments) {
  ScratchPlan plan;
  if (arguments[1].toTensor().numel() == 0) return plan;
  for (const std::size_t operand : {1, 0, 2}) plan.make(copy_unless_contiguous(arguments[operand].toTensor()));
  if (const auto weight = arguments[5].toOptional<at::Tensor>(); weight && weight->defined())
    plan.make(copy_unless_contiguous(*weight));
  return plan;
}

// aten::multilabel_margin_loss_backward(grad_output, self, target,
// reduction, is_target) (multilabel_margin_loss_backward_cuda_out_template):
// after the input's gradient, the input, the target, is_target and the
// output's gradient (a broadcast one without a reduction) made contiguous.
ScratchPlan multilabel_margin_loss_backward_plan(c10::ArrayRef<c10::IValue> arguments) {
  ScratchPlan plan;
  plan.make(copy_unless_contiguous(arguments[1].toTensor()));
  if (arguments[1].toTensor().numel() == 0) return plan;
  for (const std::size_t operand : {2, 4, 0}) plan.make(copy_unless_contiguous(arguments[operand].toTensor()));
  return plan;
}

// aten::binary_cross_entropy(self, target, weight, reduction) with a
// reduction (binary_cross_entropy_out_cuda): the elementwise loss is the
// result's storage; its mean or sum goes to a 0-dim tensor of its own, with
// that reduction's staging, copied into the result (resized to 0-dim) and
// freed.
ScratchPlan binary_cross_entropy_plan(c10::ArrayRef<c10::IValue> arguments) {
  const std::int64_t reduction = arguments[3].toInt();
  ScratchPlan plan;
  if (reduction == at::Reduction::None) return plan;
  const at::Tensor& self = arguments[0].toTensor();
  const std::size_t reduced = plan.make(static_cast<std::int64_t>(self.element_size()));
  add_staging(plan, whole_reduction_staging(loss_reduction(reduction), self.sizes(), self.options()));
  plan.free(reduced);
  return plan;
}

// aten::_pdist_backward(grad, self, p, pdist) (pdist_backward_kernel_impl):
// each pair's share of both rows' gradients in a buffer of (n - 1) x n x m
// after the result, then summed over its first dimension into the result
// (at::sum_out) with that sum's staging. None for p = 0 or an empty input
// (the result filled with zeros).
ScratchPlan pdist_backward_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& grad = arguments[0].toTensor();
  const at::Tensor& self = arguments[1].toTensor();
  ScratchPlan plan;
  if (arguments[2].toDouble() == 0 || grad.numel() == 0 || self.numel() == 0) return plan;
  const std::int64_t n = self.size(0), m = self.size(1);
  ReductionStaging staging;
  std::size_t buffer = 0;
  {
    OutsideMetaMode outside;
    const at::Tensor shares = at::empty({n - 1, n, m}, self.options().device(c10::kMeta));
    buffer = plan.make(static_cast<std::int64_t>(shares.nbytes()));
    staging = cuda_reduction_staging(CudaReduction::Sum, shares, at::empty({n, m}, shares.options()),
                                     at::IntArrayRef{0}, false);
  }
  add_staging(plan, staging);
  plan.free(buffer);
  return plan;
}

}  // namespace

void add_aminmax_of_all(ScratchPlan& plan, const at::Tensor& self) {
  const std::size_t contiguous = plan.make(copy_unless_contiguous(self));
  OutsideMetaMode outside;
  const at::Tensor input = at::empty(self.sizes(), self.options().device(c10::kMeta));
  add_staging(plan, cuda_reduction_staging(CudaReduction::MinMax, input, at::empty({}, input.options()), std::nullopt,
                                           false));
  plan.free(contiguous);
}

// aten::_sample_dirichlet (_s_dirichlet_cuda): gamma samples into the
// result, then their sums over the last dimension (ret.sum(-1, true)) and
// that sum's staging, by which the result is divided in place.
ScratchPlan sample_dirichlet_plan(c10::ArrayRef<c10::IValue> arguments) {
  ScratchPlan plan;
  ReductionStaging staging;
  std::size_t sums = 0;
  {
    OutsideMetaMode outside;
    const at::Tensor samples = at::empty_like(meta_twin(arguments[0].toTensor()), at::MemoryFormat::Contiguous);
    const at::Tensor summed = at::sum(samples, {-1}, true);
    sums = plan.make(static_cast<std::int64_t>(summed.nbytes()));
    staging = cuda_reduction_staging(CudaReduction::Sum, samples, summed, at::IntArrayRef{-1}, true);
  }
  add_staging(plan, staging);
  plan.free(sums);
  return plan;
}

void add_staging(ScratchPlan& plan, const ReductionStaging& staging) {
  const std::size_t cast = plan.make(staging.cast);
  if (staging.buffer > 0) {
    const std::size_t buffer = plan.make(staging.buffer), semaphores = plan.make(staging.semaphores);
    plan.free(semaphores);
    plan.free(buffer);
  }
  plan.free(cast);
}

ScratchPlanModel cuda_reduction_plan_model(const std::string& qualified_name) {
  if (qualified_name == "aten::count_nonzero.dim_IntList" || qualified_name == "aten::count_nonzero")
    return &count_nonzero_plan;
  if (qualified_name == "aten::histc") return &histc_plan;
  if (qualified_name == "aten::histc.out") return &histc_out_plan;
  if (qualified_name == "aten::aminmax") return &aminmax_plan;
  if (qualified_name == "aten::_foreach_norm.Scalar") return &foreach_norm_plan;
  if (qualified_name == "aten::_sample_dirichlet") return &sample_dirichlet_plan;
  if (qualified_name == "aten::_pdist_backward") return &pdist_backward_plan;
  if (qualified_name == "aten::multi_margin_loss") return &multi_margin_loss_plan;
  if (qualified_name == "aten::multilabel_margin_loss_forward") return &multilabel_margin_loss_plan;
  if (qualified_name == "aten::multi_margin_loss_backward") return &multi_margin_loss_backward_plan;
  if (qualified_name == "aten::multilabel_margin_loss_backward") return &multilabel_margin_loss_backward_plan;
  if (qualified_name == "aten::binary_cross_entropy") return &binary_cross_entropy_plan;
  if (qualified_name == "aten::mse_loss" || qualified_name == "aten::smooth_l1_loss")
    return &reduced_loss_plan<false>;
  return qualified_name == "aten::huber_loss" ? &reduced_loss_plan<true> : nullptr;
}

ReductionStagingModel cuda_reduction_staging_model(const std::string& qualified_name) {
  if (qualified_name == "aten::sum" || qualified_name == "aten::sum.dim_IntList" ||
      qualified_name == "aten::sum.IntList_out")
    return &reduction_staging<CudaReduction::Sum>;
  if (qualified_name == "aten::amax" || qualified_name == "aten::amin")
    return &reduction_staging<CudaReduction::Extremum>;
  if (qualified_name == "aten::mean" || qualified_name == "aten::mean.dim")
    return &reduction_staging<CudaReduction::Mean>;
  if (qualified_name == "aten::linalg_vector_norm") return &reduction_staging<CudaReduction::Norm>;
  if (qualified_name == "aten::argmax" || qualified_name == "aten::argmin")
    return &whole_tensor_staging<CudaReduction::IndexedExtremum, true>;
  if (qualified_name == "aten::max.dim" || qualified_name == "aten::min.dim")
    return &reduction_staging<CudaReduction::IndexedExtremum>;
  if (qualified_name == "aten::max" || qualified_name == "aten::min")
    return &whole_tensor_staging<CudaReduction::Extremum, false>;
  for (const char* mean_like : {"aten::prod", "aten::prod.dim_int", "aten::nansum"})
    if (qualified_name == mean_like) return &reduction_staging<CudaReduction::Mean>;
  for (const char* logical :
       {"aten::all", "aten::any", "aten::all.dim", "aten::any.dim", "aten::all.dims", "aten::any.dims"})
    if (qualified_name == logical) return &reduction_staging<CudaReduction::Logical>;
  for (const char* welford :
       {"aten::var.correction", "aten::std.correction", "aten::var_mean.correction", "aten::std_mean.correction"})
    if (qualified_name == welford) return &reduction_staging<CudaReduction::Welford>;
  return nullptr;
}

}  // namespace metamem
