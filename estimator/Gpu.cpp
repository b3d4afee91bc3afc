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
//
// Clocks (SMs' boost, memory) and memory buses as deviceQuery prints them:
// read on a real H200 (2026-11-30), from public deviceQuery logs for the
// A100 40GB and the T4, NVIDIA's datasheets for the others (not checked on
// the GPU).
//
// Clusters: cuOccupancyMaxActiveClusters on a real H200 (2026-11-30), for
// clusters of 1 to 32 blocks of 128 threads with all of the opt-in shared
// memory and non-portable sizes allowed, as cuDNN asks it; none fit past
// 18. The H100's GH100 has the same 132 SMs, and is given the H200's
// answers unmeasured: a chip's disabled SMs, and with them its GPCs'
// sizes, can differ from one chip to the next (docs/cuda-paths.md).
constexpr std::array kGh100Clusters = {132, 66, 39, 30, 22, 17, 15, 15, 9, 7, 7, 7, 7, 7, 7, 7, 2, 2};

constexpr std::array kGpus = {
    GpuSpec{"H100-80GB", "NVIDIA H100 80GB HBM3", 9, 0, 132, 81559 * MiB, 50 * MiB, 2048, 227 * KiB, 228 * KiB, 32,
            1980000, 2619000, 5120, kGh100Clusters},
    GpuSpec{"H200", "NVIDIA H200", 9, 0, 132, 143771 * MiB, 60 * MiB, 2048, 227 * KiB, 228 * KiB, 32, 1980000,
            3201000, 6016, kGh100Clusters},
    GpuSpec{"A100-80GB", "NVIDIA A100-SXM4-80GB", 8, 0, 108, 81920 * MiB, 40 * MiB, 2048, 163 * KiB, 164 * KiB, 24,
            1410000, 1593000, 5120},
    GpuSpec{"A100-40GB", "NVIDIA A100-SXM4-40GB", 8, 0, 108, 40960 * MiB, 40 * MiB, 2048, 163 * KiB, 164 * KiB, 24,
            1410000, 1215000, 5120},
    GpuSpec{"L40S", "NVIDIA L40S", 8, 9, 142, 46068 * MiB, 96 * MiB, 1536, 99 * KiB, 100 * KiB, 2, 2520000, 9001000,
            384},
    GpuSpec{"A10", "NVIDIA A10", 8, 6, 72, 23028 * MiB, 6 * MiB, 1536, 99 * KiB, 100 * KiB, 2, 1695000, 6251000, 384},
    GpuSpec{"L4", "NVIDIA L4", 8, 9, 58, 23034 * MiB, 48 * MiB, 1536, 99 * KiB, 100 * KiB, 2, 2040000, 6251000, 192},
    GpuSpec{"T4", "Tesla T4", 7, 5, 40, 15360 * MiB, 4 * MiB, 1024, 64 * KiB, 64 * KiB, 2, 1590000, 5001000, 256},
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
