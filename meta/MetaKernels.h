#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/boxing/KernelFunction.h>

#include <string>

namespace metamem {

// metamem's meta kernels: for ops libtorch's C++ Meta backend lacks (their
// meta functions live in Python's torch/_meta_registrations.py, when Python
// is loaded) and for ops whose Meta kernel lays out its outputs unlike the
// native CPU and CUDA kernels do. The meta layer runs them in place of the
// Meta kernel; this registers them on the Meta key where it has none.
void register_missing_meta_kernels();

// metamem's meta kernel for `qualified_name` ("aten::flip",
// "aten::upsample_nearest3d.vec"), or nullptr.
const c10::KernelFunction* own_meta_kernel(const std::string& qualified_name);

}  // namespace metamem
