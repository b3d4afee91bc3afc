// A simulation of PyTorch's CUDA caching allocator (one device, one stream),
// after c10/cuda/CUDACachingAllocator.cpp: what torch.cuda's
// max_memory_allocated and max_memory_reserved would report.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "profiler/AllocationObserver.h"
#include "profiler/Trace.h"

namespace metamem {

class CachingAllocatorSim {
 public:
  static constexpr std::int64_t kMinBlockSize = 512;
  static constexpr std::int64_t kSmallSize = 1 << 20;        // largest small-pool request
  static constexpr std::int64_t kSmallBuffer = 2 << 20;      // small-pool segment
  static constexpr std::int64_t kLargeBuffer = 20 << 20;     // large-pool segment below kMinLargeAlloc
  static constexpr std::int64_t kMinLargeAlloc = 10 << 20;
  static constexpr std::int64_t kRoundLarge = 2 << 20;
  static constexpr std::int64_t kUnallocated = -1;

  // PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:N (0: off): requests
  // above 512·N bytes round up to one of N equal steps between powers of two.
  explicit CachingAllocatorSim(int roundup_power2_divisions = 0)
      : divisions_(roundup_power2_divisions) {}

  std::int64_t round_size(std::int64_t bytes) const;
  static std::int64_t segment_size(std::int64_t rounded);

  // What a memory-viz trace records: segment_alloc, alloc, free_completed.
  struct Action {
    const char* action;
    std::int64_t address, size;
  };
  using Listener = std::function<void(const Action&)>;
  void set_listener(Listener listener) { listener_ = std::move(listener); }

  // `id` names the allocation for free(): a trace's buffer index (small
  // and dense: addresses are kept by it). Zero bytes allocate nothing.
  void malloc(std::uint32_t id, std::int64_t bytes);
  void free(std::uint32_t id);
  // As torch.cuda.reset_peak_memory_stats(): peaks restart from now.
  void reset_peaks();

  std::int64_t allocated_bytes() const { return allocated_; }
  std::int64_t reserved_bytes() const { return reserved_; }
  std::int64_t peak_allocated_bytes() const { return peak_allocated_; }
  std::int64_t peak_reserved_bytes() const { return peak_reserved_; }

  struct Block {
    std::int64_t segment, size;
    bool allocated;
    bool small_pool;  // from a small-pool (2 MiB) segment
  };
  // Blocks by address; segments by base address and size.
  const std::map<std::int64_t, Block>& blocks() const { return blocks_; }
  const std::map<std::int64_t, std::int64_t>& segments() const { return segments_; }

 private:
  std::set<std::pair<std::int64_t, std::int64_t>>& pool(bool small_pool) {
    return small_pool ? free_small_ : free_large_;
  }
  void notify(const char* action, std::int64_t address, std::int64_t size) const {
    if (listener_) listener_({action, address, size});
  }

  std::map<std::int64_t, Block> blocks_;
  std::map<std::int64_t, std::int64_t> segments_;
  std::set<std::pair<std::int64_t, std::int64_t>> free_small_, free_large_;  // (size, address)
  std::vector<std::int64_t> address_of_;  // by id; kUnallocated where it holds no block
  int divisions_;
  std::int64_t next_segment_address_ = 0;
  std::int64_t allocated_ = 0, reserved_ = 0, peak_allocated_ = 0, peak_reserved_ = 0;
  Listener listener_;
};

// Runs the allocator on a trace as it is recorded and stops it once the
// allocator reserves more than `limit`: it never gives a segment back, so
// the step would reserve at least that.
class ReservedBytesLimit final : public AllocationObserver {
 public:
  ReservedBytesLimit(std::int64_t limit, int roundup_power2_divisions)
      : limit_(limit), sim_(roundup_power2_divisions) {}
  void on_alloc(std::uint32_t buffer, std::int64_t bytes, std::int64_t live_bytes) override;
  void on_free(std::uint32_t buffer) noexcept override { sim_.free(buffer); }
  // The most the trace's allocator reserved (its measured step's peak too).
  std::int64_t reserved_bytes() const { return sim_.reserved_bytes(); }

 private:
  std::int64_t limit_;
  CachingAllocatorSim sim_;
};

// Feeds the trace's allocs and frees to `sim` in order; `before` sees each
// event's index first (ops included).
void replay_trace(const Trace& trace, CachingAllocatorSim& sim,
                  const std::function<void(std::size_t event)>& before = {});

}  // namespace metamem
