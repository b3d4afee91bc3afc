// The CPU kernel model (CpuKernelModel.h) of the kernels of layers:
// convolutions, normalization, softmax, pooling and padding gradients,
// upsampling, embeddings, losses and flash attention.
#include "meta/CpuKernelModel.h"

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Reduction.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "meta/TensorBytes.h"

namespace metamem {
namespace {

using Args = c10::ArrayRef<c10::IValue>;

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

// The 3-d kernels run contiguous: a channels-last weight is copied so.
std::int64_t channels_last_weight_copy(const at::Tensor& input, const at::Tensor& weight,
                                       at::IntArrayRef dilation) {
  if (input.dim() == 5) return copy_unless_contiguous(weight);
  return runs_channels_last(input, dilation) ? copy_unless_contiguous(weight, at::MemoryFormat::ChannelsLast) : 0;
}

// Before anything else the native paths make the input contiguous in the
// format they run in, a copy that lives until the op returns: a view with
// gaps, or one whose layout is neither format (a split of a transposed
// tensor, as CoaT's relative position encoding convolves, or a
// channels-last 3-d input, which slow_conv3d copies itself).
std::int64_t backend_input_copy(const at::Tensor& input, at::IntArrayRef dilation) {
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
  if (groups == 1 || all_groups_at_once(input, dilation)) return columns + copies;
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
    // columns. Each pass copies the output gradient contiguous anew, and
    // the tensor it multiplies by (a channels-last one).
    const std::int64_t later_gradients =
        (mask[1] ? bytes_of(weight) : 0) + (mask[2] ? weight.size(0) * element_size(weight) : 0);
    const std::int64_t input_pass = mask[0] ? grad_output_copy + copy_unless_contiguous(weight) +
                                                  (columns != 0 ? columns : bytes_of(input)) - later_gradients
                                            : 0;
    const std::int64_t weight_pass = mask[1] ? grad_output_copy + copy_unless_contiguous(input) + columns : 0;
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

// The dense embedding gradient reads a contiguous gradient and indices (on
// CUDA as well: meta/CudaEmbedding.cpp).
std::int64_t embedding_dense_backward(Args args, Args) {
  return copy_unless_contiguous(args[0].toTensor()) + copy_unless_contiguous(args[1].toTensor());
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

}  // namespace

ScratchModel cpu_layer_scratch_model(const std::string& qualified_name) {
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
      {"aten::embedding_dense_backward", &embedding_dense_backward},
      {"aten::channel_shuffle", &dense_first},
      {"aten::native_channel_shuffle", &dense_first},
      {"aten::max_pool2d_with_indices_backward", &max_pool_backward},
      {"aten::max_pool3d_with_indices_backward", &max_pool_backward},
      {"aten::pixel_shuffle", &pixel_shuffle},
      {"aten::pixel_unshuffle", &pixel_shuffle},
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
      {"aten::_ctc_loss_backward", &ctc_loss_backward},
      {"aten::_ctc_loss_backward.Tensor", &ctc_loss_backward},
      {"aten::_embedding_bag_dense_backward", &embedding_bag_dense_backward},
      {"aten::_embedding_bag_per_sample_weights_backward", &embedding_bag_per_sample_weights_backward},
      {"aten::multilabel_margin_loss_forward", &multilabel_margin_loss},
      {"aten::multilabel_margin_loss_backward", &multilabel_margin_loss},
  };
  const auto it = models.find(qualified_name);
  return it == models.end() ? nullptr : it->second;
}

// arange makes its result empty, then resizes it to its length.
std::int64_t arange(Args, Args returns) { return deterministic_resize_fill(returns[0].toTensor()); }

// CUDA's upsampling, average and adaptive pooling and reflection padding
// backward kernels read the output's gradient contiguous: a copy, after
// the input's gradient, where it is a broadcast (the gradient of a sum or
// mean of their output). Strided gradients of a dense layout are copied or
// not by each kernel's memory format: not modelled.
std::int64_t broadcast_gradient_copy(Args args, Args) {
  const at::Tensor& grad = args[0].toTensor();
  return grad.is_non_overlapping_and_dense() ? 0 : bytes_of(grad);
}

ScratchModel cuda_native_scratch_model(const std::string& qualified_name) {
  static const std::unordered_set<std::string> reading_gradient_contiguous = {
      "aten::upsample_nearest1d_backward",         "aten::upsample_nearest2d_backward",
      "aten::upsample_nearest3d_backward",         "aten::_upsample_nearest_exact1d_backward",
      "aten::_upsample_nearest_exact2d_backward",  "aten::_upsample_nearest_exact3d_backward",
      "aten::upsample_linear1d_backward",          "aten::upsample_bilinear2d_backward",
      "aten::upsample_bicubic2d_backward",         "aten::upsample_trilinear3d_backward",
      "aten::_upsample_bilinear2d_aa_backward",    "aten::_upsample_bicubic2d_aa_backward",
      "aten::avg_pool2d_backward",                 "aten::avg_pool3d_backward",
      "aten::max_pool3d_with_indices_backward",    "aten::adaptive_max_pool2d_backward",
      "aten::adaptive_max_pool3d_backward",        "aten::_adaptive_avg_pool2d_backward",
      "aten::_adaptive_avg_pool3d_backward",       "aten::reflection_pad1d_backward",
      "aten::reflection_pad2d_backward",           "aten::reflection_pad3d_backward"};
  if (reading_gradient_contiguous.count(qualified_name)) return &broadcast_gradient_copy;
  // host_softmax reads its input contiguous, as the CPU kernel does: a
  // copy of a transposed view (CoaT's keys) beside the output. Their
  // backwards have plans (meta/CudaNormalization.cpp).
  if (qualified_name == "aten::_softmax" || qualified_name == "aten::_log_softmax") return &softmax;
  const bool arange_op = qualified_name == "aten::arange" || qualified_name == "aten::arange.start" ||
                         qualified_name == "aten::arange.start_step";
  return arange_op ? &arange : nullptr;
}

}  // namespace metamem
