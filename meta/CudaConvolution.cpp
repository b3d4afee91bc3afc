// libtorch's own CUDA convolutions, which a fake GPU (no cuDNN) runs as a
// GPU with cuDNN off: what slow_conv2d (ConvolutionMM2d.cu),
// slow_conv_dilated2d (DilatedConvolution.cu) and conv_depthwise2d
// (DepthwiseConv2d.cu) hold beside their outputs, in their order, recorded
// from real torch 2.14.1 on the fake GPU (test_cuda_kernels.py); grouped
// ones run slow_conv2d per group. Dilated grouped, 3-d and transposed ones
// hold no columns in a trace (not modelled), but a 2-d input's contiguous
// copy.
#include <ATen/ATen.h>

#include <algorithm>
#include <optional>

#include "meta/CudaKernelPlans.h"
#include "meta/CudaReduction.h"
#include "meta/MetaMode.h"

namespace metamem {
namespace {

// Grouped2d: slow_conv2d once per group (`_convolution` and
// `convolution_backward` loop over the groups), the groups' results
// concatenated.
enum class Kernel { Slow2d, Grouped2d, Dilated2d, Depthwise2d, Other };

// select_conv_backend's choice for a CUDA GPU without cuDNN.
Kernel kernel_for(const at::Tensor& input, const at::Tensor& weight, bool transposed, at::IntArrayRef dilation,
                  std::int64_t groups) {
  if (transposed || input.dim() != 4 || input.size(0) == 0) return Kernel::Other;
  if (groups > 1 && input.size(1) == groups && weight.size(0) % groups == 0) return Kernel::Depthwise2d;
  const bool dilated = std::any_of(dilation.begin(), dilation.end(), [](std::int64_t d) { return d != 1; });
  if (groups != 1) return dilated ? Kernel::Other : Kernel::Grouped2d;
  return dilated ? Kernel::Dilated2d : Kernel::Slow2d;
}

// A 2-d convolution's stride, padding or dilation, one value per spatial
// dimension: `_convolution` expands one value given for both, as
// conv2d(padding="valid") passes its padding {0} (expand_param_if_needed).
at::DimVector spatial(const c10::IValue& parameter) {
  at::DimVector values = parameter.toDimVector();
  if (values.size() == 1) values.push_back(values[0]);
  return values;
}

// One batch item unfolded: C_in (of a group) x kernel x output pixels.
// slow_conv2d's forward skips it for a 1x1 kernel with unit stride and no
// padding (`forward`); its backward does not.
std::int64_t columns_bytes(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef output_pixels,
                           at::IntArrayRef stride, at::IntArrayRef padding, Kernel kernel, bool forward) {
  bool pointwise = kernel != Kernel::Dilated2d && forward;
  std::int64_t bytes = weight.size(1) * static_cast<std::int64_t>(input.element_size());
  for (int i = 0; i < 2; ++i) {
    bytes *= weight.size(2 + i) * output_pixels[i];
    pointwise = pointwise && weight.size(2 + i) == 1 && stride[i] == 1 && padding[i] == 0;
  }
  return pointwise ? 0 : bytes;
}

// A sum over `dims` of a tensor like `like` laid out as `sizes` and
// `strides` into a bias's gradient of `channels`: a new tensor made and
// freed here unless it is made already, and the sum's staging.
void sum_for_bias(ScratchPlan& plan, const at::Tensor& like, at::IntArrayRef sizes, at::IntArrayRef strides,
                  at::IntArrayRef dims, std::int64_t channels, bool into_output) {
  ReductionStaging staging;
  {
    OutsideMetaMode outside;
    const auto options = like.options().device(c10::kMeta);
    staging = cuda_reduction_staging(CudaReduction::Sum, at::empty_strided(sizes, strides, options),
                                     at::empty({channels}, options), dims, false);
  }
  const std::size_t result = into_output ? 0 : plan.make(channels * static_cast<std::int64_t>(like.element_size()));
  add_staging(plan, staging);
  if (!into_output) plan.free(result);
}

// aten::convolution(input, weight, bias, stride, padding, dilation,
// transposed, output_padding, groups): the operands made contiguous before
// the output, the columns after it (then the products, which may make
// cuBLAS's workspace).
ScratchPlan convolution_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& input = arguments[0].toTensor();
  const at::Tensor& weight = arguments[1].toTensor();
  const auto stride = spatial(arguments[3]), padding = spatial(arguments[4]);
  const auto dilation = spatial(arguments[5]);
  const Kernel kernel = kernel_for(input, weight, arguments[6].toBool(), dilation, arguments[8].toInt());
  ScratchPlan plan;
  if (kernel == Kernel::Other || kernel == Kernel::Depthwise2d) {
    // `_convolution` passes the kernel its input made contiguous: a copy
    // before the output (ConvNeXt's and PVT v2's depthwise convolutions of
    // a permuted view).
    if (!arguments[6].toBool() && input.dim() == 4) plan.make(copy_unless_contiguous(input));
    plan.before_outputs = plan.steps.size();
    return plan;
  }
  plan.make(copy_unless_contiguous(input));
  plan.make(copy_unless_contiguous(weight));
  plan.before_outputs = plan.steps.size();
  at::DimVector pixels;
  for (int i = 0; i < 2; ++i)
    pixels.push_back((input.size(2 + i) + 2 * padding[i] - dilation[i] * (weight.size(2 + i) - 1) - 1) / stride[i] + 1);
  const std::int64_t columns = columns_bytes(input, weight, pixels, stride, padding, kernel, /*forward=*/true);
  if (kernel != Kernel::Grouped2d) {
    plan.make(columns);
    return plan;
  }
  // Per group: its slice of the input made contiguous (a copy unless the
  // batch is one), its output, its columns and products; then the outputs
  // concatenated into the result.
  const std::int64_t groups = arguments[8].toInt(), batch = input.size(0), item = input.element_size();
  const std::int64_t slice = batch == 1 ? 0 : batch * weight.size(1) * input.size(2) * input.size(3) * item;
  const std::int64_t group_output = batch * (weight.size(0) / groups) * pixels[0] * pixels[1] * item;
  c10::SmallVector<std::size_t, 8> outputs;
  for (std::int64_t g = 0; g < groups; ++g) {
    const std::size_t copy = plan.make(slice);
    outputs.push_back(plan.make(group_output));
    const std::size_t unfolded = plan.make(columns);
    if (g == 0) plan.cublas_call();
    plan.free(unfolded);
    plan.free(copy);
  }
  plan.output(0);
  for (std::size_t output : outputs) plan.free(output);
  return plan;
}

// slow_conv2d's backward (of one group, where grouped) for an output
// gradient of `grad_sizes`: the input's gradient, the columns it unfolds
// into and its products; the bias's gradient, summed from the contiguous
// output gradient; the weight's gradient, through columns of its own where
// the input's gradient made none. `gradient(r, bytes)` makes gradient r
// (the input's of `input_bytes`); the first products of the op (`first`)
// may make cuBLAS's workspace.
template <class Gradient>
void slow2d_backward(ScratchPlan& plan, const c10::List<bool>& mask, std::int64_t columns, std::int64_t input_bytes,
                     const at::Tensor& grad_output, at::IntArrayRef grad_sizes, const at::Tensor& weight, bool first,
                     Gradient gradient) {
  const std::int64_t item = grad_output.element_size();
  std::optional<std::size_t> unfolded;
  const auto unfold = [&] {
    unfolded = plan.make(columns);
    if (first) plan.cublas_call();
  };
  if (mask.get(0)) {
    gradient(0, input_bytes);
    unfold();
  }
  if (mask.get(2)) {
    gradient(2, grad_sizes[1] * item);
    sum_for_bias(plan, grad_output, grad_sizes, c10::contiguous_strides(grad_sizes), {0, 2, 3}, grad_sizes[1],
                 /*into_output=*/true);
  }
  if (mask.get(1)) {
    gradient(1, weight.numel() * item);
    if (!mask.get(0)) unfold();
  }
  if (unfolded) plan.free(*unfolded);
}

// convolution_backward(grad_output, input, weight, bias_sizes, stride,
// padding, dilation, transposed, output_padding, groups, output_mask).
ScratchPlan convolution_backward_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& grad_output = arguments[0].toTensor();
  const at::Tensor& input = arguments[1].toTensor();
  const at::Tensor& weight = arguments[2].toTensor();
  const auto stride = spatial(arguments[4]), padding = spatial(arguments[5]);
  const auto mask = arguments[10].toBoolList();
  const Kernel kernel = kernel_for(input, weight, arguments[7].toBool(), spatial(arguments[6]), arguments[9].toInt());
  const at::IntArrayRef pixels = grad_output.sizes().slice(2);
  ScratchPlan plan;
  switch (kernel) {
    case Kernel::Other:
      return plan;
    case Kernel::Depthwise2d:
      // The output's gradient made contiguous for the kernel, which makes
      // the weight's gradient before the input's, from the input made
      // contiguous for it alone (a channel split of CoaT's values); then
      // convolution_backward sums the bias's from the gradient as it came.
      plan.make(copy_unless_contiguous(grad_output));
      plan.before_outputs = plan.steps.size();
      if (mask.get(1)) {
        const std::size_t contiguous_input = plan.make(copy_unless_contiguous(input));
        plan.output(1);
        plan.free(contiguous_input);
      }
      if (mask.get(0)) plan.output(0);
      plan.free(0);
      if (mask.get(2)) {
        plan.output(2);
        sum_for_bias(plan, grad_output, grad_output.sizes(), grad_output.strides(), {0, 2, 3}, grad_output.size(1),
                     /*into_output=*/true);
      }
      return plan;
    case Kernel::Dilated2d:
      // The operands made contiguous, the gradients, the columns and the
      // products; then per batch item the bias's gradient summed into a
      // new tensor and added.
      plan.make(copy_unless_contiguous(input));
      plan.make(copy_unless_contiguous(weight));
      plan.make(copy_unless_contiguous(grad_output));
      plan.before_outputs = plan.steps.size();
      if (mask.get(0) || mask.get(1)) {
        plan.make(columns_bytes(input, weight, pixels, stride, padding, kernel, /*forward=*/false));
        plan.cublas_call();
      }
      if (mask.get(2)) {
        const at::IntArrayRef item = grad_output.sizes().slice(1);
        for (std::int64_t n = 0; n < input.size(0); ++n)
          sum_for_bias(plan, grad_output, item, c10::contiguous_strides(item), {1, 2}, item[0], /*into_output=*/false);
      }
      return plan;
    case Kernel::Slow2d:
    case Kernel::Grouped2d: {
      // The operands made contiguous (ungrouped, the output's gradient
      // too), then slow_conv2d's backward, once per group where grouped.
      plan.make(copy_unless_contiguous(input));
      plan.make(copy_unless_contiguous(weight));
      if (kernel == Kernel::Slow2d) plan.make(copy_unless_contiguous(grad_output));
      plan.before_outputs = plan.steps.size();
      const std::int64_t columns = columns_bytes(input, weight, pixels, stride, padding, kernel, /*forward=*/false);
      if (kernel == Kernel::Slow2d) {
        slow2d_backward(plan, mask, columns, 0, grad_output, grad_output.sizes(), weight, /*first=*/true,
                        [&](std::size_t r, std::int64_t) { plan.output(r); });
        return plan;
      }
      // Per group: its slices of the output's gradient and of the input
      // made contiguous (copies, but of a contiguous batch of one), its
      // gradients, kept until they are concatenated into the results.
      const std::int64_t groups = arguments[9].toInt(), batch = input.size(0), item = input.element_size();
      at::DimVector group_grad(grad_output.sizes().begin(), grad_output.sizes().end());
      group_grad[1] /= groups;
      const std::int64_t grad_slice =
          grad_output.is_contiguous() && batch == 1 ? 0 : c10::multiply_integers(group_grad) * item;
      const std::int64_t input_slice = batch * weight.size(1) * input.size(2) * input.size(3) * item;
      // A group's weight: its output channels (a shape, taken outside the trace).
      at::Tensor group_weight;
      {
        OutsideMetaMode outside;
        group_weight = at::empty({weight.size(0) / groups, weight.size(1), weight.size(2), weight.size(3)},
                                 weight.options().device(c10::kMeta));
      }
      for (std::int64_t g = 0; g < groups; ++g) {
        const std::size_t grad_copy = plan.make(grad_slice), input_copy = plan.make(batch == 1 ? 0 : input_slice);
        slow2d_backward(plan, mask, columns, input_slice, grad_output, group_grad, group_weight, /*first=*/g == 0,
                        [&](std::size_t r, std::int64_t bytes) { plan.make(bytes); });
        plan.free(input_copy);
        plan.free(grad_copy);
      }
      for (std::size_t r = 0; r < 3; ++r)
        if (mask.get(r)) plan.output(r);
      return plan;
    }
  }
  return plan;
}

// aten::im2col(self, kernel_size, dilation, padding, stride), nn.Unfold
// (VOLO's outlook attention): written into empty_like(input), made first,
// then the input read contiguous; resizing to more columns than the input
// holds reallocates, and the first storage goes as the output is made.
ScratchPlan im2col_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& input = arguments[0].toTensor();
  const auto kernel = spatial(arguments[1]), dilation = spatial(arguments[2]);
  const auto padding = spatial(arguments[3]), stride = spatial(arguments[4]);
  ScratchPlan plan;
  // Arguments im2col refuses are left to its own checks, which name them.
  const auto positive = [](at::IntArrayRef values) {
    return values.size() == 2 && std::all_of(values.begin(), values.end(), [](std::int64_t v) { return v > 0; });
  };
  if (input.dim() < 3 || input.numel() == 0 || !positive(kernel) || !positive(dilation) || !positive(stride))
    return plan;
  std::int64_t columns = input.numel() / (input.size(-1) * input.size(-2));  // batch x channels
  for (int i = 0; i < 2; ++i) {
    const std::int64_t size = input.size(input.dim() - 2 + i);
    columns *= kernel[i] * ((size + 2 * padding[i] - (dilation[i] * (kernel[i] - 1) + 1)) / stride[i] + 1);
  }
  const std::int64_t item = input.element_size(), input_bytes = input.numel() * item;
  const bool grows = columns * item > input_bytes;
  const std::size_t first = plan.make(grows ? input_bytes : 0);
  plan.make(copy_unless_contiguous(input));
  plan.before_outputs = plan.steps.size();
  plan.free(first);
  return plan;
}

// aten::col2im(self, output_size, kernel_size, dilation, padding, stride),
// unfold's backward and nn.Fold: written into empty_like(input) (its
// output, which shrinking keeps), then the input read contiguous (an
// expanded gradient is copied).
ScratchPlan col2im_plan(c10::ArrayRef<c10::IValue> arguments) {
  ScratchPlan plan;
  plan.make(copy_unless_contiguous(arguments[0].toTensor()));
  return plan;
}

}  // namespace

ScratchPlanModel cuda_convolution_plan_model(const std::string& qualified_name) {
  if (qualified_name == "aten::convolution") return &convolution_plan;
  if (qualified_name == "aten::im2col") return &im2col_plan;
  if (qualified_name == "aten::col2im") return &col2im_plan;
  return qualified_name == "aten::convolution_backward" ? &convolution_backward_plan : nullptr;
}

}  // namespace metamem
