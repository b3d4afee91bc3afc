// A simulation of PyTorch's CUDA caching allocator (one device, one stream),
// after c10/cuda/CUDACachingAllocator.cpp: what torch.cuda's
// memory_stats() (max_memory_allocated, max_memory_reserved, ...) would report.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "profiler/AllocationObserver.h"
#include "profiler/Trace.h"

namespace metamem {

// One of c10's allocator statistics: its value now, its peak since the last
// reset, and what was added to and taken from it in all.
struct AllocatorStat {
  std::int64_t current = 0, peak = 0, allocated = 0, freed = 0;

  void increase(std::int64_t amount);
  void decrease(std::int64_t amount);
};

// A statistic for all blocks, for the small pool's and for the large pool's,
// as torch.cuda.memory_stats() names them: "all", "small_pool", "large_pool".
using AllocatorStatArray = std::array<AllocatorStat, 3>;
inline constexpr std::array<const char*, 3> kStatPoolNames = {"all", "small_pool", "large_pool"};

// c10::CachingDeviceAllocator::DeviceStats, less what one stream and no
// max_split_size leave at zero (oversize blocks, retries, OOMs).
struct AllocatorStats {
  AllocatorStatArray allocation, segment, active, inactive_split;
  AllocatorStatArray allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes, requested_bytes;
  std::int64_t num_device_alloc = 0, num_device_free = 0, num_sync_all_streams = 0;
};

// Seen by a tracer, it holds the allocator's state at each moment of the
// trace (what torch.cuda.memory_allocated() says there).
class CachingAllocatorSim final : public AllocationObserver {
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
  // As torch.cuda.reset_accumulated_memory_stats(): totals restart at zero.
  void reset_accumulated();
  // As torch.cuda.empty_cache(): segments that are one free block go back
  // to the device.
  void empty_cache();

  void on_alloc(std::uint32_t buffer, std::int64_t bytes, std::int64_t) override { malloc(buffer, bytes); }
  void on_free(std::uint32_t buffer) noexcept override { free(buffer); }

  const AllocatorStats& stats() const { return stats_; }
  std::int64_t allocated_bytes() const { return stats_.allocated_bytes[0].current; }
  std::int64_t reserved_bytes() const { return stats_.reserved_bytes[0].current; }
  std::int64_t peak_allocated_bytes() const { return stats_.allocated_bytes[0].peak; }
  std::int64_t peak_reserved_bytes() const { return stats_.reserved_bytes[0].peak; }

  struct Block {
    std::int64_t segment, size;
    bool allocated;
    bool small_pool;  // from a small-pool (2 MiB) segment
    std::int64_t requested = 0;  // the bytes asked for, while allocated
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
  // A block is split while it is not its whole segment.
  bool is_split(const Block& block) const { return block.size != segments_.at(block.segment); }
  // Adds `amount` to `stat` for all blocks and for the block's pool.
  static void add(AllocatorStatArray& stat, bool small_pool, std::int64_t amount);

  std::map<std::int64_t, Block> blocks_;
  std::map<std::int64_t, std::int64_t> segments_;
  std::set<std::pair<std::int64_t, std::int64_t>> free_small_, free_large_;  // (size, address)
  std::vector<std::int64_t> address_of_;  // by id; kUnallocated where it holds no block
  int divisions_;
  std::int64_t next_segment_address_ = 0;
  AllocatorStats stats_;
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
