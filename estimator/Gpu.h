// The GPUs a trace can be for, as torch.cuda.get_device_properties() and
// NVML describe them: what a fake CUDA device answers in their place.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace metamem {

struct GpuSpec {
  std::string_view key;   // how users name it: "H100-80GB"
  std::string_view name;  // the device's own name: "NVIDIA H100 80GB HBM3"
  int major, minor;       // compute capability
  int multi_processor_count;
  std::int64_t total_memory;  // bytes
  std::int64_t l2_cache_size;  // bytes
  int max_threads_per_multi_processor;
  // Shared memory: what a block may opt in to, and an SM's (by compute
  // capability). Triton's and Inductor's kernel configurations fit in them.
  int shared_memory_per_block_optin, shared_memory_per_multi_processor;
  // NCCL's ring channels between GPUs of one node, as NCCL_DEBUG=INFO logs
  // them ("Channel 00/32"): many over NVLink, a few over PCIe.
  int nccl_channels;
  // The SMs' clock and the memory's, in kHz, and the memory bus's width in
  // bits, as deviceQuery prints them: cuDNN's heuristics weigh them in
  // choosing some convolutions' engines.
  int clock_rate, memory_clock_rate, memory_bus_width;
  // How many clusters of 1, 2, 3, ... blocks fit on the GPU at once, one
  // block per SM (cuOccupancyMaxActiveClusters): what the SMs' grouping
  // into GPCs allows. cuDNN asks it before it sizes an sm90 engine's
  // workspace. Empty where the GPU launches no clusters (before sm90).
  std::span<const int> max_active_clusters = {};
};

// The table, first the default (H100-80GB).
std::span<const GpuSpec> known_gpus();

// The GPU named `key` (any case); std::invalid_argument naming the known
// keys otherwise.
const GpuSpec& find_gpu(std::string_view key);

// What torch's CUDA kernels choose by on that GPU (meta/CudaAttention.h),
// for a TracedGpuScope.
struct GpuTraits;
GpuTraits traits_of(const GpuSpec& gpu);

}  // namespace metamem
