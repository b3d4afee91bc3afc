#include "meta/CpuKernelModel.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <unordered_map>
#include <vector>

namespace metamem {
namespace {

using Args = c10::ArrayRef<c10::IValue>;

std::int64_t element_size(const at::Tensor& t) { return static_cast<std::int64_t>(t.element_size()); }
std::int64_t bytes_of(const at::Tensor& t) { return t.numel() * element_size(t); }
std::int64_t numel(at::IntArrayRef sizes) {
  std::int64_t n = 1;
  for (auto s : sizes) n *= s;
  return n;
}

// libtorch's native CPU convolution (oneDNN off) unfolds the input into
// columns of batch x (C_in/groups * kernel) x output pixels, except for 1x1
// kernels with unit stride and no padding, where the input is used as is.
std::int64_t conv_columns_bytes(const at::Tensor& input, const at::Tensor& weight,
                                at::IntArrayRef output_size, at::IntArrayRef stride,
                                at::IntArrayRef padding) {
  bool pointwise = true;
  std::int64_t kernel = 1, pixels = 1;
  for (std::int64_t i = 2; i < weight.dim(); ++i) {
    kernel *= weight.size(i);
    pixels *= output_size[i];
    pointwise = pointwise && weight.size(i) == 1;
  }
  for (auto s : stride) pointwise = pointwise && s == 1;
  for (auto p : padding) pointwise = pointwise && p == 0;
  if (pointwise) return 0;
  return input.size(0) * weight.size(1) * kernel * pixels * element_size(input);
}

// A group's slice of a batched NCHW tensor along channels is contiguous only
// for a batch of one; otherwise the native path copies it.
std::int64_t group_copy_bytes(const at::Tensor& t, std::int64_t groups) {
  return t.size(0) > 1 ? bytes_of(t) / groups : 0;
}

// convolution(input, weight, bias, stride, padding, dilation, transposed,
// output_padding, groups). With groups > 1 it runs group by group: each
// group's input is made contiguous and unfolded, and the per-group outputs
// live until the function returns (after their concatenation).
std::int64_t convolution(Args args, Args returns) {
  const at::Tensor &input = args[0].toTensor(), &weight = args[1].toTensor();
  if (args[6].toBool()) return 0;  // transposed
  const auto stride = args[3].toIntVector(), padding = args[4].toIntVector();
  const std::int64_t groups = args[8].toInt();
  const at::Tensor& output = returns[0].toTensor();
  const std::int64_t columns = conv_columns_bytes(input, weight, output.sizes(), stride, padding);
  if (groups == 1) return columns;
  return std::max(bytes_of(output), group_copy_bytes(input, groups) + columns);
}

// convolution_backward(grad_output, input, weight, bias_sizes, stride,
// padding, dilation, transposed, output_padding, groups, output_mask).
// Grouped: one group's copies and columns, or all per-group gradients beside
// their concatenations, whichever is more.
std::int64_t convolution_backward(Args args, Args) {
  const at::Tensor &grad_output = args[0].toTensor(), &input = args[1].toTensor(),
                   &weight = args[2].toTensor();
  if (args[7].toBool()) return 0;  // transposed
  const auto stride = args[4].toIntVector(), padding = args[5].toIntVector();
  const std::int64_t groups = args[9].toInt();
  const auto mask = args[10].toBoolList();
  const std::int64_t columns =
      conv_columns_bytes(input, weight, grad_output.sizes(), stride, padding);
  if (groups == 1) return columns;
  return std::max(columns + group_copy_bytes(input, groups) + group_copy_bytes(grad_output, groups),
                  (mask[0] ? bytes_of(input) : 0) + (mask[1] ? bytes_of(weight) : 0));
}

// In training, the kernel gathers each channel's mean and sum of squares first.
std::int64_t native_batch_norm(Args args, Args) {
  const at::Tensor& input = args[0].toTensor();
  return args[5].toBool() ? 2 * input.size(1) * element_size(input) : 0;
}

// The input gradient goes through a temporary of its size.
std::int64_t native_batch_norm_backward(Args args, Args) {
  return args[9].toBoolList()[0] ? bytes_of(args[1].toTensor()) : 0;
}

// Weight and bias gradients are summed in a zeroed buffer of
// threads x 2 x (normalized elements).
std::int64_t native_layer_norm_backward(Args args, Args) {
  const auto mask = args[7].toBoolList();
  if (!mask[1] && !mask[2]) return 0;
  return at::get_num_threads() * 2 * numel(args[2].toIntVector()) * element_size(args[1].toTensor());
}

// Arithmetic with a Scalar wraps it in a 0-dim tensor (double, long, bool or
// complex double) and, when the tensor's dtype differs, casts it: both live
// while the op runs.
std::int64_t scalar_operand(Args args, Args) {
  const at::Tensor& self = args[0].toTensor();
  const c10::IValue& scalar = args[1];
  const c10::ScalarType wrapped = scalar.isDouble()  ? c10::kDouble
                                  : scalar.isInt()   ? c10::kLong
                                  : scalar.isBool()  ? c10::kBool
                                                     : c10::kComplexDouble;
  return static_cast<std::int64_t>(c10::elementSize(wrapped)) +
         (wrapped == self.scalar_type() ? 0 : element_size(self));
}

// addmm_impl_cpu_ hands BLAS each matrix as it is when its strides allow it
// (one dimension contiguous, the other's stride at least the leading
// dimension) and a contiguous copy otherwise; a result BLAS cannot write is
// computed in a column-major copy. The copies live until it returns.
std::int64_t blas_copies(at::IntArrayRef result_sizes, at::IntArrayRef result_strides,
                         at::IntArrayRef m1_sizes, at::IntArrayRef m1_strides,
                         at::IntArrayRef m2_sizes, at::IntArrayRef m2_strides,
                         std::int64_t element) {
  if (numel(result_sizes) == 0 || m1_sizes[1] == 0) return 0;
  std::int64_t copies = 0;
  bool transpose_c = false;
  if (result_strides[0] == 1 &&
      (result_sizes[1] == 1 || result_strides[1] >= std::max<std::int64_t>(1, result_sizes[0]))) {
    transpose_c = false;
  } else if (result_strides[1] == 1 &&
             (result_sizes[0] == 1 || result_strides[0] >= std::max<std::int64_t>(1, result_sizes[1]))) {
    transpose_c = true;
    std::swap(m1_sizes, m2_sizes);
    std::swap(m1_strides, m2_strides);
  } else {
    copies += numel(result_sizes) * element;
  }
  const std::size_t row = transpose_c ? 1 : 0, column = transpose_c ? 0 : 1;
  const std::int64_t m = result_sizes[row], n = result_sizes[column], k = m1_sizes[column];
  // Usable as is, untransposed (leading dimension `plain`) or transposed (`transposed`).
  auto usable = [&](at::IntArrayRef strides, std::int64_t plain, std::int64_t transposed) {
    return (strides[row] == 1 && strides[column] >= std::max<std::int64_t>(1, plain)) ||
           (strides[column] == 1 && strides[row] >= std::max<std::int64_t>(1, transposed));
  };
  if (!usable(m1_strides, m, k)) copies += numel(m1_sizes) * element;
  if (!usable(m2_strides, k, n)) copies += numel(m2_sizes) * element;
  return copies;
}

std::int64_t blas_copies(const at::Tensor& result, const at::Tensor& m1, const at::Tensor& m2) {
  return blas_copies(result.sizes(), result.strides(), m1.sizes(), m1.strides(), m2.sizes(),
                     m2.strides(), element_size(m1));
}

std::int64_t mm(Args args, Args returns) {
  return blas_copies(returns[0].toTensor(), args[0].toTensor(), args[1].toTensor());
}

std::int64_t addmm(Args args, Args returns) {
  return blas_copies(returns[0].toTensor(), args[1].toTensor(), args[2].toTensor());
}

// Without MKL, batched products below 400 multiply-adds per matrix run a
// plain loop; larger ones call addmm_impl_cpu_ one batch item at a time, so
// one item's copies are live at once.
std::int64_t batched(const at::Tensor& result, const at::Tensor& b1, const at::Tensor& b2) {
  if (b1.size(0) == 0 || b1.size(2) * b1.size(1) * b2.size(2) < 400) return 0;
  return blas_copies(result.sizes().slice(1), result.strides().slice(1), b1.sizes().slice(1),
                     b1.strides().slice(1), b2.sizes().slice(1), b2.strides().slice(1),
                     element_size(b1));
}

std::int64_t bmm(Args args, Args returns) {
  return batched(returns[0].toTensor(), args[0].toTensor(), args[1].toTensor());
}

std::int64_t baddbmm(Args args, Args returns) {
  return batched(returns[0].toTensor(), args[1].toTensor(), args[2].toTensor());
}

}  // namespace

CpuScratchModel cpu_scratch_model(const std::string& qualified_name) {
  static const std::unordered_map<std::string, CpuScratchModel> models = {
      {"aten::convolution", &convolution},
      {"aten::convolution_backward", &convolution_backward},
      {"aten::native_batch_norm", &native_batch_norm},
      {"aten::native_batch_norm_backward", &native_batch_norm_backward},
      {"aten::native_layer_norm_backward", &native_layer_norm_backward},
      {"aten::add.Scalar", &scalar_operand},
      {"aten::add_.Scalar", &scalar_operand},
      {"aten::sub.Scalar", &scalar_operand},
      {"aten::sub_.Scalar", &scalar_operand},
      {"aten::mul.Scalar", &scalar_operand},
      {"aten::mul_.Scalar", &scalar_operand},
      {"aten::div.Scalar", &scalar_operand},
      {"aten::div_.Scalar", &scalar_operand},
      {"aten::mm", &mm},
      {"aten::addmm", &addmm},
      {"aten::addmm_", &addmm},
      {"aten::bmm", &bmm},
      {"aten::baddbmm", &baddbmm},
      {"aten::baddbmm_", &baddbmm},
  };
  const auto it = models.find(qualified_name);
  return it == models.end() ? nullptr : it->second;
}

}  // namespace metamem
