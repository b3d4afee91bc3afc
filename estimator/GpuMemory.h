// What a GPU's memory holds beside PyTorch's caching allocator, which
// cudaMalloc therefore cannot hand the allocator: the CUDA context (with the
// kernels it loads) and NCCL's buffers. Estimates, each with its basis
// (docs/gpu-memory.md); a user who measured them gives their own figures.
// cuBLAS's workspace is not here: torch 2.x takes it from the allocator,
// and traces hold it (meta/CublasWorkspace.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "estimator/Gpu.h"

namespace metamem {

struct GpuMemoryUse {
  std::string what;   // "CUDA context"
  std::int64_t bytes = 0;
  std::string basis;  // how the figure was made
};

struct GpuMemoryOptions {
  int nccl_communicators = 0;               // one per process group of two or more ranks
  std::optional<std::int64_t> cuda_context;  // measured, in place of the estimate
  std::optional<std::int64_t> nccl_buffers;  // measured, all communicators together
};

struct GpuMemory {
  std::string gpu;         // the GPU's key
  std::int64_t total = 0;  // the GPU's memory, or what the user gave
  std::vector<GpuMemoryUse> beside_allocator;
  // What the caching allocator's cudaMalloc can hand out: the rest.
  std::int64_t allocator_bytes() const;
};

// The CUDA context on `gpu`: the stack the driver reserves for every thread
// the GPU can hold (1 KiB each, cudaLimitStackSize's default) and the
// driver's and runtime's own memory.
std::int64_t cuda_context_bytes(const GpuSpec& gpu);

// One NCCL communicator's buffers on `gpu`: each ring channel's connection
// buffers for the three protocols at NCCL's default sizes.
std::int64_t nccl_communicator_bytes(const GpuSpec& gpu);

// `total` bytes of `gpu` (0: all of its memory) and what it holds beside the
// allocator. Throws std::invalid_argument where that leaves the allocator
// nothing.
GpuMemory gpu_memory(const GpuSpec& gpu, std::int64_t total = 0, const GpuMemoryOptions& options = {});

}  // namespace metamem
