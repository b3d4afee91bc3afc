// What CUDA's embedding lookup and its gradient hold beside their outputs,
// in their order. Recorded from real torch 2.14.1 on the fake GPU (a BERT's
// token type embedding, whose ids are an expanded buffer).
#include <ATen/ATen.h>
#include <ATen/TensorUtils.h>

#include "meta/CudaKernelPlans.h"

namespace metamem {
namespace {

// aten::embedding(weight, indices, padding_idx, scale_grad_by_freq,
// sparse): weight.index_select(0, indices.reshape(-1)), whose reshape
// copies ids it cannot view flat before the output exists.
ScratchPlan embedding_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& indices = arguments[1].toTensor();
  ScratchPlan plan;
  const std::int64_t flat[] = {indices.numel()};
  const bool viewed_flat =
      indices.dim() <= 1 || at::detail::computeStride(indices.sizes(), indices.strides(), at::IntArrayRef(flat));
  plan.make(viewed_flat ? 0 : static_cast<std::int64_t>(indices.numel() * indices.element_size()));
  plan.before_outputs = plan.steps.size();
  return plan;
}

// aten::embedding_dense_backward(grad_output, indices, num_weights,
// padding_idx, scale_grad_by_freq): the ids, then the gradient, made
// contiguous before the weight's gradient. Past 3,072 ids, or scaled by
// frequency, CUDA then sorts them and sizes further buffers by how many
// are distinct, which it reads back from the GPU: not modelled.
ScratchPlan embedding_backward_plan(c10::ArrayRef<c10::IValue> arguments) {
  ScratchPlan plan;
  plan.make(copy_unless_contiguous(arguments[1].toTensor()));
  plan.make(copy_unless_contiguous(arguments[0].toTensor()));
  plan.before_outputs = plan.steps.size();
  return plan;
}

}  // namespace

ScratchPlanModel cuda_embedding_plan_model(const std::string& qualified_name) {
  if (qualified_name == "aten::embedding") return &embedding_plan;
  return qualified_name == "aten::embedding_dense_backward" ? &embedding_backward_plan : nullptr;
}

}  // namespace metamem
