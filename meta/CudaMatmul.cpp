// What CUDA's matrix products hold beside their outputs, in their order:
// the operands cuBLAS cannot take as they are, copied after the output and
// before the first cuBLAS call (which may make cuBLAS's workspace).
// Recorded from real torch 2.14.1 on the fake GPU (CSATv2 multiplies two
// columns of a fused projection).
#include <ATen/ATen.h>

#include <algorithm>

#include "meta/CudaKernelPlans.h"

namespace metamem {
namespace {

// prepare_matrix_for_cublas: a matrix dense in some order, or with one
// dimension contiguous and the other's stride at least the leading
// dimension, goes as it is; anything else is cloned contiguous.
std::int64_t cublas_copy(const at::Tensor& matrix) {
  // A matrix of another rank is left to the product's own check.
  if (matrix.dim() != 2 || matrix.is_non_overlapping_and_dense()) return 0;
  const auto sizes = matrix.sizes(), strides = matrix.strides();
  if (strides[0] == 1 && strides[1] >= std::max<std::int64_t>(1, sizes[0])) return 0;
  if (strides[1] == 1 && strides[0] >= std::max<std::int64_t>(1, sizes[1])) return 0;
  return static_cast<std::int64_t>(matrix.numel() * matrix.element_size());
}

// cublasCommonArgs prepares the (new, contiguous) result first, which
// transposes the product: the second operand is prepared before the first.
template <int kFirst>
ScratchPlan product_plan(c10::ArrayRef<c10::IValue> arguments) {
  ScratchPlan plan;
  plan.make(cublas_copy(arguments[kFirst + 1].toTensor()));
  plan.make(cublas_copy(arguments[kFirst].toTensor()));
  plan.cublas_call();
  return plan;
}

}  // namespace

ScratchPlanModel cuda_matmul_plan_model(const std::string& qualified_name) {
  if (qualified_name == "aten::mm") return &product_plan<0>;
  if (qualified_name == "aten::addmm" || qualified_name == "aten::_addmm_activation") return &product_plan<1>;
  return nullptr;
}

}  // namespace metamem
