// What CUDA's roll holds beside its output, in its order. Recorded from
// real torch 2.14.1 on the fake GPU (Swin's shifted windows roll over two
// dimensions).
#include <ATen/ATen.h>

#include "meta/CudaKernelPlans.h"

namespace metamem {
namespace {

// aten::roll(self, shifts, dims): over one dimension the kernel reads its
// input contiguous, copied before the output; over none, the input is
// flattened (the same copy) and rolled as one; over several, roll_common
// rolls one dimension at a time, each intermediate made before the output
// and kept until the op returns, the input's copy freed after the first.
ScratchPlan roll_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& self = arguments[0].toTensor();
  const std::size_t dims = arguments[2].toIntVector().size();
  ScratchPlan plan;
  const std::size_t copy = plan.make(copy_unless_contiguous(self));
  for (std::size_t d = 1; d < dims; ++d) {
    plan.make(static_cast<std::int64_t>(self.numel() * self.element_size()));
    if (d == 1) plan.free(copy);
  }
  plan.before_outputs = plan.steps.size();
  return plan;
}

}  // namespace

ScratchPlanModel cuda_roll_plan_model(const std::string& qualified_name) {
  return qualified_name == "aten::roll" ? &roll_plan : nullptr;
}

}  // namespace metamem
