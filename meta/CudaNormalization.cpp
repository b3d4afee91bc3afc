// What CUDA's layer norm, group norm, batch norm and softmax kernels
// (layer_norm_kernel.cu, group_norm_kernel.cu, Normalization.cu, SoftMax.cu)
// hold beside their outputs, in their order.
// Recorded from real torch 2.14.1 on the fake GPU; test_cuda_kernels.py
// checks traces against it allocation by allocation.
#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <vector>

#include "meta/CudaAttention.h"
#include "meta/CudaKernelPlans.h"
#include "meta/CudaReduction.h"
#include "meta/MetaMode.h"
#include "meta/TensorBytes.h"

namespace metamem {
namespace {

bool defined(const c10::IValue& value) { return value.isTensor() && value.toTensor().defined(); }

// ---- layer norm ------------------------------------------------------------

// aten::native_layer_norm(input, normalized_shape, weight, bias, eps) and
// aten::_fused_rms_norm(input, normalized_shape, weight, eps): the kernel
// reads the input contiguous, copied before the outputs exist.
ScratchPlan layer_norm_plan(c10::ArrayRef<c10::IValue> arguments) {
  ScratchPlan plan;
  plan.make(copy_unless_contiguous(arguments[0].toTensor()));
  plan.before_outputs = plan.steps.size();
  return plan;
}

// The weight's and bias's gradients of a layer norm over `rows` rows of
// `columns`: a grid of many rows (more than 65,536) over few columns (a
// 32-column block per multiprocessor for at most half of them) sums each
// block of 32 rows into a (blocks, columns) buffer in the parameter's dtype
// first. The number of such blocks, or 0 where the grid is not split.
std::int64_t split_row_blocks(std::int64_t rows, std::int64_t columns) {
  constexpr std::int64_t kBlockWidth = 32, kRowsPerBlock = 32, kMaxGrid = 64 * 1024 / 2;
  if (rows <= 64 * 1024 || columns / kBlockWidth >= traced_gpu().multi_processor_count / 2) return 0;
  const std::int64_t blocks_x = div_up(columns, kBlockWidth);
  return std::min(kMaxGrid / blocks_x, div_up(rows, kRowsPerBlock));
}

// Then .sum(0) of that buffer: a new gradient (which replaces the output,
// freed there: the piece stands for it) and the sum's staging.
void sum_row_blocks(ScratchPlan& plan, const at::Tensor& parameter, std::int64_t blocks) {
  const std::int64_t columns = parameter.numel();
  ReductionStaging staging;
  {
    OutsideMetaMode outside;
    const auto options = parameter.options().device(c10::kMeta);
    staging = cuda_reduction_staging(CudaReduction::Sum, at::empty({blocks, columns}, options), at::empty({columns}, options),
                               at::IntArrayRef{0}, false);
  }
  const std::size_t sum = plan.make(columns * element_size(parameter));
  add_staging(plan, staging);
  plan.free(sum);
}

// A layer norm's or an RMS norm's backward over `normalized` trailing
// dimensions: the input read contiguous (copied before the outputs), the
// output's gradient made contiguous after them, then the block sums of
// the `parameters` whose gradients are asked for, where the grid splits,
// freed as the kernel returns.
ScratchPlan norm_backward_plan(const at::Tensor& grad_out, const at::Tensor& input, std::size_t normalized,
                               const std::vector<at::Tensor>& parameters) {
  const auto axis = input.dim() - static_cast<std::int64_t>(normalized);
  std::int64_t rows = 1, columns = 1;
  for (std::int64_t d = 0; d < input.dim(); ++d) (d < axis ? rows : columns) *= input.size(d);
  ScratchPlan plan;
  plan.make(copy_unless_contiguous(input));
  plan.before_outputs = plan.steps.size();
  plan.make(copy_unless_contiguous(grad_out));
  const std::int64_t blocks = split_row_blocks(rows, columns);
  if (blocks == 0) return plan;
  for (const at::Tensor& parameter : parameters) plan.make(blocks * columns * element_size(parameter));
  for (const at::Tensor& parameter : parameters) sum_row_blocks(plan, parameter, blocks);
  return plan;
}

// aten::native_layer_norm_backward(grad_out, input, normalized_shape, mean,
// rstd, weight, bias, output_mask).
ScratchPlan layer_norm_backward_plan(c10::ArrayRef<c10::IValue> arguments) {
  const auto mask = arguments[7].toBoolList();
  std::vector<at::Tensor> parameters;
  for (int i : {1, 2})
    if (mask.get(i) && defined(arguments[4 + i])) parameters.push_back(arguments[4 + i].toTensor());
  return norm_backward_plan(arguments[0].toTensor(), arguments[1].toTensor(), arguments[2].toDimVector().size(),
                            parameters);
}

// aten::_fused_rms_norm_backward(grad_out, input, normalized_shape, rstd,
// weight, output_mask): layer norm's kernels without a mean or a bias.
ScratchPlan rms_norm_backward_plan(c10::ArrayRef<c10::IValue> arguments) {
  std::vector<at::Tensor> parameters;
  if (arguments[5].toBoolList().get(1) && defined(arguments[4])) parameters.push_back(arguments[4].toTensor());
  return norm_backward_plan(arguments[0].toTensor(), arguments[1].toTensor(), arguments[2].toDimVector().size(),
                            parameters);
}

// ---- group norm ------------------------------------------------------------

bool sixteen_bit(const at::Tensor& input) {
  return input.scalar_type() == at::kHalf || input.scalar_type() == at::kBFloat16;
}

std::int64_t accumulator_size(const at::Tensor& input) {
  return sixteen_bit(input) ? 4 : static_cast<std::int64_t>(input.element_size());
}

// aten::native_group_norm(input, weight, bias, N, C, HxW, group, eps).
// After the outputs (contiguous), an input that is not contiguous (a cuDNN
// convolution's channels-last output) copied contiguous, freed last. 16-bit
// inputs: the statistics in fp32 first, copied into the outputs last. With
// an affine transform over more than one element per channel: its per
// (sample, channel) scale and shift. (Recorded from real torch 2.14.1 on
// the fake GPU.)
ScratchPlan group_norm_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& input = arguments[0].toTensor();
  const bool affine = defined(arguments[1]) || defined(arguments[2]);
  const std::int64_t samples = arguments[3].toInt(), channels = arguments[4].toInt();
  const std::int64_t per_channel = arguments[5].toInt(), groups = arguments[6].toInt();
  const std::int64_t acc = accumulator_size(input);
  ScratchPlan plan;
  plan.make(copy_unless_contiguous(input));
  if (sixteen_bit(input)) {
    plan.make(samples * groups * 4);
    plan.make(samples * groups * 4);
  }
  if (affine && per_channel != 1) {
    const std::size_t scale = plan.make(samples * channels * acc), shift = plan.make(samples * channels * acc);
    plan.free(shift);
    plan.free(scale);
  }
  return plan;
}

// aten::native_group_norm_backward(grad_out, input, mean, rstd, weight, N,
// C, HxW, group, output_mask). One element per channel: two per (sample,
// group) coefficients for the input's gradient. Otherwise the per (sample,
// channel) sums of the gradient and of its product with the input, then
// for the input's gradient three coefficients (torch's c2 and c3 per
// (sample, group), and with a weight c1, rstd times the weight per
// (sample, channel)), freed before the sums. Before the gradients, the
// output's gradient and the input each copied contiguous where they are
// not, freed last.
ScratchPlan group_norm_backward_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& input = arguments[1].toTensor();
  const bool weight = defined(arguments[4]);
  const std::int64_t samples = arguments[5].toInt(), channels = arguments[6].toInt();
  const std::int64_t per_channel = arguments[7].toInt(), groups = arguments[8].toInt();
  const bool input_gradient = arguments[9].toBoolList().get(0);
  const std::int64_t acc = accumulator_size(input);
  ScratchPlan plan;
  plan.make(copy_unless_contiguous(arguments[0].toTensor()));
  plan.make(copy_unless_contiguous(input));
  plan.before_outputs = plan.steps.size();
  if (per_channel == 1) {
    if (input_gradient) {
      plan.make(samples * groups * acc);
      plan.make(samples * groups * acc);
    }
    return plan;
  }
  plan.make(samples * channels * acc);  // the sums, freed as the kernel returns
  plan.make(samples * channels * acc);
  if (input_gradient) {
    const std::size_t c2 = plan.make(samples * groups * acc), c3 = plan.make(samples * groups * acc);
    const std::optional<std::size_t> c1 = weight ? std::optional(plan.make(samples * channels * acc)) : std::nullopt;
    plan.free(c3);
    plan.free(c2);
    if (c1) plan.free(*c1);
  }
  return plan;
}

// ---- batch norm ----------------------------------------------------------------

// Normalization.cuh's launch shape for the channels-last kernels.
struct ChannelsLastGrid {
  std::int64_t x, y;
};

// flexible_launch_configs(reduction, stride, block, grid, coop_flag=true).
ChannelsLastGrid channels_last_grid(std::int64_t reduction, std::int64_t stride) {
  constexpr std::int64_t kMaxBlock = 512, kPerThread = 16, kTileW = 32, kMaxHBlock = 128;
  std::int64_t block_x = std::min(last_pow2(stride), kTileW);
  const std::int64_t block_y =
      std::min(last_pow2(div_up(reduction, kPerThread)), kMaxBlock / block_x);
  if (block_x * block_y != kMaxBlock) block_x = std::min(last_pow2(stride), kMaxBlock / block_y);
  const std::int64_t grid_y =
      std::min(div_up(reduction, block_y * kPerThread), kMaxHBlock);
  return {div_up(stride, block_x), grid_y < 8 ? 1 : grid_y};
}

// The staging buffer (`per_channel` accumulators per channel and block row)
// and semaphores of a channels-last reduction split across blocks.
void add_channels_last_staging(ScratchPlan& plan, const at::Tensor& input, std::int64_t per_channel,
                               std::int64_t accumulator) {
  const std::int64_t channels = input.size(1);
  if (input.numel() == 0) return;
  const ChannelsLastGrid grid = channels_last_grid(input.numel() / channels, channels);
  if (grid.y <= 1) return;
  const std::size_t staging = plan.make(per_channel * channels * grid.y * accumulator);
  const std::size_t semaphores = plan.make(grid.x * 4);
  plan.free(semaphores);
  plan.free(staging);
}

// The statistics' reduction over a channels-last input stages four
// accumulators per channel and block row after the outputs (the mean and
// inverse deviation).
void add_statistics_staging(ScratchPlan& plan, const at::Tensor& input) {
  if (input.dim() > 1 && input.numel() > 0 && batch_norm_uses_channels_last_kernels(input))
    add_channels_last_staging(plan, input, 4, c10::elementSize(at::toAccumulateType(input.scalar_type(), true)));
}

// aten::native_batch_norm(input, weight, bias, running_mean, running_var,
// training, momentum, eps): in training, the statistics' staging.
ScratchPlan batch_norm_plan(c10::ArrayRef<c10::IValue> arguments) {
  ScratchPlan plan;
  if (arguments[5].toBool()) add_statistics_staging(plan, arguments[0].toTensor());
  return plan;
}

// aten::batch_norm_stats(input, eps) (SyncBatchNorm's): native_batch_norm's
// statistics.
ScratchPlan batch_norm_stats_plan(c10::ArrayRef<c10::IValue> arguments) {
  ScratchPlan plan;
  add_statistics_staging(plan, arguments[0].toTensor());
  return plan;
}

// aten::batch_norm_backward_reduce(grad_out, input, mean, invstd, weight,
// input_g, weight_g, bias_g) (SyncBatchNorm's): after its outputs, the
// channels-last reduction's staging, as native_batch_norm_backward's.
ScratchPlan batch_norm_backward_reduce_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor &input = arguments[1].toTensor(), &mean = arguments[2].toTensor();
  ScratchPlan plan;
  if (batch_norm_backward_reduce_is_channels_last(arguments[0].toTensor(), input, mean, arguments[3].toTensor(),
                                                  arguments[4].toOptional<at::Tensor>()))
    add_channels_last_staging(plan, input, 2, mean.element_size());
  return plan;
}

// aten::native_batch_norm_backward(grad_out, input, weight, running_mean,
// running_var, save_mean, save_invstd, train, eps, output_mask). Over a
// channels-last input (a 2-d [N, C] one too: the heads of IFormer and
// LeViT), CUDA reduces first, into sum_dy and sum_dy_xmu of the saved
// statistics' dtype (float for a half or bf16 input: measured against real
// torch on the fake GPU, bf16 and f16 inputs with parameters of their own
// dtype or f32), then the weight's and bias's gradients (made whether
// asked for or not), with a staging buffer and semaphores where a
// channels-last reduction splits across blocks; then the input's gradient
// elementwise. Other inputs take the fused kernel, which makes only the
// gradients. In evaluation (running statistics, cast to the accumulation
// type first) not modelled.
ScratchPlan batch_norm_backward_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor &grad_out = arguments[0].toTensor(), &input = arguments[1].toTensor();
  const auto mask = arguments[9].toBoolList();
  ScratchPlan plan;
  if (!defined(arguments[5]) || !arguments[7].toBool() || input.dim() < 2 ||
      !batch_norm_uses_channels_last_kernels(input))
    return plan;
  const at::Tensor& mean = arguments[5].toTensor();
  const std::int64_t channels = input.size(1), statistics = channels * mean.element_size();
  plan.make(statistics);  // sum_dy
  plan.make(statistics);  // sum_dy_xmu
  const std::int64_t parameter = defined(arguments[2]) ? channels * arguments[2].toTensor().element_size() : 0;
  for (std::size_t r : {1, 2}) {
    if (mask.get(r)) {
      plan.output(r);
    } else {
      plan.make(parameter);
    }
  }
  // Only the channels-last reduction stages: an output gradient in
  // another layout (a sum's expanded ones) takes the plain one.
  if (batch_norm_uses_channels_last_kernels(grad_out)) add_channels_last_staging(plan, input, 2, mean.element_size());
  if (mask.get(0)) plan.output(0);
  return plan;
}

// ---- softmax -----------------------------------------------------------------

// aten::_softmax_backward_data(grad_output, output, dim, input_dtype):
// softmax_backward_cuda_out first multiplies the gradient by the output
// into a temporary, then reads it and the output contiguous. The
// temporary takes the operands' promoted type and the gradient's layout
// where that is dense (contiguous for a broadcast gradient, a sum's), and
// is copied again if that is not contiguous (CoaT's keys, softmaxed over
// their tokens). Measured against real torch on the fake GPU: 512 MiB for
// 2 x 16 x 2048 x 2048 f32 scores, the math attention's backward.
ScratchPlan softmax_backward_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor &grad = arguments[0].toTensor(), &output = arguments[1].toTensor();
  const std::int64_t product =
      grad.numel() * static_cast<std::int64_t>(c10::elementSize(c10::promoteTypes(grad.scalar_type(), output.scalar_type())));
  ScratchPlan plan;
  plan.make(product);
  plan.make(grad.is_non_overlapping_and_dense() && !grad.is_contiguous() ? product : 0);
  plan.make(copy_unless_contiguous(output));
  return plan;
}

// aten::_log_softmax_backward_data(grad_output, output, dim, input_dtype):
// no temporary; the gradient and the output read contiguous.
ScratchPlan log_softmax_backward_plan(c10::ArrayRef<c10::IValue> arguments) {
  ScratchPlan plan;
  plan.make(copy_unless_contiguous(arguments[0].toTensor()));
  plan.make(copy_unless_contiguous(arguments[1].toTensor()));
  return plan;
}

}  // namespace

bool batch_norm_uses_channels_last_kernels(const at::Tensor& t) {
  return t.is_contiguous(at::MemoryFormat::ChannelsLast) || t.is_contiguous(at::MemoryFormat::ChannelsLast3d) ||
         (t.is_contiguous() && t.dim() > 1 && t.stride(1) == 1);
}

bool batch_norm_backward_reduce_is_channels_last(const at::Tensor& grad_out, const at::Tensor& input,
                                                 const at::Tensor& mean, const at::Tensor& invstd,
                                                 const c10::optional<at::Tensor>& weight) {
  return input.dim() > 1 && batch_norm_uses_channels_last_kernels(grad_out) &&
         batch_norm_uses_channels_last_kernels(input) && (!weight || !weight->defined() || weight->is_contiguous()) &&
         mean.is_contiguous() && invstd.is_contiguous();
}

ScratchPlanModel cuda_normalization_plan_model(const std::string& qualified_name) {
  static const std::unordered_map<std::string, ScratchPlanModel> models = {
      {"aten::native_layer_norm", &layer_norm_plan},
      {"aten::native_layer_norm_backward", &layer_norm_backward_plan},
      {"aten::_fused_rms_norm", &layer_norm_plan},
      {"aten::_fused_rms_norm_backward", &rms_norm_backward_plan},
      {"aten::native_group_norm", &group_norm_plan},
      {"aten::native_group_norm_backward", &group_norm_backward_plan},
      {"aten::_softmax_backward_data", &softmax_backward_plan},
      {"aten::_log_softmax_backward_data", &log_softmax_backward_plan},
      {"aten::native_batch_norm", &batch_norm_plan},
      {"aten::native_batch_norm_backward", &batch_norm_backward_plan},
      {"aten::batch_norm_stats", &batch_norm_stats_plan},
      {"aten::batch_norm_backward_reduce", &batch_norm_backward_reduce_plan},
  };
  const auto it = models.find(qualified_name);
  return it == models.end() ? nullptr : it->second;
}

}  // namespace metamem
