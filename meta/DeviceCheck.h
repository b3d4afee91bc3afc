// Real torch refuses an op whose tensors lie on two devices, a GPU's and the
// host's; a trace that keeps host tensors on the host (HostTensors::OnHost)
// refuses it as well, rather than tracing a step the GPU would not run.
#pragma once

#include <ATen/core/stack.h>

#include <string>
#include <vector>

namespace c10 {
class OperatorHandle;
}

namespace metamem {

// The ops that check where their tensors lie on a GPU, by name and
// overload ("aten::mm", "aten::add.Tensor"; metamem._device_checks reads
// them from native_functions.yaml): `same_device`, as torchgen's check in
// a CUDA kernel (every positional and out tensor on one device);
// `pointwise`, as TensorIterator's (a 0-dim host tensor may go with device
// tensors, as a scalar); `values`, as index_put's CUDA kernels check it
// (indices may lie on the host; `values` on `self`'s device, or a 0-dim
// host tensor). Until set, nothing is checked.
void set_device_checks(const std::vector<std::string>& same_device, const std::vector<std::string>& pointwise,
                       const std::vector<std::string>& values);

// Throws torch's error (c10::Error, "Expected all tensors to be on the same
// device, ...", or index_put's own with `accumulate`) where `op`'s arguments
// on `stack` mix a device tensor with a host tensor that its CUDA kernel
// refuses. Runs the check only when both kinds are present.
void check_devices(const c10::OperatorHandle& op, const torch::jit::Stack& stack);

}  // namespace metamem
