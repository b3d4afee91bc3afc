// The tensors an op's argument holds, for the kernels that look at each.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

namespace metamem {

// Calls `f` on each tensor an op argument holds: a tensor, a tensor list,
// or a list of optional tensors (index's).
template <class F>
void for_each_tensor(const c10::IValue& value, F&& f) {
  if (value.isTensor()) {
    f(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorList()) f(t);
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toListRef())
      if (element.isTensor()) f(element.toTensor());
  }
}

}  // namespace metamem
