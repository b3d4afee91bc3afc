// What autograd needs to run backward on fake CUDA tensors, with or without
// libtorch's CUDA library loaded (Python's torch loads it; metamem's own
// programs do not) and with or without a GPU.
#pragma once

#include <functional>
#include <memory>

namespace c10::impl {
struct DeviceGuardImplInterface;
}

namespace metamem {

class CudnnRnnStubsScope;

// While alive, CUDA's device guard is a fake one (one device, one stream,
// events that complete at once) instead of whatever was registered (the
// real one asks the driver, which fails without a GPU), libtorch's CUDA
// hooks say there is one CUDA device with its context, SDPA picks its
// kernel as the traced GPU would (meta/CudaAttention.h), and the autograd
// engine runs backward on the calling thread instead of a device thread (its
// device threads are counted once, at the first backward of the process).
// Both are put back as they were when it ends.
//
// The traced code's own setting (torch.autograd.set_multithreading_enabled,
// which torchtitan turns off) is kept apart, starting as the thread's: where
// it is on, a GPU's backward runs on the device thread, with a cuBLAS handle
// of its own, and where it is off on the calling thread, with that thread's.
class FakeCudaScope {
 public:
  FakeCudaScope();
  ~FakeCudaScope();
  FakeCudaScope(const FakeCudaScope&) = delete;
  FakeCudaScope& operator=(const FakeCudaScope&) = delete;

 private:
  const c10::impl::DeviceGuardImplInterface* previous_guard_;
  void* previous_hooks_table_;
  bool previous_multithreading_;
  void* previous_sdpa_choice_;
};

// What libtorch's CUDA library says of cuDNN where a process has not
// loaded it (metamem's C++ programs) but traces follow a fake GPU's
// recordings (estimator/FakeGpuRecordings.h): the versions the fake GPU's
// torch reports, a CUDA runtime and cuBLASLt, convolutions of every kind.
struct CudnnBuild {
  long cudnn_version, cudnn_runtime_version, cudart_version;
};

// While alive, fake cuda's hooks answer as a CUDA build with the cuDNN
// `build()` gives where libtorch's CUDA library has no cuDNN to report (it
// is not loaded), so that composites (batch norm, RNNs) pick cuDNN as on a
// GPU; where it is loaded (Python), its own answers stay, and `build` is
// not asked.
class CudnnBuildScope {
 public:
  explicit CudnnBuildScope(const std::function<CudnnBuild()>& build);
  ~CudnnBuildScope();
  CudnnBuildScope(const CudnnBuildScope&) = delete;
  CudnnBuildScope& operator=(const CudnnBuildScope&) = delete;

 private:
  // at::lstm & co. on cuDNN, where the build's facts are installed:
  // libtorch's CUDA library's stubs are absent.
  std::unique_ptr<CudnnRnnStubsScope> rnn_stubs_;
};

// The traced code's autograd multithreading setting while a FakeCudaScope
// lives (the thread's own outside one).
bool traced_autograd_multithreading();
void set_traced_autograd_multithreading(bool enabled);

}  // namespace metamem
