// What autograd needs to run backward on fake CUDA tensors, with or without
// libtorch's CUDA library loaded (Python's torch loads it; metamem's own
// programs do not) and with or without a GPU.
#pragma once

namespace c10::impl {
struct DeviceGuardImplInterface;
}

namespace metamem {

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

// The traced code's autograd multithreading setting while a FakeCudaScope
// lives (the thread's own outside one).
bool traced_autograd_multithreading();
void set_traced_autograd_multithreading(bool enabled);

}  // namespace metamem
