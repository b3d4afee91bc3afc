#include "estimator/Gpu.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <stdexcept>
#include <string>

#include "meta/CudaAttention.h"

namespace metamem {
namespace {

constexpr int KiB = 1024;
constexpr std::int64_t MiB = 1024 * KiB;

// Memory is NVML's total (what nvidia-smi shows; Modal's table of the GPUs
// it rents, "Why does an NVIDIA H100 80GB card offer 85.52 GB?"); the CUDA
// runtime's totalGlobalMem, which torch reports, is a little less on some
// cards (a T4: 15,360 MiB by NVML, 15,110 MiB by deviceQuery). SM counts,
// compute capabilities, L2 sizes, threads per SM and shared memory are
// NVIDIA's datasheets' (the CUDA programming guide's table of compute
// capabilities: 227/228 KiB on sm90, 163/164 on sm80, 99/100 on sm86 and
// sm89, 64 on sm75), but the H200's L2, 60 MiB as torch reads it on a real
// one (2026-11-27; Inductor's benchmarker clears that much). NCCL's
// channels: 32 on NVSwitch H100/H200 nodes and 24 on A100 ones (two per
// NVLink, at most NCCL's 32), 2 between PCIe cards.
constexpr std::array kGpus = {
    GpuSpec{"H100-80GB", "NVIDIA H100 80GB HBM3", 9, 0, 132, 81559 * MiB, 50 * MiB, 2048, 227 * KiB, 228 * KiB, 32},
    GpuSpec{"H200", "NVIDIA H200", 9, 0, 132, 143771 * MiB, 60 * MiB, 2048, 227 * KiB, 228 * KiB, 32},
    GpuSpec{"A100-80GB", "NVIDIA A100-SXM4-80GB", 8, 0, 108, 81920 * MiB, 40 * MiB, 2048, 163 * KiB, 164 * KiB, 24},
    GpuSpec{"A100-40GB", "NVIDIA A100-SXM4-40GB", 8, 0, 108, 40960 * MiB, 40 * MiB, 2048, 163 * KiB, 164 * KiB, 24},
    GpuSpec{"L40S", "NVIDIA L40S", 8, 9, 142, 46068 * MiB, 96 * MiB, 1536, 99 * KiB, 100 * KiB, 2},
    GpuSpec{"A10", "NVIDIA A10", 8, 6, 72, 23028 * MiB, 6 * MiB, 1536, 99 * KiB, 100 * KiB, 2},
    GpuSpec{"L4", "NVIDIA L4", 8, 9, 58, 23034 * MiB, 48 * MiB, 1536, 99 * KiB, 100 * KiB, 2},
    GpuSpec{"T4", "Tesla T4", 7, 5, 40, 15360 * MiB, 4 * MiB, 1024, 64 * KiB, 64 * KiB, 2},
};

bool same_key(std::string_view a, std::string_view b) {
  return std::ranges::equal(a, b, [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
  });
}

}  // namespace

std::span<const GpuSpec> known_gpus() { return kGpus; }

const GpuSpec& find_gpu(std::string_view key) {
  for (const GpuSpec& gpu : kGpus)
    if (same_key(gpu.key, key)) return gpu;
  std::string known;
  for (const GpuSpec& gpu : kGpus) known += (known.empty() ? "" : ", ") + std::string(gpu.key);
  throw std::invalid_argument("unknown GPU '" + std::string(key) + "'; known: " + known);
}

GpuTraits traits_of(const GpuSpec& gpu) {
  return {gpu.major, gpu.minor, gpu.multi_processor_count, gpu.max_threads_per_multi_processor,
          gpu.shared_memory_per_block_optin};
}

}  // namespace metamem
