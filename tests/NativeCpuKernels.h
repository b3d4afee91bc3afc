// A guard for tests of metamem's model of torch's native CPU kernels
// (meta/CpuKernelModel.h): what oneDNN runs, a trace records instead
// (meta/CpuKernelRecording.h).
#pragma once

#include <ATen/Context.h>

namespace metamem::testing {

// While alive, torch runs its native CPU kernels: oneDNN off.
class NativeCpuKernels {
 public:
  NativeCpuKernels() { at::globalContext().setUserEnabledMkldnn(false); }
  ~NativeCpuKernels() { at::globalContext().setUserEnabledMkldnn(onednn_was_); }
  NativeCpuKernels(const NativeCpuKernels&) = delete;
  NativeCpuKernels& operator=(const NativeCpuKernels&) = delete;

 private:
  bool onednn_was_ = at::globalContext().userEnabledMkldnn();
};

}  // namespace metamem::testing
