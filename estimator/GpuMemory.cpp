#include "estimator/GpuMemory.h"

#include <fmt/format.h>

#include <stdexcept>

#include "estimator/Units.h"

namespace metamem {
namespace {

constexpr std::int64_t KiB = 1024, MiB = 1024 * KiB;

constexpr std::int64_t kStackPerThread = 1 * KiB;  // cudaLimitStackSize's default
// A bare CUDA 13 context beside its stack: 426 MiB in all on an RTX 6000
// Ada (142 SMs × 1536 threads: 213 MiB of stack) with torch 2.10+cu130
// (unslothai/unsloth-zoo#1053); 256 MiB in all, 133 MiB beside the stack,
// on an RTX 3090 with CUDA 12.8 (invoke-ai/InvokeAI#9413). The kernels a
// step loads lazily (CUDA_MODULE_LOADING=LAZY, torch's default) come on
// top, unmeasured here.
constexpr std::int64_t kDriverAndRuntime = 213 * MiB;

// NCCL's default buffers per connection (src/include/device.h): the simple
// protocol's NCCL_BUFFSIZE (4 MiB), LL's 8 lines × 512 threads × 8 steps ×
// 16 B, LL128's 120 elements × 640 threads × 8 steps × 8 B. A rank holds
// one such connection per ring channel.
constexpr std::int64_t kNcclSimple = 4 * MiB;
constexpr std::int64_t kNcclLl = 8 * 512 * 8 * 16;
constexpr std::int64_t kNcclLl128 = 120 * 640 * 8 * 8;
constexpr std::int64_t kNcclConnection = kNcclSimple + kNcclLl + kNcclLl128;

std::int64_t stack_bytes(const GpuSpec& gpu) {
  return std::int64_t{gpu.multi_processor_count} * gpu.max_threads_per_multi_processor * kStackPerThread;
}

}  // namespace

std::int64_t GpuMemory::allocator_bytes() const {
  std::int64_t rest = total;
  for (const GpuMemoryUse& use : beside_allocator) rest -= use.bytes;
  return rest;
}

std::int64_t cuda_context_bytes(const GpuSpec& gpu) { return stack_bytes(gpu) + kDriverAndRuntime; }

std::int64_t nccl_communicator_bytes(const GpuSpec& gpu) { return gpu.nccl_channels * kNcclConnection; }

GpuMemory gpu_memory(const GpuSpec& gpu, std::int64_t total, const GpuMemoryOptions& options) {
  GpuMemory memory{std::string(gpu.key), total == 0 ? gpu.total_memory : total, {}};
  if (options.cuda_context)
    memory.beside_allocator.push_back({"CUDA context", *options.cuda_context, "as given"});
  else
    memory.beside_allocator.push_back(
        {"CUDA context", cuda_context_bytes(gpu),
         fmt::format("estimate: {} stack ({} SMs × {} threads × 1 KiB) + {} driver and runtime, before kernels "
                     "loaded on use",
                     human_bytes(stack_bytes(gpu)), gpu.multi_processor_count, gpu.max_threads_per_multi_processor,
                     human_bytes(kDriverAndRuntime))});
  if (options.nccl_buffers)
    memory.beside_allocator.push_back({"NCCL buffers", *options.nccl_buffers, "as given"});
  else if (options.nccl_communicators > 0)
    memory.beside_allocator.push_back(
        {"NCCL buffers", options.nccl_communicators * nccl_communicator_bytes(gpu),
         fmt::format("estimate: {} communicator{} × {} ring channels × {} (simple, LL, LL128 at NCCL's defaults)",
                     options.nccl_communicators, options.nccl_communicators == 1 ? "" : "s", gpu.nccl_channels,
                     human_bytes(kNcclConnection))});
  if (memory.allocator_bytes() <= 0) {
    std::string beside;
    for (const GpuMemoryUse& use : memory.beside_allocator)
      beside += fmt::format("{}{} {}", beside.empty() ? "" : ", ", use.what, human_bytes(use.bytes));
    throw std::invalid_argument(fmt::format("{} of {} leaves nothing to the CUDA caching allocator beside {}",
                                            human_bytes(total), gpu.key, beside));
  }
  return memory;
}

}  // namespace metamem
