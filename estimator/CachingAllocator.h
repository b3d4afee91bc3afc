// A simulation of PyTorch's CUDA caching allocator (one device, its streams),
// after c10/cuda/CUDACachingAllocator.cpp and c10/core/CachingDeviceAllocator.h:
// what torch.cuda's memory_stats() (max_memory_allocated,
// max_memory_reserved, ...) would report. Checked against the real one,
// event by event, by oracle/ (docs/allocator-oracle.md).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "estimator/AllocatorConfig.h"
#include "profiler/AllocationObserver.h"
#include "profiler/PoolRoutes.h"
#include "profiler/Trace.h"

namespace metamem {

// One of c10's allocator statistics: its value now, its peak since the last
// reset, and what was added to and taken from it in all.
struct AllocatorStat {
  std::int64_t current = 0, peak = 0, allocated = 0, freed = 0;

  void increase(std::int64_t amount);
  void decrease(std::int64_t amount);
  bool operator==(const AllocatorStat&) const = default;
};

// A statistic for all blocks, for the small pool's and for the large pool's,
// as torch.cuda.memory_stats() names them: "all", "small_pool", "large_pool".
using AllocatorStatArray = std::array<AllocatorStat, 3>;
inline constexpr std::array<const char*, 3> kStatPoolNames = {"all", "small_pool", "large_pool"};

// c10::CachingDeviceAllocator::DeviceStats (private pools count in them).
struct AllocatorStats {
  AllocatorStatArray allocation, segment, active, inactive_split;
  AllocatorStatArray allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes, requested_bytes;
  AllocatorStat oversize_allocations, oversize_segments;
  std::int64_t num_alloc_retries = 0, num_ooms = 0;
  std::int64_t num_device_alloc = 0, num_device_free = 0, num_sync_all_streams = 0;
  std::int64_t max_split_size = 0;

  // Calls fn(stat) for every AllocatorStat above.
  template <typename Stats, typename Fn>
  static void for_each(Stats& stats, Fn&& fn);
};

// The statistic arrays, as torch.cuda.memory_stats() names them.
inline constexpr std::array<std::pair<const char*, AllocatorStatArray AllocatorStats::*>, 9> kStatArrays = {{
    {"allocation", &AllocatorStats::allocation},
    {"segment", &AllocatorStats::segment},
    {"active", &AllocatorStats::active},
    {"inactive_split", &AllocatorStats::inactive_split},
    {"allocated_bytes", &AllocatorStats::allocated_bytes},
    {"reserved_bytes", &AllocatorStats::reserved_bytes},
    {"active_bytes", &AllocatorStats::active_bytes},
    {"inactive_split_bytes", &AllocatorStats::inactive_split_bytes},
    {"requested_bytes", &AllocatorStats::requested_bytes},
}};

template <typename Stats, typename Fn>
void AllocatorStats::for_each(Stats& stats, Fn&& fn) {
  for (const auto& [name, array] : kStatArrays)
    for (auto& stat : stats.*array) fn(stat);
  fn(stats.oversize_allocations);
  fn(stats.oversize_segments);
}

// The first statistic in which `a` and `b` differ, as torch names it:
// "reserved_bytes.large_pool.peak: A vs B"; empty when they agree.
std::string first_difference(const AllocatorStats& a, const AllocatorStats& b);

// What the simulated allocator runs with.
struct AllocatorSetup {
  AllocatorConfig config;  // PYTORCH_ALLOC_CONF
  // What cudaMalloc can hand out in all (the GPU's memory less what others hold).
  std::int64_t device_memory = std::numeric_limits<std::int64_t>::max();
  // The GPU's memory (cudaMemGetInfo's total), which per_process_memory_fraction
  // and expandable segments' address space are of; 0: device_memory.
  std::int64_t device_total = 0;
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

  // Throws std::invalid_argument for a memory fraction of a device whose
  // memory is not given.
  explicit CachingAllocatorSim(const AllocatorSetup& setup);
  // A GPU of `device_memory` bytes, all of which cudaMalloc can hand out.
  explicit CachingAllocatorSim(const AllocatorConfig& config = {},
                               std::int64_t device_memory = std::numeric_limits<std::int64_t>::max())
      : CachingAllocatorSim(AllocatorSetup{config, device_memory}) {}
  // PYTORCH_ALLOC_CONF=roundup_power2_divisions:N (0: off): requests
  // above 512·N bytes round up to one of N equal steps between powers of two.
  explicit CachingAllocatorSim(int roundup_power2_divisions)
      : CachingAllocatorSim(AllocatorConfig::with_divisions(roundup_power2_divisions)) {}

  std::int64_t round_size(std::int64_t bytes) const;
  std::int64_t segment_size(std::int64_t rounded) const;

  // What a memory-viz trace records: segment_alloc, alloc, free_completed.
  struct Action {
    const char* action;
    std::int64_t address, size;
    int stream;
  };
  using Listener = std::function<void(const Action&)>;
  void set_listener(Listener listener) { listener_ = std::move(listener); }

  // `id` names the allocation for free(): a trace's buffer index (small
  // and dense: addresses are kept by it). Zero bytes allocate nothing.
  // Where the device has no room left after freeing what c10 frees before
  // giving up, throws MemoryExceeded (torch.cuda.OutOfMemoryError).
  //
  // Streams are numbered (0: the default stream). A segment is its
  // stream's, and only requests on that stream take its blocks.
  void malloc(std::uint32_t id, std::int64_t bytes, int stream = 0);
  // The same, served by `pool` whatever the routing (0: the device's own
  // pools), as a trace records where each request went. A private pool
  // first met here is made with one use, which no event releases.
  void malloc_in_pool(std::uint32_t id, std::int64_t bytes, int stream, int pool);
  void free(std::uint32_t id);
  // Tensor.record_stream(): the allocation is used on `stream` too, so its
  // free waits for that stream's work. Here every stream's work is done at
  // once (as on the fake CUDA runtime, whose events complete when
  // recorded): the block is freed at the next malloc or empty_cache, where
  // c10 finds the events it recorded complete.
  void record_stream(std::uint32_t id, int stream);
  // As torch.cuda.reset_peak_memory_stats(): peaks restart from now.
  void reset_peaks();
  // Of requests of `sizes` bytes on `stream` from `pool`, tried in turn
  // from the allocator's state now on a device of `device_memory` bytes,
  // each after the last was refused (which gave the cached segments back,
  // as c10 does before it raises its out-of-memory error): the index of
  // the first granted, or nullopt. The allocator itself does not change.
  std::optional<std::size_t> first_granted(const std::vector<std::int64_t>& sizes, int stream, int pool,
                                           std::int64_t device_memory) const;
  // As torch.cuda.reset_accumulated_memory_stats(): totals restart at zero.
  void reset_accumulated();
  // As torch.cuda.empty_cache(): segments that are one free block go back
  // to the device, from the device's own pools and from private pools no
  // graph uses any more.
  void empty_cache();

  // Private pools, as CUDA graphs use them (c10's graph_pools): a pool is
  // named by a positive number. While requests are routed to one, it
  // serves them from its own segments, which nothing else takes; its free
  // blocks stay its own until it is released and empty_cache() frees them.
  //
  // Routes the requests on `stream` (every request where none is given, as
  // torch routes the current thread's) to pool `pool`, made here or used
  // once more (as c10's beginAllocateToPool). Throws std::invalid_argument
  // for a pool already routed to or already released.
  void begin_allocate_to_pool(int pool, std::optional<int> stream = std::nullopt);
  // Ends that routing (c10's endAllocateToPool); the pool keeps its use.
  void end_allocate_to_pool(int pool);
  // One use of the pool ends (c10's releasePool: a graph destroyed, a
  // warm-up's routing done); with none left, empty_cache() may free it.
  // Throws std::invalid_argument for a pool with no use left or one still
  // routed to.
  void release_pool(int pool);

  // CUDA graph trees return a private pool to the layout it had after an
  // earlier recording, to record another path of the tree from there.
  // A block of a checkpoint: its address, size, whether it was allocated
  // (and to which buffer), and its stream.
  struct PoolBlock {
    std::int64_t address, size;
    bool allocated;
    int stream;
    std::uint32_t buffer = 0;
  };
  // c10's PrivatePoolState: the pool's segments, each as its blocks in
  // address order. c10 lists first the segments whose first block is
  // allocated, in the order of a hash set of its Block objects' host
  // addresses, which no simulation can know and which sets how high
  // allocated_bytes peaks while a restore lays them out: here in the order
  // that peaks highest (fewest free bytes first), so that the simulated
  // peak bounds the real one. Then those whose first block is free, small
  // pool first, as its free lists order them.
  struct PoolCheckpoint {
    int pool = 0;
    std::vector<std::vector<PoolBlock>> segments;
    // The blocks it has allocated, in its order.
    std::vector<PoolBlock> allocated_blocks() const;
  };
  // c10's getCheckpointState. Throws std::invalid_argument for a block
  // freed while other streams use it (c10: "Events should have
  // synchronized when checkpointing block").
  PoolCheckpoint checkpoint_pool(int pool) const;
  // c10's setCheckpointPoolState: every block the pool holds is freed, then
  // each checkpointed segment is laid out again, all its blocks allocated
  // (allocated_bytes peaks there) and those free in the checkpoint freed.
  // The block buffer held_by[i] held at the checkpoint is then held by
  // buffers[i], and a malloc of it does not allocate again. Throws
  // std::invalid_argument where the pool does not hold the checkpoint's
  // segments (an allocator of other settings than the trace's) or a block
  // has no new holder.
  void restore_pool(const PoolCheckpoint& checkpoint, const std::vector<std::uint32_t>& held_by,
                    const std::vector<std::uint32_t>& buffers);
  // The buffers pool `pool` holds now, by address.
  std::map<std::int64_t, std::uint32_t> allocations_in_pool(int pool) const;
  // Checkpoints as a trace numbers them (AllocatorCall::PoolCheckpoint).
  const PoolCheckpoint& checkpoint(std::uint32_t number) const { return checkpoints_.at(number); }

  void on_alloc(std::uint32_t buffer, std::int64_t bytes, std::int64_t, int stream, int pool) override {
    malloc_in_pool(buffer, bytes, stream, pool);
  }
  void on_record_stream(std::uint32_t buffer, int stream) override { record_stream(buffer, stream); }
  void on_free(std::uint32_t buffer) noexcept override { free(buffer); }
  void on_allocator_call(const AllocatorCall& call) override;

  const AllocatorStats& stats() const { return stats_; }
  // The address of buffer `id`'s block, or kUnallocated where it holds none.
  std::int64_t address_of(std::uint32_t id) const {
    return id < address_of_.size() ? address_of_[id] : kUnallocated;
  }
  std::int64_t allocated_bytes() const { return stats_.allocated_bytes[0].current; }
  std::int64_t reserved_bytes() const { return stats_.reserved_bytes[0].current; }
  std::int64_t peak_allocated_bytes() const { return stats_.allocated_bytes[0].peak; }
  std::int64_t peak_reserved_bytes() const { return stats_.reserved_bytes[0].peak; }

  struct Block {
    std::int64_t segment, size;
    int pool = 0;  // 0: the device's own pools; else the private pool's number
    bool allocated;
    bool small_pool;  // from a small-pool (2 MiB) segment
    std::int64_t requested = 0;  // the bytes asked for, while allocated
    std::int64_t gc_count_base = 0;  // the pool's get_free_block calls when it was last put back
    // False for address space of an expandable segment with no memory
    // mapped behind it (never allocated; counts in no statistic).
    bool mapped = true;
    int stream = 0;  // its segment's
    // Used on other streams too (record_stream): its free waits for them.
    bool used_elsewhere = false;
    // Freed while used on other streams: held, as if allocated, until
    // their work is done.
    bool awaiting_streams = false;

    // As torch.cuda.memory_snapshot() names a block's state.
    const char* state() const {
      return !allocated ? "inactive" : awaiting_streams ? "active_pending_free" : "active_allocated";
    }
  };
  // A cudaMalloc'd segment, or the address space an expandable segment
  // reserves (its blocks cover it: mapped ones and unmapped ones).
  struct Segment {
    std::int64_t size;
    bool expandable;
    int stream = 0;
    int pool = 0;
  };
  // torch.cuda.memory_snapshot()'s segments: each cudaMalloc'd segment, and
  // each contiguous mapped range of an expandable one, with the bytes its
  // allocated blocks hold and were asked for, and its active blocks (also
  // those freed that wait for other streams).
  struct SnapshotSegment {
    std::int64_t address, size;
    int stream;
    bool small_pool, expandable;
    std::int64_t allocated = 0, requested = 0, active = 0;
  };
  // Blocks by address; segments by base address.
  const std::map<std::int64_t, Block>& blocks() const { return blocks_; }
  const std::map<std::int64_t, Segment>& segments() const { return segments_; }
  std::vector<SnapshotSegment> snapshot_segments() const;

 private:
  using Blocks = std::map<std::int64_t, Block>;
  // c10's order within a pool: by stream, then size, then address. The
  // pools (the device's and each private one) are kept in one set,
  // ordered by pool first.
  struct FreeBlock {
    int pool, stream;
    std::int64_t size, address;
    auto operator<=>(const FreeBlock&) const = default;
  };
  using FreeBlocks = std::set<FreeBlock>;
  FreeBlocks& free_blocks(bool small_pool) { return small_pool ? free_small_ : free_large_; }
  void erase_free(std::int64_t address, const Block& block) {
    free_blocks(block.small_pool).erase({block.pool, block.stream, block.size, address});
  }
  // Unmapped blocks by (pool, stream, address), as c10 orders them in a pool.
  using Unmapped = std::set<std::tuple<int, int, std::int64_t>>;
  Unmapped& unmapped(bool small_pool) { return small_pool ? unmapped_small_ : unmapped_large_; }
  // Puts a free block back in its pool (c10's insert_into_blocks).
  void insert_free(std::int64_t address, Block& block);
  // c10's get_free_block: a cached block of `pool` and `stream` for
  // `rounded` bytes, or none.
  std::optional<std::int64_t> get_free_block(int pool, bool small_pool, int stream, std::int64_t rounded);
  // c10's should_split: whether a block handed out for `rounded` bytes
  // leaves its remainder as a free block.
  bool should_split(const Block& block, std::int64_t rounded) const;
  // c10's alloc_block: a new segment of `size` bytes for a request of
  // `rounded` (with expandable segments: `rounded` bytes mapped), or none
  // where the device is full.
  std::optional<std::int64_t> alloc_block(int pool, bool small_pool, int stream, std::int64_t size,
                                          std::int64_t rounded, bool retry);
  // c10's try_merge_blocks on both sides: `it` absorbs its free neighbours
  // in the segment that are mapped as it is. Returns the merged block and
  // how many blocks and bytes it absorbed.
  struct Merged {
    Blocks::iterator block;
    std::int64_t blocks = 0, bytes = 0;
  };
  Merged merge_neighbours(Blocks::iterator it);
  // Expandable segments (c10's find_expandable_block,
  // try_allocate_expandable_block, map_block, unmap_block): one address
  // space per pool, as large as the device's memory and an eighth, with
  // memory mapped into it in pages as needed: 2 MiB in the small pool,
  // large_segment_size_mb (20 MiB) in the large.
  std::int64_t page_size(bool small_pool) const { return small_pool ? kSmallBuffer : config_.large_segment_size; }
  std::int64_t find_expandable_block(int pool, bool small_pool, int stream, std::int64_t rounded);
  std::optional<std::int64_t> try_allocate_expandable_block(int pool, bool small_pool, int stream,
                                                            std::int64_t rounded);
  std::optional<std::int64_t> map_block(std::int64_t address, std::int64_t bytes);
  std::optional<std::int64_t> unmap_block(std::int64_t address);
  // c10's release_available_cached_blocks, release_cached_blocks and
  // garbage_collect_cached_blocks: segments back to the device.
  bool release_available_cached_blocks(int pool, bool small_pool, int stream, std::int64_t rounded);
  void release_cached_blocks();
  // c10's release_blocks: the pool's cached whole segments go back (with
  // expandable segments, the whole pages of its free blocks).
  void release_blocks(int pool);
  void garbage_collect_cached_blocks();
  void release_block(std::int64_t address);
  // c10's alloc_found_block: free block `address` (out of the free lists)
  // handed out for `rounded` bytes, `requested` asked for; `split` leaves
  // the rest a free block.
  void take_block(std::int64_t address, std::int64_t rounded, std::int64_t requested, bool split);
  // c10's free(Block*): an allocated block is freed, once the other
  // streams that used it are done.
  void free_allocation(Blocks::iterator it);
  void bind(std::uint32_t id, std::int64_t address);
  // c10's free_block: a block no stream uses any more goes back to its
  // pool, merged with its free neighbours.
  void free_block(Blocks::iterator it);
  // c10's process_events: blocks freed while other streams used them go
  // back (their events are complete).
  void process_events();
  bool garbage_collecting() const { return config_.garbage_collection_threshold > 0 && allowed_maximum_; }
  void notify(const char* action, std::int64_t address, std::int64_t size) const {
    // The stream of the segment the address is in.
    if (listener_) listener_({action, address, size, std::prev(blocks_.upper_bound(address))->second.stream});
  }
  // A block is split while it is not its whole segment.
  bool is_split(const Block& block) const { return block.size != segments_.at(block.segment).size; }
  // Adds `amount` to `stat` for all blocks and for the block's pool.
  static void add(AllocatorStatArray& stat, bool small_pool, std::int64_t amount);

  Blocks blocks_;
  std::map<std::int64_t, Segment> segments_;
  FreeBlocks free_small_, free_large_;
  Unmapped unmapped_small_, unmapped_large_;  // unmapped blocks of expandable segments
  std::vector<std::int64_t> awaiting_streams_;  // freed blocks that other streams used
  std::array<std::int64_t, 2> get_free_block_calls_{};  // per pool (large, small): the blocks' gc clock
  std::vector<std::int64_t> address_of_;  // by id; kUnallocated where it holds no block
  std::vector<PoolCheckpoint> checkpoints_;  // as the trace numbers them
  AllocatorConfig config_;
  std::int64_t device_memory_;
  std::optional<std::int64_t> allowed_maximum_;  // per_process_memory_fraction of device_memory_
  std::int64_t address_space_;  // an expandable segment's, before rounding to its pages
  std::int64_t next_segment_address_ = 0;
  // Private pools by number: how many uses each has (c10's use_count); a
  // pool with none is freeable, and forgotten once it holds no segment.
  std::map<int, int> pool_uses_;
  std::set<int> released_pools_;  // numbers that cannot be used again
  PoolRoutes routes_;  // a routing that names no stream takes every request
  AllocatorStats stats_;
  Listener listener_;
};

// The allocator run on a trace as it is recorded: its state at each
// moment (torch.cuda's memory statistics in a Python trace). A kernel that
// falls back on a smaller workspace where the allocator runs out (cuDNN's
// engines) takes the first that an allocator of `capacity` bytes grants
// (what the GPU leaves it). The simulation goes on past that capacity,
// unless the setup's device memory stops it (MemoryExceeded); once the
// step has held more, a real run would have run out of memory, and every
// kernel takes its first engine, as on a GPU with room.
class AllocatorAlongTrace : public AllocationObserver {
 public:
  AllocatorAlongTrace(const AllocatorSetup& setup, std::int64_t capacity) : sim(setup), capacity_(capacity) {}
  void on_alloc(std::uint32_t buffer, std::int64_t bytes, std::int64_t, int stream, int pool) override {
    sim.malloc_in_pool(buffer, bytes, stream, pool);
    past_capacity_ |= sim.allocated_bytes() > capacity_;
  }
  void on_record_stream(std::uint32_t buffer, int stream) override { sim.record_stream(buffer, stream); }
  void on_free(std::uint32_t buffer) noexcept override { sim.free(buffer); }
  void on_allocator_call(const AllocatorCall& call) override { sim.on_allocator_call(call); }
  std::optional<std::size_t> first_granted(const std::vector<std::int64_t>& sizes, int stream, int pool) override {
    if (past_capacity_) return 0;
    return sim.first_granted(sizes, stream, pool, capacity_);
  }

  CachingAllocatorSim sim;

 private:
  std::int64_t capacity_;
  bool past_capacity_ = false;
};

// Stops the trace (MemoryExceeded) where the allocator runs out of the
// setup's device memory after freeing its cache, as torch.cuda would raise.
class ReservedBytesLimit final : public AllocatorAlongTrace {
 public:
  explicit ReservedBytesLimit(const AllocatorSetup& setup) : AllocatorAlongTrace(setup, setup.device_memory) {}
  // The most the trace's allocator reserved (its measured step's peak too).
  std::int64_t reserved_bytes() const { return sim.peak_reserved_bytes(); }
};

}  // namespace metamem
