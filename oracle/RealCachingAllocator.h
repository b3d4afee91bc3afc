// PyTorch's own CUDA caching allocator (c10::cuda::CUDACachingAllocator in
// the pinned wheel's libc10_cuda.so), driven by metamem's allocator events.
// Only a program linked to the fake CUDA runtime (FakeCudaRuntime.cpp) may
// use it: on a machine without a GPU the real runtime has no device.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "estimator/AllocatorEvents.h"
#include "estimator/CachingAllocator.h"
#include "estimator/Gpu.h"

namespace metamem {

class RealCachingAllocator {
 public:
  // `alloc_conf` as PYTORCH_ALLOC_CONF takes it; the fake GPU is `gpu`.
  // One per process: c10's allocator is global.
  RealCachingAllocator(const GpuSpec& gpu, const std::string& alloc_conf);
  ~RealCachingAllocator();
  RealCachingAllocator(const RealCachingAllocator&) = delete;
  RealCachingAllocator& operator=(const RealCachingAllocator&) = delete;

  // Throws c10::OutOfMemoryError where the real allocator does.
  void apply(const AllocatorEvent& event);
  AllocatorStats stats() const;
  // Frees what is live, gives every segment back and restarts the
  // statistics: ready for another event list.
  void reset();

 private:
  // Event lists' stream numbers: 0 the default stream, the others torch's
  // pool streams, made on first use.
  c10::cuda::CUDAStream stream(int number);

  // An event list's private pool, as c10 names it: distinct for each list
  // replayed, since c10 keeps a pool with uses left.
  c10::MempoolId_t pool_id(int pool) const { return {0, pool_generation_ + pool}; }

  // By allocation ID: what torch's allocator handed out (a tensor's
  // storage holds the same), empty where none is live.
  std::vector<c10::DataPtr> allocations_;
  std::vector<c10::cuda::CUDAStream> streams_;
  // The list's pools that requests are routed to, and the uses each has
  // left, ended and released by reset().
  std::vector<int> routed_;
  std::map<int, int> pool_uses_;
  // Pools' checkpoints by number, each with the allocation that held each
  // block then, by address.
  struct Checkpoint {
    std::shared_ptr<c10::cuda::CUDACachingAllocator::AllocatorState> state;
    std::map<const void*, std::uint32_t> held_by;
  };
  std::vector<Checkpoint> checkpoints_;
  c10::CaptureId_t pool_generation_ = 0;
};

}  // namespace metamem
