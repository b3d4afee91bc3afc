// MetaTensor: a tensor that claims to live on a device (cpu or cuda) but holds
// only a meta tensor inside, so autograd and composite kernels behave as on
// that device while no data is ever allocated.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Storage.h>

#include <string_view>

namespace metamem {

// Wraps `inner` (a tensor on the meta device) as a MetaTensor on `fake_device`.
at::Tensor make_meta_tensor(at::Tensor inner, c10::Device fake_device);

bool is_meta_tensor(const at::Tensor& t);

// The error with which reading a MetaTensor's data stops (data_ptr(),
// numpy(), a kernel reading values): it has none.
inline constexpr std::string_view kNoDataMessage =
    "metamem: a traced tensor has no data: its address and its values cannot be read "
    "(data_ptr(), numpy(), a kernel reading values).";

// The meta tensor inside a MetaTensor. Precondition: is_meta_tensor(t).
const at::Tensor& inner_tensor(const at::Tensor& t);

// Whether `storage` is a MetaTensor's (untyped_storage() of one): it stands
// for the meta storage inside, which holds the traced buffer.
bool is_meta_storage(const c10::Storage& storage);

// The meta storage a MetaTensor's storage stands for. Precondition:
// is_meta_storage(storage).
c10::StorageImpl* inner_storage(const c10::Storage& storage);

// At a trace's end: every MetaTensor still alive claims the meta device
// from then on (it never held data on any). Autograd asks a tensor's device
// for its stream before any kernel runs (a module moved to the fake cuda
// inside the block and called after it), which the real CUDA runtime
// cannot answer without a GPU, from code that cannot throw; the meta device
// answers, and the op then raises TraceEndedError.
void retire_meta_tensors();

// Whether the MetaTensors made from now on stand beside host tensors (a
// fake-cuda trace that keeps them on the host): then those of both devices
// answer both autocasts, and are of one kind for torch, as a real CPU and
// CUDA tensor are (Tensor.data set across them).
void set_host_beside_gpu(bool on);

// Re-reads sizes, strides and offset from the inner tensor after an in-place
// op changed them (resize_, out= variants, t_, ...).
void sync_meta_tensor(const at::Tensor& t);

}  // namespace metamem
