#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace metamem {

// Registers Meta kernels for ops libtorch's C++ Meta backend lacks (their
// meta functions live in Python's torch/_meta_registrations.py).
void register_missing_meta_kernels();

// Runs `op` on the meta tensors of `stack` with metamem's own kernel where
// the Meta kernel libtorch registers (often a Python one) lays its outputs
// out unlike the native CPU and CUDA kernels do; false where there is none.
bool call_native_layout_kernel(const c10::OperatorHandle& op, torch::jit::Stack& stack);

}  // namespace metamem
