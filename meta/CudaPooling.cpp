// What CUDA's max pooling and its gradient hold beside their outputs, in
// their order. Recorded from real torch 2.14.1 on the fake GPU (SAM2's
// Hiera pools its queries, a channels-last view with gaps between pixels;
// fractional max pooling's gradient, 2026-12-04).
#include <ATen/ATen.h>

#include "meta/CudaKernelPlans.h"

namespace metamem {
namespace {

// aten::max_pool2d_with_indices(input, kernel_size, stride, padding,
// dilation, ceil_mode): the input made contiguous in the format it
// suggests, after the output and indices.
ScratchPlan max_pool2d_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& input = arguments[0].toTensor();
  ScratchPlan plan;
  plan.make(copy_unless_contiguous(input, input.suggest_memory_format()));
  return plan;
}

// aten::max_pool2d_with_indices_backward(grad_output, input, kernel_size,
// stride, padding, dilation, ceil_mode, indices): after the input's
// gradient, the input, the output's gradient and the indices made
// contiguous in the format the input suggests.
ScratchPlan max_pool2d_backward_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor &grad_output = arguments[0].toTensor(), &input = arguments[1].toTensor();
  const at::MemoryFormat format = input.suggest_memory_format();
  ScratchPlan plan;
  plan.make(copy_unless_contiguous(input, format));
  plan.make(copy_unless_contiguous(grad_output, format));
  plan.make(copy_unless_contiguous(arguments[7].toTensor(), format));
  return plan;
}

// aten::fractional_max_pool2d_backward(grad_output, input, kernel_size,
// output_size, indices): the output's gradient made contiguous (a copy of a
// broadcast one) before the input's gradient, which the kernel sizes after
// it (resize_as_). The 3-d kernel reads it as it is.
ScratchPlan fractional_max_pool2d_backward_plan(c10::ArrayRef<c10::IValue> arguments) {
  ScratchPlan plan;
  plan.make(copy_unless_contiguous(arguments[0].toTensor()));
  plan.before_outputs = 1;
  return plan;
}

}  // namespace

ScratchPlanModel cuda_pooling_plan_model(const std::string& qualified_name) {
  if (qualified_name == "aten::max_pool2d_with_indices") return &max_pool2d_plan;
  if (qualified_name == "aten::fractional_max_pool2d_backward") return &fractional_max_pool2d_backward_plan;
  return qualified_name == "aten::max_pool2d_with_indices_backward" ? &max_pool2d_backward_plan : nullptr;
}

}  // namespace metamem
