#include "meta/CpuKernelModel.h"

#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>
#include <ATen/TensorUtils.h>
#include <ATen/core/Reduction.h>
#include <ATen/core/Tensor.h>
#include <ATen/OpMathType.h>
#include <ATen/native/TypeProperties.h>
#include <c10/core/WrapDimMinimal.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>
#include <vector>

#include "meta/LapackWorkspace.h"

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
// The dilated one unfolds one batch item at a time. The undilated 3-d one
// (slow_conv3d) takes all groups at once: its columns span every input
// channel.
bool all_groups_at_once(const at::Tensor& input, at::IntArrayRef dilation) {
  return input.dim() == 5 && std::all_of(dilation.begin(), dilation.end(), [](std::int64_t d) { return d == 1; });
}

std::int64_t conv_columns_bytes(const at::Tensor& input, const at::Tensor& weight,
                                at::IntArrayRef output_size, at::IntArrayRef stride,
                                at::IntArrayRef padding, at::IntArrayRef dilation) {
  bool pointwise = true, dilated = false;
  std::int64_t kernel = 1, pixels = 1;
  for (std::int64_t i = 2; i < weight.dim(); ++i) {
    kernel *= weight.size(i);
    pixels *= output_size[i];
    pointwise = pointwise && weight.size(i) == 1;
  }
  for (auto s : stride) pointwise = pointwise && s == 1;
  for (auto p : padding) pointwise = pointwise && p == 0;
  for (auto d : dilation) dilated = dilated || d != 1;
  if (pointwise && !dilated) return 0;
  const std::int64_t channels = all_groups_at_once(input, dilation) ? input.size(1) : weight.size(1);
  return (dilated ? 1 : input.size(0)) * channels * kernel * pixels * element_size(input);
}

// The native path copies a group's slice along channels unless it is
// contiguous (for a contiguous NCHW tensor: a batch of one).
std::int64_t group_copy_bytes(const at::Tensor& t, std::int64_t groups) {
  return copy_unless_contiguous(t.narrow(1, 0, t.size(1) / groups));
}

// convolution(input, weight, bias, stride, padding, dilation, transposed,
// output_padding, groups). With groups > 1 it runs group by group: each
// group's input is made contiguous and unfolded, and the per-group outputs
// live until the function returns (after their concatenation).
// The slow transposed convolution scatters through columns of C_out x
// kernel x input pixels: the 2-d one for the whole batch at once, the 3-d
// one an item at a time, adding a bias through a plane of ones, and
// allocating its output input-sized first and resizing it. With groups > 1
// it runs group by group like the direct one.
std::int64_t transposed_columns_bytes(const at::Tensor& input, const at::Tensor& weight) {
  std::int64_t columns = weight.size(1) * element_size(input);
  for (std::int64_t i = 2; i < weight.dim(); ++i) columns *= weight.size(i) * input.size(i);
  return columns;
}

std::int64_t transposed_convolution(Args args, const at::Tensor& output) {
  const at::Tensor &input = args[0].toTensor(), &weight = args[1].toTensor();
  const std::int64_t groups = args[8].toInt();
  std::int64_t ones = args[2].isTensor() && args[2].toTensor().defined() ? element_size(input) : 0;
  for (std::int64_t i = 2; i < output.dim(); ++i) ones *= output.size(i);
  const std::int64_t group_input = bytes_of(input) / groups;
  std::int64_t group = transposed_columns_bytes(input, weight) + ones;
  if (input.dim() == 4) group = input.size(0) * transposed_columns_bytes(input, weight);
  if (input.dim() == 5) group = std::max(group, group_input);
  if (groups == 1) return group;
  return std::max(bytes_of(output), group_copy_bytes(input, groups) + group);
}

// The undilated 2-d kernel runs channels last when the input is: the weight
// is copied into that format first (for the forward and for the backward),
// and lives until every group is done.
bool runs_channels_last(const at::Tensor& input, at::IntArrayRef dilation) {
  const bool dilated = std::any_of(dilation.begin(), dilation.end(), [](std::int64_t d) { return d != 1; });
  return input.dim() == 4 && !dilated && input.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
}

std::int64_t channels_last_weight_copy(const at::Tensor& input, const at::Tensor& weight,
                                       at::IntArrayRef dilation) {
  return runs_channels_last(input, dilation) ? copy_unless_contiguous(weight, at::MemoryFormat::ChannelsLast) : 0;
}

// Before anything else the native paths (all but the undilated 3-d one)
// make the input contiguous in the format they run in, a copy that lives
// until the op returns: a view with gaps, or one whose layout is neither
// format (a split of a transposed tensor, as CoaT's relative position
// encoding convolves).
std::int64_t backend_input_copy(const at::Tensor& input, at::IntArrayRef dilation) {
  if (all_groups_at_once(input, dilation)) return 0;
  return copy_unless_contiguous(input, runs_channels_last(input, dilation) ? at::MemoryFormat::ChannelsLast
                                                                           : at::MemoryFormat::Contiguous);
}

// One group's slice of that copy, copied again unless it is contiguous:
// channels first, for a batch of one; channels last, never but for a
// single pixel of a batch of one.
std::int64_t group_input_copy(const at::Tensor& input, std::int64_t groups, at::IntArrayRef dilation) {
  const std::int64_t items = runs_channels_last(input, dilation) ? input.numel() / input.size(1) : input.size(0);
  return items == 1 ? 0 : bytes_of(input) / groups;
}

std::int64_t convolution(Args args, Args returns) {
  const at::Tensor &input = args[0].toTensor(), &weight = args[1].toTensor();
  if (args[6].toBool()) return transposed_convolution(args, returns[0].toTensor());
  const auto stride = args[3].toIntVector(), padding = args[4].toIntVector();
  const std::int64_t groups = args[8].toInt();
  const at::Tensor& output = returns[0].toTensor();
  const std::int64_t columns =
      conv_columns_bytes(input, weight, output.sizes(), stride, padding, args[5].toIntVector());
  const auto dilation = args[5].toIntVector();
  const std::int64_t copies = channels_last_weight_copy(input, weight, dilation) + backend_input_copy(input, dilation);
  if (groups == 1) return columns + copies;
  if (all_groups_at_once(input, dilation)) return columns;
  return copies + std::max(bytes_of(output), group_input_copy(input, groups, dilation) + columns);
}

// One group's slice of the output gradient: copied contiguous in the
// gradient's own format unless it is, then, where the kernel runs in the
// other format, copied into that one (a channels-last convolution's
// gradient from a sum's expanded ones).
std::int64_t group_grad_output_copies(const at::Tensor& grad_output, std::int64_t groups, const at::Tensor& input,
                                      at::IntArrayRef dilation) {
  const bool channels_last = grad_output.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
  return group_copy_bytes(grad_output, groups) +
         (channels_last != runs_channels_last(input, dilation) ? bytes_of(grad_output) / groups : 0);
}

// convolution_backward(grad_output, input, weight, bias_sizes, stride,
// padding, dilation, transposed, output_padding, groups, output_mask).
// Grouped: one group's copies and columns, or all per-group gradients beside
// their concatenations, whichever is more.
std::int64_t convolution_backward(Args args, Args) {
  const at::Tensor &grad_output = args[0].toTensor(), &input = args[1].toTensor(),
                   &weight = args[2].toTensor();
  const std::int64_t groups = args[9].toInt();
  const auto mask = args[10].toBoolList();
  // The per-group gradients, all live beside their concatenations.
  auto gradients = [&](std::int64_t bias) {
    return (mask[0] ? bytes_of(input) : 0) + (mask[1] ? bytes_of(weight) : 0) +
           (mask[2] ? bias * element_size(weight) : 0);
  };
  if (args[7].toBool()) {
    const std::int64_t columns = transposed_columns_bytes(input, weight);
    if (groups == 1) return copy_unless_contiguous(grad_output) + columns;
    return std::max(columns + group_copy_bytes(input, groups) + group_copy_bytes(grad_output, groups),
                    gradients(weight.size(1) * groups));
  }
  const auto stride = args[4].toIntVector(), padding = args[5].toIntVector(), dilation = args[6].toIntVector();
  // The dilated kernel also sums each item's bias gradient in a temporary.
  const bool dilated = std::any_of(dilation.begin(), dilation.end(), [](std::int64_t d) { return d != 1; });
  const std::int64_t columns = conv_columns_bytes(input, weight, grad_output.sizes(), stride, padding, dilation) +
                               (dilated && mask[2] ? weight.size(0) / groups * element_size(weight) : 0);
  const std::int64_t grad_output_copy = copy_unless_contiguous(grad_output, input.suggest_memory_format());
  if (all_groups_at_once(input, dilation)) {
    // slow_conv3d computes the input gradient first, through columns
    // (input-sized for a pointwise kernel too), before the weight and bias
    // gradients exist; then the weight gradient through the input's
    // columns. Each pass copies the output gradient contiguous anew.
    const std::int64_t later_gradients =
        (mask[1] ? bytes_of(weight) : 0) + (mask[2] ? weight.size(0) * element_size(weight) : 0);
    const std::int64_t input_pass =
        mask[0] ? grad_output_copy + (columns != 0 ? columns : bytes_of(input)) - later_gradients : 0;
    const std::int64_t weight_pass = mask[1] ? grad_output_copy + columns : 0;
    return std::max({input_pass, weight_pass, std::int64_t{0}});
  }
  const std::int64_t copies = channels_last_weight_copy(input, weight, dilation) + backend_input_copy(input, dilation);
  if (groups == 1) return columns + grad_output_copy + copies;
  return copies + std::max(columns + group_input_copy(input, groups, dilation) +
                               group_grad_output_copies(grad_output, groups, input, dilation),
                           gradients(weight.size(0)));
}

// In training, the kernel gathers each channel's mean and sum of squares
// first, in the statistics' dtype; over a channels-last input (a contiguous
// one whose channels are adjacent, as in [N, C], counts) it sums them
// through a zeroed threads x C buffer.
std::int64_t training_statistics(const at::Tensor& input, Args returns) {
  const at::Tensor& mean = returns[1].toTensor();
  const bool channels_last = input.is_contiguous() ? input.stride(1) == 1
                                                   : input.is_contiguous(at::MemoryFormat::ChannelsLast) ||
                                                         input.is_contiguous(at::MemoryFormat::ChannelsLast3d);
  return 2 * bytes_of(mean) + (channels_last ? at::get_num_threads() * bytes_of(mean) : 0);
}

std::int64_t native_batch_norm(Args args, Args returns) {
  return args[5].toBool() ? training_statistics(args[0].toTensor(), returns) : 0;
}

// 2.x's batch norm that updates running statistics always trains.
std::int64_t batch_norm_with_update(Args args, Args returns) { return training_statistics(args[0].toTensor(), returns); }

// Dense in some memory format, as the batch norm kernels test it.
bool dense(const at::Tensor& t) {
  return t.is_contiguous() || t.is_contiguous(at::MemoryFormat::ChannelsLast) ||
         t.is_contiguous(at::MemoryFormat::ChannelsLast3d);
}

// With input and gradient dense alike, the fast path allocates the input
// gradient twice (the first is dropped); otherwise a per-channel sum of
// the gradient comes first.
std::int64_t native_batch_norm_backward(Args args, Args) {
  const at::Tensor &grad_out = args[0].toTensor(), &input = args[1].toTensor();
  const bool fast = dense(input) && dense(grad_out) &&
                    input.suggest_memory_format() == grad_out.suggest_memory_format();
  if (!fast) return input.size(1) * element_size(grad_out);
  return args[9].toBoolList()[0] ? bytes_of(input) : 0;
}

// Layer norm works on contiguous inputs.
std::int64_t native_layer_norm(Args args, Args) {
  std::int64_t bytes = copy_unless_contiguous(args[0].toTensor());
  for (std::size_t i : {2, 3})
    if (args[i].isTensor()) bytes += copy_unless_contiguous(args[i].toTensor());
  return bytes;
}

// Weight and bias gradients are summed in a zeroed buffer of
// threads x 2 x (normalized elements).
// A gradient that is not contiguous is copied first.
std::int64_t native_layer_norm_backward(Args args, Args) {
  const auto mask = args[7].toBoolList();
  const at::Tensor& input = args[1].toTensor();
  const std::int64_t copies = copy_unless_contiguous(args[0].toTensor()) + copy_unless_contiguous(input);
  if ((!mask[1] && !mask[2]) || input.numel() == 0) return copies;
  return copies + at::get_num_threads() * 2 * numel(args[2].toIntVector()) * element_size(args[1].toTensor());
}

// Kernels that read their first argument dense in the layout it suggests:
// group norm's input, channel shuffle's.
std::int64_t dense_first(Args args, Args) {
  const at::Tensor& self = args[0].toTensor();
  return copy_unless_contiguous(self, self.suggest_memory_format());
}

// Group norm's backward reads the gradient and the input dense in the
// input's layout and sums per (sample, channel) into two N x C buffers.
std::int64_t native_group_norm_backward(Args args, Args) {
  const at::Tensor &grad_out = args[0].toTensor(), &input = args[1].toTensor();
  const auto format = input.suggest_memory_format();
  return copy_unless_contiguous(input, format) + copy_unless_contiguous(grad_out, format) +
         2 * args[5].toInt() * args[6].toInt() * element_size(input);
}

// TensorIterator, building an elementwise op on CPU, copies each operand
// whose dtype differs from the operands' common dtype into that dtype, and
// computes into a temporary when a given output (in place, out=) has another
// dtype. A Scalar operand is first wrapped in a 0-dim tensor (double, long,
// bool or complex double). Meta kernels skip all of it: the copies are CPU's.
enum class Promotion : std::uint8_t { Common, ToFloat, Comparison };

struct IteratorOperands {
  std::size_t first = 0, count = 2;  // the operands among the arguments
  Promotion promotion = Promotion::Common;
};

c10::ScalarType wrapped_type(const c10::Scalar& scalar) {
  return scalar.isFloatingPoint() ? c10::kDouble
         : scalar.isIntegral(false) ? c10::kLong
         : scalar.isBoolean()       ? c10::kBool
                                    : c10::kComplexDouble;
}

std::int64_t iterator_casts(Args args, Args returns, IteratorOperands operands) {
  const std::size_t end = std::min(args.size(), operands.first + operands.count);
  at::native::ResultTypeState state;
  for (std::size_t i = operands.first; i < end; ++i) {
    if (args[i].isTensor() && args[i].toTensor().defined())
      state = at::native::update_result_type_state(args[i].toTensor(), state);
    else if (args[i].isScalar())
      state = at::native::update_result_type_state(args[i].toScalar(), state);
  }
  c10::ScalarType common = at::native::result_type(state);
  if (operands.promotion == Promotion::ToFloat && c10::isIntegralType(common, /*includeBool=*/true))
    common = c10::typeMetaToScalarType(c10::get_default_dtype());
  const auto common_size = static_cast<std::int64_t>(c10::elementSize(common));
  std::int64_t bytes = 0;
  for (std::size_t i = operands.first; i < end; ++i) {
    if (args[i].isScalar()) {
      const c10::ScalarType wrapped = wrapped_type(args[i].toScalar());
      bytes += static_cast<std::int64_t>(c10::elementSize(wrapped)) + (wrapped == common ? 0 : common_size);
    } else if (args[i].isTensor()) {
      const at::Tensor& t = args[i].toTensor();
      if (t.defined() && t.scalar_type() != common) bytes += t.numel() * common_size;
    }
  }
  // A given output is its own argument: self in place, or out.
  const at::Tensor& out = returns[0].toTensor();
  const bool given = (args[0].isTensor() && out.is_same(args[0].toTensor())) ||
                     (args.back().isTensor() && out.is_same(args.back().toTensor()));
  const bool cast_out = operands.promotion != Promotion::Comparison || out.scalar_type() != c10::kBool;
  if (given && cast_out && out.scalar_type() != common) bytes += out.numel() * common_size;
  return bytes;
}

template <std::size_t kFirst, std::size_t kCount, Promotion kPromotion>
std::int64_t elementwise(Args args, Args returns) {
  return iterator_casts(args, returns, {kFirst, kCount, kPromotion});
}

// Division rounds (trunc, floor) in the operands' common dtype and divides
// truly in a floating one.
std::int64_t div(Args args, Args returns) {
  const bool rounds = args.size() > 2 && args[2].isString();
  return iterator_casts(args, returns, {0, 2, rounds ? Promotion::Common : Promotion::ToFloat});
}

// Sums, products, all and any reduce in their result's dtype: an input of
// another dtype is copied into it first.
std::int64_t reduction_cast(Args args, Args returns) {
  const at::Tensor &self = args[0].toTensor(), &result = returns[0].toTensor();
  return self.scalar_type() == result.scalar_type()
             ? 0
             : self.numel() * static_cast<std::int64_t>(c10::elementSize(result.scalar_type()));
}

// The CPU mean is a sum into the result, then div_ by the count (a wrapped long).
std::int64_t mean(Args args, Args returns) {
  const at::Tensor& result = returns[0].toTensor();
  return reduction_cast(args, returns) + static_cast<std::int64_t>(c10::elementSize(c10::kLong)) +
         (result.scalar_type() == c10::kLong ? 0 : element_size(result));
}

// Softmax kernels work on contiguous inputs, and backward on a contiguous
// gradient and output.
std::int64_t softmax(Args args, Args) {
  const at::Tensor& input = args[0].toTensor();
  return input.numel() == 0 ? 0 : copy_unless_contiguous(input);
}

std::int64_t softmax_backward(Args args, Args) {
  return copy_unless_contiguous(args[0].toTensor()) + copy_unless_contiguous(args[1].toTensor());
}

// Pooling and padding gradients are computed from a gradient laid out as
// the input suggests (NCHW or channels last), copied if it is not.
std::int64_t gradient_in_input_layout(Args args, Args) {
  return copy_unless_contiguous(args[0].toTensor(), args[1].toTensor().suggest_memory_format());
}

// Kernels that read their first argument contiguous: upsampling's
// gradients, narrow_copy's input.
std::int64_t contiguous_first(Args args, Args) { return copy_unless_contiguous(args[0].toTensor()); }

// Nearest and (bi/tri)linear upsampling of a channels-last input of more
// than three channels runs a channels-last kernel, in 2-d also for any
// input with a small output (H + W <= 128): it reads a channels-last copy
// of any other input and writes any other output through a channels-last
// temporary. The generic kernel precomputes, for each output position along
// each resized dimension, `taps` source indices (int64) and weights (the
// input's dtype).
template <int kTaps>
std::int64_t upsample(Args args, Args returns) {
  const at::Tensor &input = args[0].toTensor(), &output = returns[0].toTensor();
  const std::int64_t spatial = input.dim() - 2;
  const auto format = spatial == 3 ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::ChannelsLast;
  const bool channels_last = spatial > 1 && kTaps < 4 && input.is_contiguous(format) && input.size(1) > 3;
  const bool small_output = spatial == 2 && kTaps < 4 && output.size(-2) + output.size(-1) <= 128;
  if (channels_last || small_output)
    return copy_unless_contiguous(input, format) + copy_unless_contiguous(output, format);
  std::int64_t positions = 0;
  for (std::int64_t d = 2; d < output.dim(); ++d) positions += output.size(d);
  return kTaps * positions * (8 + element_size(input));
}

// Antialiased resampling (bilinear: 2 source taps, bicubic: 4, widened by
// the downscaling factor) is separable: the width first, then the height,
// each resized dimension in a pass of its own that computes four int64
// index tensors and a weights tensor (output positions x taps) in the
// input's dtype, freed after the pass. With both dimensions resized, the
// width pass writes an intermediate [N, C, H_in, W_out] that lives through
// both.
template <int kInterp>
std::int64_t antialiased_upsample(Args args, Args returns) {
  const at::Tensor &input = args[0].toTensor(), &output = returns[0].toTensor();
  const bool align_corners = args[2].toBool();
  auto pass = [&](std::int64_t d, const c10::IValue& scale) -> std::int64_t {
    const std::int64_t in = input.size(d), out = output.size(d);
    if (in == out) return 0;
    const double factor = align_corners ? (out > 1 ? static_cast<double>(in - 1) / static_cast<double>(out - 1) : 0.0)
                          : scale.isDouble() && scale.toDouble() > 0 ? 1.0 / scale.toDouble()
                                                                   : static_cast<double>(in) / static_cast<double>(out);
    const double support = std::max(factor, 1.0) * kInterp / 2.0;
    const auto taps = static_cast<std::int64_t>(std::ceil(support)) * 2 + 1;
    return 4 * 8 * out + out * taps * element_size(input);
  };
  const std::int64_t width = pass(3, args[4]), height = pass(2, args[3]);
  if (width == 0 || height == 0) return width + height;
  const std::int64_t intermediate = input.size(0) * input.size(1) * input.size(2) * output.size(3) * element_size(input);
  return intermediate + std::max(width, height);
}

// tril and triu copy an input whose matrices are not laid out one after
// another (a 2-d input always is, in their sense).
std::int64_t triangle(Args args, Args returns) {
  const at::Tensor& self = args[0].toTensor();
  if (self.is_contiguous() || self.dim() < 3) return 0;
  const bool in_place = returns[0].toTensor().is_same(self);
  if (in_place) return 0;
  std::int64_t expected = self.size(-1) * self.size(-2);
  for (std::int64_t i = self.dim() - 3; i >= 0; --i) {
    if (self.stride(i) != expected) return bytes_of(self);
    expected *= self.size(i);
  }
  return 0;
}

// The dense embedding gradient reads a contiguous gradient and indices (on
// CUDA as well: meta/CudaEmbedding.cpp).
std::int64_t embedding_dense_backward(Args args, Args) {
  return copy_unless_contiguous(args[0].toTensor()) + copy_unless_contiguous(args[1].toTensor());
}

// index_select reads a contiguous index; selecting along dim 1 into a
// contiguous result takes a contiguous copy of the input too.
std::int64_t index_select(Args args, Args returns) {
  const at::Tensor &self = args[0].toTensor(), &index = args[2].toTensor(), &result = returns[0].toTensor();
  const std::int64_t dim = c10::maybe_wrap_dim(args[1].toInt(), std::max<std::int64_t>(self.dim(), 1));
  const bool dim1 = self.dim() > 1 && index.numel() > 0 && self.numel() > 0 && dim == 1 && result.is_contiguous();
  return copy_unless_contiguous(index) + (dim1 ? copy_unless_contiguous(self) : 0);
}

// The scatter/gather kernel reads an int64 index (a copy of any other) and,
// for a half-precision result, accumulates in a float copy of it. The
// result is gather's output, or the tensor scattered into.
std::int64_t scatter_gather(Args args, Args returns) {
  const at::Tensor &index = args[2].toTensor(), &result = returns[0].toTensor();
  const std::int64_t long_index = index.scalar_type() == at::kLong ? 0 : index.numel() * 8;
  const bool reduced = at::isReducedFloatingType(result.scalar_type());
  return long_index + (reduced ? result.numel() * 4 : 0);
}

// _chunk_cat on CPU zero-pads each tensor whose length along dim is not a
// multiple of num_chunks and concatenates the padded copies (CUDA has a
// kernel of its own that pads as it writes).
std::int64_t chunk_cat(Args args, Args) {
  const auto tensors = args[0].toTensorVector();
  if (tensors.empty()) return 0;
  const std::int64_t dim = c10::maybe_wrap_dim(args[1].toInt(), tensors[0].dim());
  const std::int64_t chunks = args[2].toInt();
  std::int64_t bytes = 0;
  for (const at::Tensor& t : tensors) {
    const std::int64_t length = t.size(dim), padded = (length + chunks - 1) / chunks * chunks;
    if (padded != length) bytes += t.numel() / std::max<std::int64_t>(length, 1) * padded * element_size(t);
  }
  return bytes;
}

// repeat (2.14) orders the dimensions of its unfolded result through int64
// CPU tensors: arange(n) and arange(n) + n (a wrapped Scalar) over the n
// repeats, then their interleaving cat, all live at once. A zero repeat
// returns the empty result first.
std::int64_t repeat(Args args, Args) {
  const auto repeats = args[1].toIntVector();
  if (std::find(repeats.begin(), repeats.end(), 0) != repeats.end()) return 0;
  const auto n = static_cast<std::int64_t>(repeats.size());
  return std::max(8 * n + 8 + 8 * n, 8 * n + 8 * n + 16 * n);
}

// unfold's backward copies straight into non-overlapping windows; with
// overlapping ones (step < size) its kernel walks the input positions the
// windows cover through an int64 arange of them.
std::int64_t unfold_backward(Args args, Args) {
  const auto input_sizes = args[1].toIntVector();
  const std::int64_t size = args[3].toInt(), step = args[4].toInt();
  if (step >= size) return 0;
  const std::int64_t length =
      input_sizes[c10::maybe_wrap_dim(args[2].toInt(), static_cast<std::int64_t>(input_sizes.size()))];
  const std::int64_t windows = (length - size) / step + 1;
  return 8 * ((windows - 1) * step + size);
}

// vector_norm first casts its input to a requested dtype. A 0-norm over
// dims of length one is (x != 0) written into the result: a wrapped Scalar
// and its cast to the result's dtype.
std::int64_t linalg_vector_norm(Args args, Args returns) {
  const at::Tensor &self = args[0].toTensor(), &result = returns[0].toTensor();
  const bool cast = !args[4].isNone() && args[4].toScalarType() != self.scalar_type();
  std::vector<std::int64_t> dims = args[2].isNone() ? std::vector<std::int64_t>{} : args[2].toIntVector();
  // A 0-dim input takes this path only over all (no) dims.
  const bool trivial = self.dim() == 0 ? dims.empty() : std::all_of(dims.begin(), dims.end(), [&](std::int64_t d) {
    return self.size(c10::maybe_wrap_dim(d, self.dim())) == 1;
  }) && (!dims.empty() || self.numel() == 1);
  const bool elementwise_zero_norm = trivial && args[1].toScalar().toDouble() == 0.0;
  return (cast ? self.numel() * static_cast<std::int64_t>(c10::elementSize(args[4].toScalarType())) : 0) +
         (elementwise_zero_norm ? 8 + element_size(result) : 0);
}

// Out of training, rrelu's slope is (lower + upper) / 2 computed in 0-dim
// tensors: both (floating) bounds wrapped as doubles, their sum, a wrapped
// 2 (int64) cast to double and the quotient, six of 8 bytes live at once.
std::int64_t rrelu_with_noise(Args args, Args) { return args[4].toBool() ? 0 : 6 * 8; }

// segment_reduce checks lengths it may not trust before its result exists:
// their min, then all(lengths.sum(-1) == data.size(axis)) through a
// wrapped Scalar and a bool per segment list. Both directions read their
// tensors contiguous.
std::int64_t segment_reduce(Args args, Args returns) {
  const at::Tensor& data = args[0].toTensor();
  const bool lengths = args[2].isTensor() && args[2].toTensor().defined();
  const bool unsafe = args[6].toBool();
  std::int64_t checks = 0;
  if (lengths && !unsafe) {
    const at::Tensor& l = args[2].toTensor();
    const std::int64_t lists = l.dim() > 0 && l.size(-1) > 0 ? l.numel() / l.size(-1) : 1;
    checks = std::max<std::int64_t>(8, 8 * lists + 8 + lists) - bytes_of(returns[0].toTensor());
  }
  return std::max(checks, copy_unless_contiguous(data));
}

std::int64_t segment_reduce_backward(Args args, Args) {
  std::int64_t bytes = 0;
  for (std::size_t i : {0, 1, 2, 4, 5})
    if (args[i].isTensor() && args[i].toTensor().defined()) bytes += copy_unless_contiguous(args[i].toTensor());
  return bytes;
}

// roll over no dims rolls the flattened input; over several dims it rolls
// one at a time, keeping every intermediate.
std::int64_t roll(Args args, Args returns) {
  const at::Tensor& self = args[0].toTensor();
  const std::int64_t dims = static_cast<std::int64_t>(args[2].toIntVector().size());
  if (dims == 0) return copy_unless_contiguous(self);
  return std::max<std::int64_t>(dims - 1, 0) * bytes_of(returns[0].toTensor());
}

// MKL's FFTs (_exec_fft) put the batch dimensions first, largest stride
// first, and the transformed ones after them in the order given, then
// collapse the batch dimensions into one: the input is copied unless its
// strides allow that view and it has no zero stride (an expanded gradient
// is copied; measured). The output is contiguous in that order and
// permuted back.
struct FftExecution {
  std::int64_t input_copy = 0;
  std::vector<std::int64_t> out_strides;
};

FftExecution mkl_fft(at::IntArrayRef sizes, at::IntArrayRef strides, std::int64_t element_bytes,
                     at::IntArrayRef out_sizes, at::IntArrayRef dim) {
  const std::size_t ndim = sizes.size(), batch_dims = ndim - dim.size();
  // The same partition and sort as the kernel's: equal strides keep its order.
  std::vector<std::int64_t> order(ndim);
  std::iota(order.begin(), order.end(), std::int64_t{0});
  std::vector<bool> transformed(ndim, false);
  for (std::int64_t d : dim) transformed[d] = true;
  const auto batch_end = std::partition(order.begin(), order.end(), [&](std::int64_t d) { return !transformed[d]; });
  std::sort(order.begin(), batch_end, [&](std::int64_t a, std::int64_t b) { return strides[a] > strides[b]; });
  std::copy(dim.begin(), dim.end(), batch_end);

  std::vector<std::int64_t> permuted_sizes, permuted_strides, batched{1}, batched_out{1};
  for (std::size_t i = 0; i < ndim; ++i) {
    permuted_sizes.push_back(sizes[order[i]]);
    permuted_strides.push_back(strides[order[i]]);
    if (i < batch_dims) {
      batched[0] *= sizes[order[i]];
    } else {
      batched.push_back(sizes[order[i]]);
      batched_out.push_back(out_sizes[order[i]]);
    }
  }
  batched_out[0] = batched[0];
  FftExecution result;
  const auto view = at::detail::computeStride(permuted_sizes, permuted_strides, batched);
  if (!view || std::find(view->begin(), view->end(), 0) != view->end())
    result.input_copy = numel(sizes) * element_bytes;

  std::vector<std::int64_t> contiguous(batched_out.size(), 1);
  for (std::size_t i = batched_out.size() - 1; i > 0; --i) contiguous[i - 1] = contiguous[i] * batched_out[i];
  result.out_strides.assign(ndim, 0);
  std::int64_t batch_numel = 1;
  for (std::size_t i = batch_dims; i-- > 0;) {
    result.out_strides[order[i]] = batch_numel * contiguous[0];
    batch_numel *= out_sizes[order[i]];
  }
  for (std::size_t i = batch_dims; i < ndim; ++i) result.out_strides[order[i]] = contiguous[1 + i - batch_dims];
  return result;
}

// The kernels transform in the order of the input's strides, largest first
// (a one-sided transform's last dimension stays last).
std::vector<std::int64_t> fft_order(const at::Tensor& self, std::vector<std::int64_t> dim, bool keep_last) {
  std::sort(dim.begin(), dim.end() - (keep_last ? 1 : 0),
            [&](std::int64_t a, std::int64_t b) { return self.stride(a) > self.stride(b); });
  return dim;
}

std::int64_t fft_r2c(Args args, Args) {
  const at::Tensor& self = args[0].toTensor();
  const std::vector<std::int64_t> dim = args[1].toIntVector();
  std::vector<std::int64_t> out_sizes = self.sizes().vec();
  if (args[3].toBool()) out_sizes[dim.back()] = out_sizes[dim.back()] / 2 + 1;
  return mkl_fft(self.sizes(), self.strides(), element_size(self), out_sizes, fft_order(self, dim, true)).input_copy;
}

std::int64_t fft_c2c(Args args, Args) {
  const at::Tensor& self = args[0].toTensor();
  return mkl_fft(self.sizes(), self.strides(), element_size(self), self.sizes(),
                 fft_order(self, args[1].toIntVector(), false))
      .input_copy;
}

// A transform over several dimensions is a complex one over all but the
// last (its result held to the end, its copy freed before the output is
// made), then the real one over the last.
std::int64_t fft_c2r(Args args, Args returns) {
  const at::Tensor& self = args[0].toTensor();
  std::vector<std::int64_t> dim = args[1].toIntVector();
  std::vector<std::int64_t> out_sizes = self.sizes().vec();
  out_sizes[dim.back()] = args[3].toInt();
  if (dim.size() == 1)
    return mkl_fft(self.sizes(), self.strides(), element_size(self), out_sizes, dim).input_copy;
  const std::int64_t last = dim.back();
  dim.pop_back();
  const FftExecution complex = mkl_fft(self.sizes(), self.strides(), element_size(self), self.sizes(),
                                       fft_order(self, dim, false));
  const FftExecution real = mkl_fft(self.sizes(), complex.out_strides, element_size(self), out_sizes, {last});
  const std::int64_t held = bytes_of(self);
  return std::max(held + complex.input_copy - bytes_of(returns[0].toTensor()), held + real.input_copy);
}

// Sorting fills the indices from an arange along the sorted dimension.
std::int64_t sort(Args args, Args) {
  const at::Tensor& self = args[0].toTensor();
  if (self.dim() == 0) return 0;
  for (const c10::IValue& arg : args.slice(1))
    if (arg.isInt()) return self.size(c10::maybe_wrap_dim(arg.toInt(), self.dim())) * 8;
  return 0;
}

// normal with a std tensor checks std.min() >= 0 (a 0-dim minimum, a
// wrapped and cast 0, a bool) once more after allocating its output; with a
// mean number it then fills a 0-dim tensor with it.
std::int64_t std_check(const at::Tensor& std) { return std.numel() > 0 ? 2 * element_size(std) + 8 + 1 : 0; }

std::int64_t normal_tensors(Args args, Args) { return std_check(args[1].toTensor()); }

std::int64_t normal_mean_number(Args args, Args returns) {
  return std::max(std_check(args[1].toTensor()), element_size(returns[0].toTensor()));
}

// With a std number, the kernel makes an (unused) tensor like its output.
std::int64_t normal_std_number(Args, Args returns) { return bytes_of(returns[0].toTensor()); }

// count_nonzero over dims is (self != 0).sum(dims): a wrapped and cast 0
// beside the bool mask, then the mask beside its int64 copy that the sum
// reads. Over all dims it counts in place.
std::int64_t count_nonzero(Args args, Args returns) {
  const at::Tensor& self = args[0].toTensor();
  if (args[1].isNone() || (args[1].isIntList() && args[1].toIntVector().empty())) return 0;
  const std::int64_t mask = self.numel();
  return std::max(8 + element_size(self) + mask - bytes_of(returns[0].toTensor()), mask + 8 * mask);
}

// median over all elements partitions a clone; along a dim it works on a
// copy unless that dim is already contiguous.
std::int64_t median_all(Args args, Args) { return bytes_of(args[0].toTensor()); }

std::int64_t median_dim(Args args, Args) {
  const at::Tensor& self = args[0].toTensor();
  if (self.dim() == 0) return 0;
  return self.stride(c10::maybe_wrap_dim(args[1].toInt(), self.dim())) > 1 ? bytes_of(self) : 0;
}

// im2col and col2im write into empty_like(input) resized to their output:
// growing it reallocates (both live for a moment); they read the input
// contiguous.
std::int64_t unfold_columns(Args args, Args returns) {
  const at::Tensor &input = args[0].toTensor(), &output = returns[0].toTensor();
  return copy_unless_contiguous(input) + (bytes_of(output) > bytes_of(input) ? bytes_of(input) : 0);
}

// kthvalue selects in a contiguous clone with an int64 index per element.
std::int64_t kthvalue(Args args, Args) {
  const at::Tensor& self = args[0].toTensor();
  return bytes_of(self) + self.numel() * 8;
}

// Binary searches read the sorted sequence and the values contiguous; a
// Scalar value is wrapped in a 0-dim tensor and cast to the sequence's
// dtype. A sorter is first checked in range through its aminmax (two
// 0-dim), before the result exists.
std::int64_t searchsorted(Args args, Args returns) {
  const at::Tensor& sequence = args[0].toTensor();
  std::int64_t values = 0;
  if (args[1].isScalar()) {
    const c10::ScalarType wrapped = wrapped_type(args[1].toScalar());
    values = static_cast<std::int64_t>(c10::elementSize(wrapped)) +
             (wrapped == sequence.scalar_type() ? 0 : element_size(sequence));
  } else {
    values = copy_unless_contiguous(args[1].toTensor());
  }
  const std::int64_t bytes = copy_unless_contiguous(sequence) + values;
  if (!args[5].isTensor()) return bytes;
  const at::Tensor& sorter = args[5].toTensor();
  const std::int64_t range_check = sorter.numel() > 0 ? 2 * element_size(sorter) : 0;
  return std::max(range_check - bytes_of(returns[0].toTensor()), bytes + copy_unless_contiguous(sorter));
}

std::int64_t bucketize(Args args, Args) {
  return copy_unless_contiguous(args[0].toTensor()) + copy_unless_contiguous(args[1].toTensor());
}

// cdist and its gradient read both operands expanded to their common batch,
// contiguous; the gradient also a contiguous gradient and distance.
std::int64_t cdist_operands(const at::Tensor& x1, const at::Tensor& x2) {
  auto batch = at::infer_size(x1.sizes().slice(0, x1.dim() - 2), x2.sizes().slice(0, x2.dim() - 2));
  auto expanded = [&](const at::Tensor& x) {
    auto size = batch;
    size.push_back(x.size(-2));
    size.push_back(x.size(-1));
    return copy_unless_contiguous(x.expand(size));
  };
  return expanded(x1) + expanded(x2);
}

std::int64_t cdist_backward(Args args, Args) {
  return copy_unless_contiguous(args[0].toTensor()) + cdist_operands(args[1].toTensor(), args[2].toTensor()) +
         copy_unless_contiguous(args[4].toTensor());
}

// (p = 2 on more than 25 rows takes the matmul path, whose temporaries are
// its own ops.)
std::int64_t cdist_forward(Args args, Args) {
  const at::Tensor &x1 = args[0].toTensor(), &x2 = args[1].toTensor();
  const bool matmul = args[2].toDouble() == 2.0 && args[3].isInt() &&
                      (args[3].toInt() == 1 || (args[3].toInt() == 0 && (x1.size(-2) > 25 || x2.size(-2) > 25)));
  return matmul ? 0 : cdist_operands(x1, x2);
}

// A triangular solve hands LAPACK the broadcast A as is when it is row or
// column major, and a column-major copy otherwise.
std::int64_t linalg_solve_triangular(Args args, Args) {
  const at::Tensor &A = args[0].toTensor(), &B = args[1].toTensor();
  const at::Tensor broadcast_A = A.expand(
      [&] {
        auto size = at::infer_size(A.sizes().slice(0, A.dim() - 2), B.sizes().slice(0, B.dim() - 2));
        size.push_back(A.size(-2));
        size.push_back(A.size(-1));
        return size;
      }());
  const bool ready = broadcast_A.is_contiguous() || broadcast_A.transpose(-2, -1).is_contiguous();
  return ready ? 0 : bytes_of(broadcast_A);
}

// Max pooling's gradient works in the memory format the gradient suggests:
// it reads gradient and indices so laid out, and computes into a temporary
// unless its output has that format.
std::int64_t max_pool_backward(Args args, Args returns) {
  const at::MemoryFormat format = args[0].toTensor().suggest_memory_format();
  const at::Tensor& grad_input = returns[0].toTensor();
  return copy_unless_contiguous(args[0].toTensor(), format) +
         copy_unless_contiguous(args.back().toTensor(), format) + copy_unless_contiguous(grad_input, format);
}

// Pixel (un)shuffle reads its input in its own suggested memory format.
std::int64_t pixel_shuffle(Args args, Args) {
  const at::Tensor& self = args[0].toTensor();
  return copy_unless_contiguous(self, self.suggest_memory_format());
}

// histc keeps bins + 1 edges and counts through one bins-long buffer per
// thread; with min == max it first finds the input's range (two 0-dim).
std::int64_t histc(Args args, Args) {
  const at::Tensor& self = args[0].toTensor();
  const std::int64_t bins = args[1].toInt();
  const bool data_range = self.numel() > 0 && args[2].toScalar().toDouble() == args[3].toScalar().toDouble();
  return (bins + 1) * element_size(self) +
         std::max(data_range ? 2 * element_size(self) : 0, at::get_num_threads() * bins * element_size(self));
}

// Determinants come from an LU factorisation (int32 infos per matrix) and
// the permutation's sign: (arange(1, n + 1) != pivots).sum(-1, long) (a
// batch of bool masks beside one int32 arange; the sum reads an int64 copy
// of the masks),
// then fmod_, mul_, add_ with wrapped longs. All in one expression, so its
// temporaries live to its end.
struct Determinant {
  std::int64_t batch, n, element;
  std::int64_t infos() const { return 4 * batch; }
  std::int64_t permutation_sign() const { return 4 * n + n * batch + 8 * batch + std::max<std::int64_t>(8 * n * batch, 8); }
};

Determinant determinant(const at::Tensor& A) {
  std::int64_t batch = 1;
  for (std::int64_t i = 0; i < A.dim() - 2; ++i) batch *= A.size(i);
  return {batch, A.size(-1), element_size(A)};
}

// det = sign * prod(diag(U)): the product first, then the sign, then the
// sign cast to the product's dtype.
std::int64_t linalg_det(Args args, Args) {
  const Determinant d = determinant(args[0].toTensor());
  const std::int64_t product = d.batch * d.element;
  return d.infos() + product + std::max(d.permutation_sign(), 8 * d.batch + d.batch * d.element);
}

// sign = prod(sgn(diag(U))) * permutation sign, then sum(log(abs(diag(U)))).
std::int64_t linalg_slogdet(Args args, Args) {
  const Determinant d = determinant(args[0].toTensor());
  const std::int64_t diagonal = d.n * d.batch * d.element, product = d.batch * d.element;
  return d.infos() + std::max({d.permutation_sign(), 8 * d.batch + diagonal + product + d.batch * d.element, diagonal});
}

// The inverse solves A X = I through an LU factorisation and its pivots
// (int32), then lu_solve's pivot checks; with check_errors, infos.any().
std::int64_t linalg_inv_ex(Args args, Args returns) {
  const Determinant d = determinant(args[0].toTensor());
  if (returns[0].toTensor().numel() == 0) return 0;
  const std::int64_t pivots = d.n * d.batch;
  return d.n * d.n * d.batch * d.element + 4 * pivots +
         std::max(8 + 4 + pivots, args[1].toBool() ? 1 + d.batch : 0);
}

// cholesky_solve solves in column-major copies of B (its result) and of A
// broadcast to the common batch, with int32 infos and their check.
std::int64_t cholesky_solve(Args args, Args returns) {
  const at::Tensor &A = args[1].toTensor(), &X = returns[0].toTensor();
  std::int64_t batch = 1;
  for (std::int64_t i = 0; i < X.dim() - 2; ++i) batch *= X.size(i);
  const std::int64_t n = A.size(-1);
  return batch * n * n * element_size(A) + 4 * batch + 1 + batch;
}

// geqrf factors through one workspace that LAPACK sizes, asked for even
// when there is nothing to factor.
std::int64_t geqrf(Args args, Args) {
  const at::Tensor& A = args[0].toTensor();
  return lapack::geqrf_work(A.scalar_type(), A.size(-2), A.size(-1)) * element_size(A);
}

// linalg_eig of a real matrix checks isfinite(A).all() first ((abs(A) !=
// inf) with a wrapped inf, A == A, their product), before its results
// exist. Then int32 infos, the eigenvalues' real and imaginary parts, a
// column-major copy of A, real eigenvectors when they are computed and
// geev's workspace; after geev, (imaginary parts == 0).all() with a wrapped
// 0.
std::int64_t eig(const at::Tensor& A, bool vectors, std::int64_t results) {
  if (A.is_complex()) return 0;
  const Determinant d = determinant(A);
  const std::int64_t matrices = d.batch * d.n * d.n, parts = 2 * d.n * d.batch * d.element;
  const std::int64_t wrapped_inf = 8 + (d.element == 8 ? 0 : d.element), wrapped_zero = 8 + d.element;
  const std::int64_t finite_check = bytes_of(A) + std::max(matrices + wrapped_inf, 3 * matrices) - results;
  const std::int64_t real_vectors = vectors ? bytes_of(A) : 0;
  const std::int64_t infos = 4 * std::max<std::int64_t>(d.batch, 1);  // one for an empty batch too
  const std::int64_t geev = infos + parts + bytes_of(A) + real_vectors +
                            lapack::geev_work(A.scalar_type(), vectors, d.n) * d.element;
  const std::int64_t real_check = infos + parts + real_vectors + wrapped_zero + d.n * d.batch;
  return std::max({finite_check, geev, real_check});
}

std::int64_t linalg_eig(Args args, Args returns) {
  return eig(args[0].toTensor(), true, bytes_of(returns[0].toTensor()) + bytes_of(returns[1].toTensor()));
}

std::int64_t linalg_eigvals(Args args, Args returns) {
  return eig(args[0].toTensor(), false, bytes_of(returns[0].toTensor()));
}

// householder_product runs orgqr on each matrix of its result through one
// workspace that LAPACK sizes.
std::int64_t linalg_householder_product(Args args, Args returns) {
  const at::Tensor &A = args[0].toTensor(), &tau = args[1].toTensor();
  if (returns[0].toTensor().numel() == 0) return 0;
  return lapack::orgqr_work(A.scalar_type(), A.size(-2), A.size(-1), tau.size(-1)) * element_size(A);
}

// ormqr multiplies a column-major copy of other (its result) by the
// reflectors in a column-major copy of input, through one workspace that
// LAPACK sizes.
std::int64_t ormqr(Args args, Args returns) {
  const at::Tensor &input = args[0].toTensor(), &tau = args[1].toTensor(), &C = returns[0].toTensor();
  return bytes_of(input) + lapack::ormqr_work(input.scalar_type(), args[3].toBool(), args[4].toBool(), C.size(-2), C.size(-1),
                            tau.size(-1)) *
         element_size(input);
}

// linalg_qr: Householder scalars (batch x k), geqrf in Q or R when one has
// A's shape (else in a column-major copy of A), then orgqr for a non-empty
// Q; each asks LAPACK for its workspace, one at a time.
std::int64_t linalg_qr(Args args, Args returns) {
  const at::Tensor &A = args[0].toTensor(), &Q = returns[0].toTensor(), &R = returns[1].toTensor();
  const std::int64_t m = A.size(-2), n = A.size(-1), k = std::min(m, n);
  const bool compute_q = args[1].toStringRef() != "r";
  const Determinant d = determinant(A);
  const std::int64_t tau = d.batch * k * d.element;
  const bool in_place = (compute_q && Q.size(-1) == n) || R.size(-2) == m;
  const std::int64_t geqrf = lapack::geqrf_work(A.scalar_type(), m, n) * d.element;
  const bool orgqr_runs = compute_q && Q.numel() > 0;
  const std::int64_t orgqr = orgqr_runs ? lapack::orgqr_work(A.scalar_type(), m, Q.size(-1), k) * d.element : 0;
  return tau + (in_place ? 0 : bytes_of(A)) + std::max(geqrf, orgqr);
}

// _linalg_eigh: int32 infos, syevd's work and iwork (A copied first when
// no eigenvectors are kept), then the infos check.
std::int64_t linalg_eigh(Args args, Args) {
  const at::Tensor& A = args[0].toTensor();
  if (A.numel() == 0) return 0;
  const bool vectors = args[2].toBool();
  const Determinant d = determinant(A);
  const lapack::EighWork work = lapack::syevd_work(A.scalar_type(), vectors, d.n);
  return (vectors ? 0 : bytes_of(A)) + d.infos() + std::max(work.work * d.element + 4 * work.iwork, 1 + d.batch);
}

// _linalg_svd: int32 infos, a column-major copy of A that gesdd destroys
// (its workspaces are std::vectors, outside the allocator), the check.
std::int64_t linalg_svd(Args args, Args) {
  const at::Tensor& A = args[0].toTensor();
  if (A.numel() == 0) return 0;
  const Determinant d = determinant(A);
  return d.infos() + std::max(bytes_of(A), 1 + d.batch);
}

// Pivots become an int64 permutation through an arange over the m rows,
// expanded over the batch and made contiguous (a copy for more than one
// matrix).
std::int64_t permutation_bytes(std::int64_t m, std::int64_t batch) { return 8 * m + (batch > 1 ? 8 * m * batch : 0); }

// lu_unpack reads contiguous pivots.
std::int64_t lu_unpack(Args args, Args) {
  const at::Tensor &LU = args[0].toTensor(), &pivots = args[1].toTensor();
  if (!args[3].toBool()) return 0;
  std::int64_t batch = 1;
  for (std::int64_t i = 0; i < pivots.dim() - 1; ++i) batch *= pivots.size(i);
  return permutation_bytes(LU.size(-2), batch) + copy_unless_contiguous(pivots);
}

// linalg_lu factors a copy of A beside int32 pivots and infos, then unpacks
// the pivots.
std::int64_t linalg_lu(Args args, Args) {
  const at::Tensor& A = args[0].toTensor();
  const Determinant d = determinant(A);
  const std::int64_t m = A.size(-2), k = std::min(m, A.size(-1));
  return 4 * k * d.batch + d.infos() + std::max(bytes_of(A), permutation_bytes(m, d.batch));
}

// The LDL factorisation asks sytrf for its workspace.
std::int64_t linalg_ldl_factor_ex(Args args, Args) {
  const at::Tensor& A = args[0].toTensor();
  if (A.numel() == 0) return 0;
  const std::int64_t work = lapack::sytrf_work(A.scalar_type(), A.size(-1)) * element_size(A);
  return std::max(work, args[2].toBool() ? 1 + determinant(A).batch : 0);
}

// LAPACK's error codes are checked with infos.any(): a bool result beside
// a bool copy of the int32 codes.
std::int64_t linalg_check_errors(Args args, Args) { return 1 + args[0].toTensor().numel(); }

// Unless there is nothing to solve, the pivots are checked with
// all(pivots > 0) and all(pivots <= n): each a wrapped and cast bound beside
// a bool mask.
std::int64_t linalg_lu_solve(Args args, Args returns) {
  const at::Tensor& pivots = args[1].toTensor();
  if (returns[0].toTensor().numel() == 0) return 0;
  return 8 + element_size(pivots) + pivots.numel();
}

// Unpooling reads its input and indices in the input's memory format.
std::int64_t max_unpool(Args args, Args) {
  const at::Tensor &self = args[0].toTensor(), &indices = args[1].toTensor();
  const at::MemoryFormat format = self.suggest_memory_format();
  return copy_unless_contiguous(self, format) + copy_unless_contiguous(indices, format);
}

// A reduced binary cross entropy computes the elementwise loss into its
// output, reduces it to a 0-dim temporary (the mean divides in place by the
// count: a wrapped long, cast) and copies that back into the shrunk output.
std::int64_t reduced_loss(Args args, Args) {
  const at::Tensor& self = args[0].toTensor();
  const std::int64_t reduction = args[3].toInt();
  if (reduction == at::Reduction::None) return 0;
  return element_size(self) + (reduction == at::Reduction::Mean ? 8 + element_size(self) : 0);
}

// MSE, smooth L1 and Huber compute the elementwise loss into a temporary
// and reduce that (a mean as above).
std::int64_t reduced_pointwise_loss(Args args, Args) {
  const at::Tensor& self = args[0].toTensor();
  const std::int64_t reduction = args[2].toInt();
  if (reduction == at::Reduction::None) return 0;
  return bytes_of(self) + (reduction == at::Reduction::Mean ? 8 + element_size(self) : 0);
}

// The dense embedding-bag gradient reads a contiguous gradient. Sum and
// mean sort the indices (values, positions and a resized copy), then gather
// them. Max gathers the nonempty bags' rows of max_indices and of the
// gradient, each through the list of nonempty bags (taken to be every bag:
// which are empty depends on the offsets' values), beside one column's
// contiguous copy at a time. Per-sample weights are gathered in the sorted
// order too.
std::int64_t embedding_bag_dense_backward(Args args, Args) {
  const at::Tensor &grad = args[0].toTensor(), &indices = args[1].toTensor();
  constexpr std::int64_t kMax = 2;
  if (args[7].toInt() != kMax) {
    const bool scaled = args[8].isTensor() && args[8].toTensor().defined();
    const std::int64_t weights = scaled ? indices.numel() * element_size(args[8].toTensor()) : 0;
    return copy_unless_contiguous(grad) + 3 * indices.numel() * 8 + weights;
  }
  const std::int64_t bags = args[3].toTensor().numel(), dim = grad.size(1);
  return copy_unless_contiguous(grad) + bags * dim * (8 + element_size(grad)) + bags * 8;
}

// The per-sample-weights gradient rebuilds each index's bag when the
// forward's fast path left offset2bag empty: zeros over the indices and one
// more, an index_add_ of ones over the offsets, a wrapped 1 subtracted, and
// their cumsum, the zeros live throughout.
std::int64_t embedding_bag_per_sample_weights_backward(Args args, Args) {
  const at::Tensor &indices = args[2].toTensor(), &offsets = args[3].toTensor();
  if (args[4].toTensor().numel() != 0 || indices.numel() == 0) return 0;
  const std::int64_t bags = (indices.numel() + 1) * element_size(offsets);
  return bags + std::max({offsets.numel() * element_size(offsets), std::int64_t{8}, bags});
}

// CTC's backward computes log-beta beside the log-alpha its forward kept.
std::int64_t ctc_loss_backward(Args args, Args) { return bytes_of(args[6].toTensor()); }

// The multilabel margin kernels make and free a 0-dim long twice, one at a
// time (measured; the peak sees one).
std::int64_t multilabel_margin_loss(Args, Args) { return 8; }

std::int64_t loss_backward_mean(Args args, Args) {
  return args[4].toInt() == at::Reduction::Mean ? 8 + element_size(args[1].toTensor()) : 0;
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

// gemv takes the matrix as is when one of its dimensions is contiguous
// with a usable leading dimension, and a contiguous copy otherwise.
std::int64_t addmv(Args args, Args returns) {
  const at::Tensor &mat = args[1].toTensor(), &result = returns[0].toTensor();
  if (mat.numel() == 0 || result.numel() == 0) return 0;
  auto lda_ok = [](std::int64_t m, std::int64_t n, std::int64_t lda) {
    return n == 1 || lda >= std::max<std::int64_t>(1, m);
  };
  const bool usable = (mat.stride(0) == 1 && lda_ok(mat.size(0), mat.size(1), mat.stride(1))) ||
                      (mat.stride(1) == 1 && lda_ok(mat.size(1), mat.size(0), mat.stride(0)));
  return usable ? 0 : bytes_of(mat);
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

// Elementwise families: every overload of the op and of its in-place form.
// The CPU flash attention (FlashAttentionKernel.cpp) takes queries in
// blocks of 32, 64 or 256 rows (by the query length) and keys in blocks of
// 512, and gives each of at::get_num_threads() threads a buffer in the
// accumulation type: forward, scores, row maxima and sums and an output
// block; backward, scores and their gradient. Half and bfloat16 also keep
// the scores in their own type. (Half on CPUs with AMX-FP16 packs its
// operands into other blocks: not modelled.)
struct FlashBlocks {
  std::int64_t rows, keys, threads, accumulate_size, reduced_size;
};

FlashBlocks cpu_flash_blocks(const at::Tensor& query, std::int64_t query_length, std::int64_t key_length) {
  const std::int64_t rows = query_length >= 768 ? 256 : query_length >= 192 ? 64 : 32;
  const bool reduced = at::isReducedFloatingType(query.scalar_type());
  return {std::min(rows, query_length), std::min<std::int64_t>(512, key_length), at::get_num_threads(),
          static_cast<std::int64_t>(c10::elementSize(at::toOpMathType(query.scalar_type()))),
          reduced ? element_size(query) : 0};
}

std::int64_t cpu_flash_attention(Args args, Args) {
  const at::Tensor& query = args[0].toTensor();
  const at::Tensor& value = args[2].toTensor();
  const FlashBlocks b = cpu_flash_blocks(query, query.size(2), value.size(2));
  const std::int64_t per_thread = b.rows * b.keys + 2 * b.rows + b.rows * value.size(3);
  return b.threads * (per_thread * b.accumulate_size + b.rows * b.keys * b.reduced_size);
}

// The backward reads the output's gradient as [batch, seq, heads, dim],
// contiguous, and each thread that takes a share of the batch x heads loop
// (parallel_for, one at a time when there is one item or one thread) holds a
// block's row sums.
std::int64_t cpu_flash_attention_backward(Args args, Args) {
  const at::Tensor& grad_out = args[0].toTensor();
  if (!grad_out.defined()) return 0;
  const at::Tensor& query = args[1].toTensor();
  const FlashBlocks b = cpu_flash_blocks(query, query.size(2), args[3].toTensor().size(2));
  const std::int64_t items = query.size(0) * query.size(1);
  const std::int64_t threads = items > 1 && b.threads > 1 ? std::min(b.threads, items) : 1;
  const std::int64_t share = (items + threads - 1) / threads;
  const std::int64_t workers = (items + share - 1) / share;
  return copy_unless_contiguous(grad_out.transpose(1, 2)) +
         b.threads * 2 * b.rows * b.keys * (b.accumulate_size + b.reduced_size) +
         workers * b.rows * b.accumulate_size;
}

ScratchModel elementwise_model(const std::string& op) {
  static const std::unordered_map<std::string, ScratchModel> families = {
      {"aten::add", &elementwise<0, 2, Promotion::Common>},
      {"aten::sub", &elementwise<0, 2, Promotion::Common>},
      {"aten::rsub", &elementwise<0, 2, Promotion::Common>},
      {"aten::mul", &elementwise<0, 2, Promotion::Common>},
      {"aten::remainder", &elementwise<0, 2, Promotion::Common>},
      {"aten::fmod", &elementwise<0, 2, Promotion::Common>},
      {"aten::maximum", &elementwise<0, 2, Promotion::Common>},
      {"aten::minimum", &elementwise<0, 2, Promotion::Common>},
      {"aten::fmax", &elementwise<0, 2, Promotion::Common>},
      {"aten::fmin", &elementwise<0, 2, Promotion::Common>},
      {"aten::hypot", &elementwise<0, 2, Promotion::Common>},
      {"aten::nextafter", &elementwise<0, 2, Promotion::Common>},
      {"aten::heaviside", &elementwise<0, 2, Promotion::Common>},
      {"aten::floor_divide", &elementwise<0, 2, Promotion::Common>},
      {"aten::logaddexp", &elementwise<0, 2, Promotion::Common>},
      {"aten::logaddexp2", &elementwise<0, 2, Promotion::Common>},
      {"aten::bitwise_and", &elementwise<0, 2, Promotion::Common>},
      {"aten::bitwise_or", &elementwise<0, 2, Promotion::Common>},
      {"aten::bitwise_xor", &elementwise<0, 2, Promotion::Common>},
      {"aten::addcmul", &elementwise<0, 3, Promotion::Common>},
      {"aten::addcdiv", &elementwise<0, 3, Promotion::Common>},
      {"aten::where", &elementwise<1, 2, Promotion::Common>},
      {"aten::div", &div},
      {"aten::atan2", &elementwise<0, 2, Promotion::ToFloat>},
      {"aten::copysign", &elementwise<0, 2, Promotion::ToFloat>},
      {"aten::xlogy", &elementwise<0, 2, Promotion::ToFloat>},
      {"aten::special_xlog1py", &elementwise<0, 2, Promotion::ToFloat>},
      {"aten::special_zeta", &elementwise<0, 2, Promotion::ToFloat>},
      {"aten::igamma", &elementwise<0, 2, Promotion::ToFloat>},
      {"aten::igammac", &elementwise<0, 2, Promotion::ToFloat>},
      {"aten::eq", &elementwise<0, 2, Promotion::Comparison>},
      {"aten::ne", &elementwise<0, 2, Promotion::Comparison>},
      {"aten::lt", &elementwise<0, 2, Promotion::Comparison>},
      {"aten::le", &elementwise<0, 2, Promotion::Comparison>},
      {"aten::gt", &elementwise<0, 2, Promotion::Comparison>},
      {"aten::ge", &elementwise<0, 2, Promotion::Comparison>},
      {"aten::logical_and", &elementwise<0, 2, Promotion::Comparison>},
      {"aten::logical_or", &elementwise<0, 2, Promotion::Comparison>},
      {"aten::logical_xor", &elementwise<0, 2, Promotion::Comparison>},
      {"aten::sum", &reduction_cast},
      {"aten::nansum", &reduction_cast},
      {"aten::prod", &reduction_cast},
      {"aten::all", &reduction_cast},
      {"aten::any", &reduction_cast},
      {"aten::mean", &mean},
  };
  std::string family = op;
  if (!family.empty() && family.back() == '_') family.pop_back();
  const auto it = families.find(family);
  return it == families.end() ? nullptr : it->second;
}

std::int64_t copy_unless_contiguous(const at::Tensor& t, at::MemoryFormat format) {
  return t.defined() && !t.is_contiguous(format) ? t.numel() * static_cast<std::int64_t>(t.element_size()) : 0;
}

ScratchModel cuda_native_scratch_model(const std::string& qualified_name) {
  // host_softmax reads its input contiguous, as the CPU kernel does: a
  // copy of a transposed view (CoaT's keys) beside the output. Its
  // backward has a plan (meta/CudaNormalization.cpp).
  return qualified_name == "aten::_softmax" || qualified_name == "aten::_log_softmax" ? &softmax : nullptr;
}

ScratchModel cpu_scratch_model(const std::string& qualified_name) {
  static const std::unordered_map<std::string, ScratchModel> models = {
      {"aten::convolution", &convolution},
      {"aten::convolution_backward", &convolution_backward},
      {"aten::native_batch_norm", &native_batch_norm},
      {"aten::native_batch_norm_backward", &native_batch_norm_backward},
      {"aten::_native_batch_norm_legit", &native_batch_norm},
      {"aten::_batch_norm_with_update", &batch_norm_with_update},
      {"aten::batch_norm_backward", &native_batch_norm_backward},
      {"aten::native_layer_norm_backward", &native_layer_norm_backward},
      {"aten::native_layer_norm", &native_layer_norm},
      {"aten::native_group_norm", &dense_first},
      {"aten::native_group_norm_backward", &native_group_norm_backward},
      {"aten::tril", &triangle},
      {"aten::triu", &triangle},
      {"aten::embedding_dense_backward", &embedding_dense_backward},
      {"aten::index_select", &index_select},
      {"aten::gather", &scatter_gather},
      {"aten::scatter.src", &scatter_gather},
      {"aten::scatter.value", &scatter_gather},
      {"aten::scatter.reduce", &scatter_gather},
      {"aten::scatter.value_reduce", &scatter_gather},
      {"aten::scatter_.src", &scatter_gather},
      {"aten::scatter_.value", &scatter_gather},
      {"aten::scatter_.reduce", &scatter_gather},
      {"aten::scatter_.value_reduce", &scatter_gather},
      {"aten::scatter_add", &scatter_gather},
      {"aten::scatter_add_", &scatter_gather},
      {"aten::_chunk_cat", &chunk_cat},
      {"aten::repeat", &repeat},
      {"aten::narrow_copy", &contiguous_first},
      {"aten::unfold_backward", &unfold_backward},
      {"aten::channel_shuffle", &dense_first},
      {"aten::native_channel_shuffle", &dense_first},
      {"aten::linalg_vector_norm", &linalg_vector_norm},
      {"aten::rrelu_with_noise", &rrelu_with_noise},
      {"aten::segment_reduce", &segment_reduce},
      {"aten::_segment_reduce_backward", &segment_reduce_backward},
      {"aten::roll", &roll},
      {"aten::sort", &sort},
      {"aten::sort.stable", &sort},
      {"aten::_fft_r2c", &fft_r2c},
      {"aten::_fft_c2c", &fft_c2c},
      {"aten::_fft_c2r", &fft_c2r},
      {"aten::normal.Tensor_Tensor", &normal_tensors},
      {"aten::normal.float_Tensor", &normal_mean_number},
      {"aten::normal.Tensor_float", &normal_std_number},
      {"aten::count_nonzero.dim_IntList", &count_nonzero},
      {"aten::count_nonzero", &count_nonzero},
      {"aten::median", &median_all},
      {"aten::nanmedian", &median_all},
      {"aten::median.dim", &median_dim},
      {"aten::nanmedian.dim", &median_dim},
      {"aten::im2col", &unfold_columns},
      {"aten::col2im", &unfold_columns},
      {"aten::_cdist_forward", &cdist_forward},
      {"aten::kthvalue", &kthvalue},
      {"aten::searchsorted.Tensor", &searchsorted},
      {"aten::searchsorted.Scalar", &searchsorted},
      {"aten::bucketize.Tensor", &bucketize},
      {"aten::_cdist_backward", &cdist_backward},
      {"aten::grid_sampler_2d_backward", &contiguous_first},
      {"aten::linalg_solve_triangular", &linalg_solve_triangular},
      {"aten::max_pool2d_with_indices_backward", &max_pool_backward},
      {"aten::max_pool3d_with_indices_backward", &max_pool_backward},
      {"aten::pixel_shuffle", &pixel_shuffle},
      {"aten::pixel_unshuffle", &pixel_shuffle},
      {"aten::addmv", &addmv},
      {"aten::addmv_", &addmv},
      {"aten::_linalg_check_errors", &linalg_check_errors},
      {"aten::_linalg_det", &linalg_det},
      {"aten::linalg_qr", &linalg_qr},
      {"aten::linalg_eig", &linalg_eig},
      {"aten::_linalg_eigvals", &linalg_eigvals},
      {"aten::geqrf", &geqrf},
      {"aten::ormqr", &ormqr},
      {"aten::cholesky_solve", &cholesky_solve},
      {"aten::linalg_householder_product", &linalg_householder_product},
      {"aten::_linalg_eigh", &linalg_eigh},
      {"aten::_linalg_svd", &linalg_svd},
      {"aten::lu_unpack", &lu_unpack},
      {"aten::linalg_lu", &linalg_lu},
      {"aten::linalg_ldl_factor_ex", &linalg_ldl_factor_ex},
      {"aten::linalg_inv_ex", &linalg_inv_ex},
      {"aten::_linalg_slogdet", &linalg_slogdet},
      {"aten::histc", &histc},
      {"aten::linalg_lu_solve", &linalg_lu_solve},
      {"aten::max_unpool2d", &max_unpool},
      {"aten::max_unpool3d", &max_unpool},
      {"aten::binary_cross_entropy", &reduced_loss},
      {"aten::binary_cross_entropy_backward", &loss_backward_mean},
      {"aten::mse_loss", &reduced_pointwise_loss},
      {"aten::smooth_l1_loss", &reduced_pointwise_loss},
      {"aten::huber_loss", &reduced_pointwise_loss},
      {"aten::_scaled_dot_product_flash_attention_for_cpu", &cpu_flash_attention},
      {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", &cpu_flash_attention_backward},
      {"aten::_softmax", &softmax},
      {"aten::_log_softmax", &softmax},
      {"aten::_softmax_backward_data", &softmax_backward},
      {"aten::_log_softmax_backward_data", &softmax_backward},
      {"aten::avg_pool2d_backward", &gradient_in_input_layout},
      {"aten::avg_pool3d_backward", &gradient_in_input_layout},
      {"aten::_adaptive_avg_pool2d_backward", &gradient_in_input_layout},
      {"aten::_adaptive_avg_pool3d_backward", &gradient_in_input_layout},
      {"aten::adaptive_max_pool2d_backward", &gradient_in_input_layout},
      {"aten::adaptive_max_pool3d_backward", &gradient_in_input_layout},
      {"aten::fractional_max_pool2d_backward", &gradient_in_input_layout},
      {"aten::fractional_max_pool3d_backward", &gradient_in_input_layout},
      {"aten::reflection_pad1d_backward", &gradient_in_input_layout},
      {"aten::reflection_pad2d_backward", &gradient_in_input_layout},
      {"aten::reflection_pad3d_backward", &gradient_in_input_layout},
      {"aten::replication_pad1d_backward", &gradient_in_input_layout},
      {"aten::replication_pad2d_backward", &gradient_in_input_layout},
      {"aten::replication_pad3d_backward", &gradient_in_input_layout},
      {"aten::_upsample_bilinear2d_aa", &antialiased_upsample<2>},
      {"aten::_upsample_bicubic2d_aa", &antialiased_upsample<4>},
      {"aten::_upsample_bilinear2d_aa_backward", &contiguous_first},
      {"aten::_upsample_bicubic2d_aa_backward", &contiguous_first},
      {"aten::upsample_nearest1d.vec", &upsample<1>},
      {"aten::upsample_nearest2d.vec", &upsample<1>},
      {"aten::upsample_nearest3d.vec", &upsample<1>},
      {"aten::_upsample_nearest_exact1d.vec", &upsample<1>},
      {"aten::_upsample_nearest_exact2d.vec", &upsample<1>},
      {"aten::_upsample_nearest_exact3d.vec", &upsample<1>},
      {"aten::upsample_linear1d.vec", &upsample<2>},
      {"aten::upsample_bilinear2d.vec", &upsample<2>},
      {"aten::upsample_trilinear3d.vec", &upsample<2>},
      {"aten::upsample_bicubic2d.vec", &upsample<4>},
      {"aten::upsample_nearest1d", &upsample<1>},
      {"aten::upsample_nearest2d", &upsample<1>},
      {"aten::upsample_nearest3d", &upsample<1>},
      {"aten::_upsample_nearest_exact1d", &upsample<1>},
      {"aten::_upsample_nearest_exact2d", &upsample<1>},
      {"aten::_upsample_nearest_exact3d", &upsample<1>},
      {"aten::upsample_linear1d", &upsample<2>},
      {"aten::upsample_bilinear2d", &upsample<2>},
      {"aten::upsample_trilinear3d", &upsample<2>},
      {"aten::upsample_bicubic2d", &upsample<4>},
      {"aten::upsample_nearest1d_backward", &contiguous_first},
      {"aten::upsample_nearest2d_backward", &contiguous_first},
      {"aten::upsample_nearest3d_backward", &contiguous_first},
      {"aten::upsample_linear1d_backward", &contiguous_first},
      {"aten::upsample_bilinear2d_backward", &contiguous_first},
      {"aten::upsample_trilinear3d_backward", &contiguous_first},
      {"aten::upsample_bicubic2d_backward", &contiguous_first},
      {"aten::_upsample_nearest_exact1d_backward", &contiguous_first},
      {"aten::_upsample_nearest_exact2d_backward", &contiguous_first},
      {"aten::_upsample_nearest_exact3d_backward", &contiguous_first},
      {"aten::_ctc_loss_backward", &ctc_loss_backward},
      {"aten::_ctc_loss_backward.Tensor", &ctc_loss_backward},
      {"aten::_embedding_bag_dense_backward", &embedding_bag_dense_backward},
      {"aten::_embedding_bag_per_sample_weights_backward", &embedding_bag_per_sample_weights_backward},
      {"aten::multilabel_margin_loss_forward", &multilabel_margin_loss},
      {"aten::multilabel_margin_loss_backward", &multilabel_margin_loss},
      // pow with a Scalar exponent captures it; a Scalar base is wrapped.
      {"aten::pow.Scalar", &elementwise<0, 2, Promotion::Common>},
      {"aten::pow.Tensor_Tensor", &elementwise<0, 2, Promotion::Common>},
      {"aten::pow_.Tensor", &elementwise<0, 2, Promotion::Common>},
      {"aten::mm", &mm},
      {"aten::addmm", &addmm},
      {"aten::addmm_", &addmm},
      {"aten::bmm", &bmm},
      {"aten::baddbmm", &baddbmm},
      {"aten::baddbmm_", &baddbmm},
  };
  const auto it = models.find(qualified_name);
  if (it != models.end()) return it->second;
  return elementwise_model(qualified_name.substr(0, qualified_name.find('.')));
}

}  // namespace metamem
