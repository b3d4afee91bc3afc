// scaled_dot_product_attention on a fake CUDA device: which of torch's
// attention kernels the traced GPU runs (FlashAttention-2, memory-efficient,
// cuDNN or the math fallback), and what the fused kernels hold beside their
// gradients in backward.
#pragma once

#include <string>

#include "meta/CpuKernelModel.h"

namespace metamem {

// What torch's CUDA kernels choose by: the GPU's compute capability (SDPA's
// backend), its SMs and threads per SM (a reduction's blocks), the shared
// memory a block may opt in to (the memory-efficient kernel's blocks).
struct GpuTraits {
  int major = 9, minor = 0;
  int multi_processor_count = 132, max_threads_per_multi_processor = 2048;
  int shared_memory_per_block_optin = 232448;
};

// The GPU fake-cuda traces are for now.
GpuTraits traced_gpu();

// While alive, fake-cuda traces are for the GPU `gpu`; otherwise for an
// H100.
class TracedGpuScope {
 public:
  explicit TracedGpuScope(GpuTraits gpu);
  ~TracedGpuScope();
  TracedGpuScope(const TracedGpuScope&) = delete;
  TracedGpuScope& operator=(const TracedGpuScope&) = delete;

 private:
  GpuTraits previous_;
};

// Puts metamem's choice of SDPA backend in torch's CUDA slot and returns
// what was there (libtorch_cuda's, or nothing where only libtorch's CPU
// library is loaded). With it, SDPA on fake cuda tensors picks the kernel
// torch 2.14's CUDA build picks on the traced GPU, following sdp_utils.cpp's
// select_sdp_backend: the priority order, the user's torch.backends.cuda
// flags, each backend's constraints on dtype, head size, mask, dropout,
// layout and architecture. The real choice asks the CUDA runtime, which has
// no device here, and falls back to math. FakeCudaScope installs it.
void* install_sdpa_choice();
void restore_sdpa_choice(void* previous);

// Bytes a fused SDPA kernel holds beside its outputs on CUDA
// (`qualified_name` as "aten::_scaled_dot_product_cudnn_attention_backward"),
// or nullptr.
ScratchModel cuda_scratch_model(const std::string& qualified_name);

}  // namespace metamem
