#include "oracle/RealCachingAllocator.h"

#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/PeerToPeerAccess.h>

#include "oracle/FakeGpuDevice.h"

namespace c10::cuda::_internal {
// Exported by libc10_cuda.so but declared in no header: libtorch_cuda sets
// it when loaded, to ask the driver whether a device has its context.
C10_CUDA_API void setHasPrimaryContext(bool (*has_primary_context)(DeviceIndex));
}  // namespace c10::cuda::_internal

namespace metamem {
namespace {

namespace c10_allocator = c10::cuda::CUDACachingAllocator;

void copy(const c10::CachingDeviceAllocator::Stat& from, AllocatorStat& to) {
  to = {from.current, from.peak, from.allocated, from.freed};
}

void copy(const c10::CachingDeviceAllocator::StatArray& from, AllocatorStatArray& to) {
  for (std::size_t pool = 0; pool < to.size(); ++pool) copy(from[pool], to[pool]);
}

}  // namespace

RealCachingAllocator::RealCachingAllocator(const GpuSpec& gpu, const std::string& alloc_conf) {
  set_fake_gpu_device(gpu);
  // Switching streams' devices asks it (c10's default says it is never
  // asked): the fake device has its context from the start.
  c10::cuda::_internal::setHasPrimaryContext([](c10::DeviceIndex) { return true; });
  c10::CachingAllocator::setAllocatorSettings(alloc_conf);
  c10_allocator::init(1);
  // torch.cuda's lazy initialisation does this; expandable segments ask it.
  c10::cuda::detail::init_p2p_access_cache(1);
  // Expandable segments share by file descriptor: left unspecified, c10
  // asks NVML whether the GPU has fabric handles, and there is no NVML.
  c10_allocator::CUDAAllocatorConfig::set_expandable_segments_handle_type(
      c10_allocator::Expandable_Segments_Handle_Type::POSIX_FD);
}

RealCachingAllocator::~RealCachingAllocator() { reset(); }

c10::cuda::CUDAStream RealCachingAllocator::stream(int number) {
  if (streams_.empty()) streams_.push_back(c10::cuda::getDefaultCUDAStream(0));
  while (static_cast<int>(streams_.size()) <= number) streams_.push_back(c10::cuda::getStreamFromPool(false, 0));
  return streams_.at(number);
}

void RealCachingAllocator::apply(const AllocatorEvent& event) {
  switch (event.kind) {
    case AllocatorEvent::Kind::Alloc: {
      if (event.id >= allocations_.size())
        allocations_.resize(std::max<std::size_t>(event.id + 1, 2 * allocations_.size()));
      // On the event's stream, as a tensor made there; zero bytes: c10
      // hands out no memory (nullptr), as the simulator.
      const c10::cuda::CUDAStreamGuard on(stream(event.stream));
      allocations_[event.id] = c10_allocator::get()->allocate(event.bytes);
      break;
    }
    case AllocatorEvent::Kind::Free:
      if (event.id < allocations_.size()) allocations_[event.id].clear();
      break;
    case AllocatorEvent::Kind::RecordStream:
      c10_allocator::recordStream(allocations_.at(event.id), stream(event.stream));
      break;
    case AllocatorEvent::Kind::ResetPeaks: c10_allocator::resetPeakStats(0); break;
    case AllocatorEvent::Kind::EmptyCache: c10_allocator::emptyCache(); break;
    case AllocatorEvent::Kind::PoolBegin: {
      std::function<bool(cudaStream_t)> filter = [](cudaStream_t) { return true; };  // the thread's requests
      if (event.stream != AllocatorEvent::kEveryStream)
        filter = [routed = stream(event.stream).stream()](cudaStream_t on) { return on == routed; };
      c10_allocator::beginAllocateToPool(0, pool_id(event.pool), std::move(filter));
      routed_.push_back(event.pool);
      ++pool_uses_[event.pool];
      break;
    }
    case AllocatorEvent::Kind::PoolEnd:
      c10_allocator::endAllocateToPool(0, pool_id(event.pool));
      std::erase(routed_, event.pool);
      break;
    case AllocatorEvent::Kind::PoolRelease:
      c10_allocator::releasePool(0, pool_id(event.pool));
      --pool_uses_[event.pool];
      break;
    case AllocatorEvent::Kind::PoolCheckpoint: {
      Checkpoint& checkpoint = checkpoints_.emplace_back();
      checkpoint.state = c10_allocator::getCheckpointState(0, pool_id(event.pool));
      for (std::uint32_t id = 0; id < allocations_.size(); ++id)
        if (allocations_[id]) checkpoint.held_by[allocations_[id].get()] = id;
      break;
    }
    case AllocatorEvent::Kind::PoolRestore: {
      const Checkpoint& checkpoint = checkpoints_.at(event.id);
      c10_allocator::CheckpointDelta delta = c10_allocator::setCheckpointPoolState(0, checkpoint.state);
      // c10 freed these blocks: their allocations no longer own them (as
      // torch's binding takes the deleters off stale storages).
      for (void* freed : delta.ptrs_freed)
        for (c10::DataPtr& allocation : allocations_)
          if (allocation && allocation.get() == freed) {
            allocation.release_context();
            allocation = c10::DataPtr();
          }
      std::map<std::uint32_t, std::uint32_t> holder;
      for (std::size_t i = 0; i < event.buffers.size(); ++i) holder[event.held_by[i]] = event.buffers[i];
      for (c10::DataPtr& block : delta.dataptrs_allocd) {
        const std::uint32_t id = holder.at(checkpoint.held_by.at(block.get()));
        if (id >= allocations_.size()) allocations_.resize(std::max<std::size_t>(id + 1, 2 * allocations_.size()));
        allocations_[id] = std::move(block);
      }
      break;
    }
  }
}

AllocatorStats RealCachingAllocator::stats() const {
  const auto real = c10_allocator::getDeviceStats(0);
  AllocatorStats stats;
  copy(real.allocation, stats.allocation);
  copy(real.segment, stats.segment);
  copy(real.active, stats.active);
  copy(real.inactive_split, stats.inactive_split);
  copy(real.allocated_bytes, stats.allocated_bytes);
  copy(real.reserved_bytes, stats.reserved_bytes);
  copy(real.active_bytes, stats.active_bytes);
  copy(real.inactive_split_bytes, stats.inactive_split_bytes);
  copy(real.requested_bytes, stats.requested_bytes);
  copy(real.oversize_allocations, stats.oversize_allocations);
  copy(real.oversize_segments, stats.oversize_segments);
  stats.num_alloc_retries = real.num_alloc_retries;
  stats.num_ooms = real.num_ooms;
  stats.num_device_alloc = real.num_device_alloc;
  stats.num_device_free = real.num_device_free;
  stats.num_sync_all_streams = real.num_sync_all_streams;
  stats.max_split_size = real.max_split_size;
  return stats;
}

void RealCachingAllocator::reset() {
  for (const int pool : routed_) c10_allocator::endAllocateToPool(0, pool_id(pool));
  for (auto& [pool, uses] : pool_uses_)
    for (; uses > 0; --uses) c10_allocator::releasePool(0, pool_id(pool));
  routed_.clear();
  pool_uses_.clear();
  checkpoints_.clear();
  pool_generation_ += 1 << 20;
  for (c10::DataPtr& allocation : allocations_) allocation.clear();
  c10_allocator::emptyCache();
  c10_allocator::resetPeakStats(0);
  c10_allocator::resetAccumulatedStats(0);
}

}  // namespace metamem
