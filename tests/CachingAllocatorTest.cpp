// CachingAllocatorSim against cases worked out by hand from PyTorch's rules.
#include <gtest/gtest.h>

#include <sstream>
#include <stdexcept>

#include "estimator/AllocatorConfig.h"
#include "estimator/AllocatorEvents.h"
#include "estimator/CachingAllocator.h"

namespace metamem {
namespace {

constexpr std::int64_t KiB = 1024, MiB = 1024 * 1024;

TEST(CachingAllocator, RoundsRequestsTo512Bytes) {
  CachingAllocatorSim sim;
  EXPECT_EQ(sim.round_size(1), 512);
  EXPECT_EQ(sim.round_size(512), 512);
  EXPECT_EQ(sim.round_size(513), 1024);
  sim.malloc(1, 1);
  EXPECT_EQ(sim.allocated_bytes(), 512);
  EXPECT_EQ(sim.reserved_bytes(), 2 * MiB);  // a small-pool segment
}

// roundup_power2_divisions:4 splits each power-of-two interval in 4 steps,
// for requests above 512·4 bytes.
TEST(CachingAllocator, RoundupPower2Divisions) {
  const CachingAllocatorSim four(4);
  EXPECT_EQ(four.round_size(2000), 2048);                    // below 2 KiB: 512-byte rounding
  EXPECT_EQ(four.round_size(3000), 3072);                    // (2048, 4096] in steps of 512
  EXPECT_EQ(four.round_size(4096), 4096);                    // powers of two stay
  EXPECT_EQ(four.round_size(1 * MiB + 1), 1 * MiB + 256 * KiB);
  const CachingAllocatorSim eight(8);
  EXPECT_EQ(eight.round_size(5 * MiB + 1), 5 * MiB + 512 * KiB);
  EXPECT_EQ(CachingAllocatorSim(1).round_size(5000), 5120);  // one division: 512-byte rounding (torch 2.x)
}

TEST(CachingAllocator, SmallAndLargePoolsGetTheirOwnSegments) {
  CachingAllocatorSim sim;
  sim.malloc(1, 1 * MiB);      // largest small request: a 2 MiB small segment
  sim.malloc(2, 1 * MiB + 1);  // large pool: a 20 MiB segment
  EXPECT_EQ(sim.reserved_bytes(), 2 * MiB + 20 * MiB);
  sim.malloc(3, 12 * MiB);  // the large segment's free rest holds it
  sim.malloc(4, 512 * KiB);  // the small segment's free rest holds it
  EXPECT_EQ(sim.segments().size(), 2u);
  sim.malloc(5, 31 * MiB + 1);  // >= 10 MiB: a segment of its size rounded to 2 MiB
  EXPECT_EQ(sim.reserved_bytes(), 2 * MiB + 20 * MiB + 32 * MiB);
  EXPECT_EQ(sim.allocated_bytes(),
            1 * MiB + (1 * MiB + 512) + 12 * MiB + 512 * KiB + 32 * MiB);  // < 1 MiB left: unsplit
}

// 11.5 MiB on a fresh segment: the segment is 12 MiB and the 0.5 MiB left is
// not worth a split (large pool: > 1 MiB), so all 12 MiB count as allocated.
// The same request in a free 20 MiB block leaves 8.5 MiB: split.
TEST(CachingAllocator, SplitRuleOfTheLargePool) {
  CachingAllocatorSim fresh;
  fresh.malloc(1, 11 * MiB + 512 * KiB);
  EXPECT_EQ(fresh.reserved_bytes(), 12 * MiB);
  EXPECT_EQ(fresh.allocated_bytes(), 12 * MiB);

  CachingAllocatorSim reused;
  reused.malloc(1, 8 * MiB);  // 20 MiB segment, split
  EXPECT_EQ(reused.allocated_bytes(), 8 * MiB);
  reused.free(1);
  reused.malloc(2, 11 * MiB + 512 * KiB);
  EXPECT_EQ(reused.reserved_bytes(), 20 * MiB);
  EXPECT_EQ(reused.allocated_bytes(), 11 * MiB + 512 * KiB);
}

// A 2 MiB small segment split for 1,000 bytes keeps 2 MiB - 1 KiB free for
// the next small requests.
TEST(CachingAllocator, SmallPoolSplitsRemaindersOf512BytesOrMore) {
  CachingAllocatorSim sim;
  sim.malloc(1, 1000);
  EXPECT_EQ(sim.allocated_bytes(), 1024);
  sim.malloc(2, 1 * MiB);
  sim.malloc(3, 1 * MiB - 1024);  // exactly what is left
  EXPECT_EQ(sim.segments().size(), 1u);
  EXPECT_EQ(sim.allocated_bytes(), 2 * MiB);
  EXPECT_EQ(sim.blocks().size(), 3u);
}

TEST(CachingAllocator, FreedBlocksMergeWithFreeNeighbours) {
  CachingAllocatorSim sim;
  sim.malloc(1, 4 * MiB);  // one 20 MiB segment: a | b | c | rest
  sim.malloc(2, 4 * MiB);
  sim.malloc(3, 4 * MiB);
  sim.free(1);
  sim.free(3);  // merges with the rest
  sim.free(2);  // merges with both sides: one free 20 MiB block
  EXPECT_EQ(sim.blocks().size(), 1u);
  sim.malloc(4, 18 * MiB);  // only fits merged
  EXPECT_EQ(sim.segments().size(), 1u);
  EXPECT_EQ(sim.reserved_bytes(), 20 * MiB);
}

TEST(CachingAllocator, ReservedNeverShrinks) {
  CachingAllocatorSim sim;
  sim.malloc(1, 30 * MiB);
  sim.malloc(2, 512);
  sim.free(1);
  sim.free(2);
  EXPECT_EQ(sim.allocated_bytes(), 0);
  EXPECT_EQ(sim.reserved_bytes(), 30 * MiB + 2 * MiB);
  EXPECT_EQ(sim.peak_reserved_bytes(), 32 * MiB);
  EXPECT_EQ(sim.peak_allocated_bytes(), 30 * MiB + 512);
  sim.reset_peaks();
  EXPECT_EQ(sim.peak_allocated_bytes(), 0);
  EXPECT_EQ(sim.peak_reserved_bytes(), 32 * MiB);
}

// torch.cuda.memory_stats() per pool, counted as c10 counts them: a free
// block of a split segment is an inactive split block until it merges back.
TEST(CachingAllocator, StatsPerPoolAsC10CountsThem) {
  constexpr int all = 0, small = 1, large = 2;
  CachingAllocatorSim sim;
  sim.malloc(1, 100);  // a 2 MiB small segment, split: 512 B out, the rest inactive
  sim.malloc(2, 5 * MiB);  // a 20 MiB large segment, split: 15 MiB inactive
  const AllocatorStats& s = sim.stats();
  EXPECT_EQ(s.requested_bytes[all].current, 100 + 5 * MiB);
  EXPECT_EQ(s.allocated_bytes[small].current, 512);
  EXPECT_EQ(s.allocated_bytes[large].current, 5 * MiB);
  EXPECT_EQ(s.segment[all].current, 2);
  EXPECT_EQ(s.reserved_bytes[large].current, 20 * MiB);
  EXPECT_EQ(s.inactive_split[all].current, 2);
  EXPECT_EQ(s.inactive_split_bytes[small].current, 2 * MiB - 512);
  EXPECT_EQ(s.inactive_split_bytes[large].current, 15 * MiB);

  sim.malloc(3, 1000);  // from the small remainder, which shrinks by 1 KiB
  EXPECT_EQ(s.inactive_split[small].current, 1);
  EXPECT_EQ(s.inactive_split_bytes[small].current, 2 * MiB - 1536);
  sim.free(1);  // 512 B free beside an allocated block: a second inactive split block
  EXPECT_EQ(s.inactive_split[small].current, 2);
  EXPECT_EQ(s.inactive_split_bytes[small].current, 2 * MiB - 1024);
  sim.free(3);  // merges both neighbours: the segment is whole again
  EXPECT_EQ(s.inactive_split[small].current, 0);
  EXPECT_EQ(s.inactive_split[small].peak, 2);
  EXPECT_EQ(s.inactive_split_bytes[small].current, 0);
  EXPECT_EQ(s.active[all].current, 1);
  EXPECT_EQ(s.active_bytes[all].current, 5 * MiB);
  EXPECT_EQ(s.allocation[small].allocated, 2);
  EXPECT_EQ(s.allocation[small].freed, 2);
  EXPECT_EQ(s.requested_bytes[small].freed, 1100);
  EXPECT_EQ(s.allocated_bytes[all].peak, 5 * MiB + 1536);

  sim.reset_accumulated();
  EXPECT_EQ(s.allocation[small].allocated, 0);
  EXPECT_EQ(s.allocated_bytes[all].freed, 0);
  EXPECT_EQ(s.allocated_bytes[all].current, 5 * MiB);
  EXPECT_EQ(s.num_device_alloc, 0);
}

TEST(CachingAllocator, EmptyCacheReleasesSegmentsThatAreOneFreeBlock) {
  CachingAllocatorSim sim;
  sim.malloc(1, 30 * MiB);
  sim.malloc(2, 512);
  sim.malloc(3, 5 * MiB);
  sim.free(1);
  sim.free(3);
  sim.empty_cache();  // the 30 MiB and 20 MiB segments go; the small one holds a block
  EXPECT_EQ(sim.reserved_bytes(), 2 * MiB);
  EXPECT_EQ(sim.peak_reserved_bytes(), 52 * MiB);
  EXPECT_EQ(sim.stats().segment[0].current, 1);
  EXPECT_EQ(sim.stats().num_device_free, 2);
  EXPECT_EQ(sim.stats().num_sync_all_streams, 1);
  sim.malloc(4, 30 * MiB);  // no cached block left for it
  EXPECT_EQ(sim.reserved_bytes(), 32 * MiB);
  EXPECT_EQ(sim.stats().num_device_alloc, 4);
  sim.free(2);
  sim.free(4);
  sim.empty_cache();
  EXPECT_EQ(sim.reserved_bytes(), 0);
  EXPECT_TRUE(sim.blocks().empty());
}

TEST(CachingAllocator, ZeroBytesAllocateNothing) {
  CachingAllocatorSim sim;
  sim.malloc(1, 0);
  sim.free(1);
  EXPECT_EQ(sim.reserved_bytes(), 0);
}

// max_split_size_mb:40: a 50 MiB block is never split, serves a 45 MiB
// request (within 20 MiB of it), and no request under 40 MiB.
TEST(CachingAllocator, BlocksOfMaxSplitSizeAreNotSplit) {
  CachingAllocatorSim sim(parse_allocator_config("max_split_size_mb:40"));
  EXPECT_EQ(sim.stats().max_split_size, 40 * MiB);
  sim.malloc(1, 50 * MiB);
  EXPECT_EQ(sim.stats().oversize_allocations.current, 1);
  EXPECT_EQ(sim.stats().oversize_segments.current, 1);
  sim.free(1);
  sim.malloc(2, 45 * MiB);
  EXPECT_EQ(sim.reserved_bytes(), 50 * MiB);  // the cached block, whole
  EXPECT_EQ(sim.allocated_bytes(), 50 * MiB);
  sim.free(2);
  sim.malloc(3, 30 * MiB);
  EXPECT_EQ(sim.reserved_bytes(), 80 * MiB);  // a new segment: the oversize block serves no smaller request
}

// Out of device memory, c10 frees cached whole segments and retries once
// before it gives up.
TEST(CachingAllocator, OutOfMemoryFreesTheCacheThenFails) {
  CachingAllocatorSim sim(AllocatorConfig{}, 100 * MiB);
  sim.malloc(1, 60 * MiB);
  sim.free(1);
  sim.malloc(2, 80 * MiB);  // 60 MiB cached and 80 more would pass 100: the cache goes
  EXPECT_EQ(sim.reserved_bytes(), 80 * MiB);
  EXPECT_EQ(sim.stats().num_alloc_retries, 1);
  EXPECT_EQ(sim.stats().num_device_free, 1);
  EXPECT_THROW(sim.malloc(3, 30 * MiB), MemoryExceeded);
  EXPECT_EQ(sim.stats().num_ooms, 1);
  EXPECT_EQ(sim.allocated_bytes(), 80 * MiB);
}

// cuDNN's engines in turn: which workspace a device of some memory grants,
// each refusal giving the cached segments back, the allocator itself left
// as it was (a trace's goes on without a limit).
TEST(CachingAllocator, FirstGrantedTriesRequestsInTurnOnACopy) {
  CachingAllocatorSim sim;
  sim.malloc(1, 40 * MiB);
  sim.malloc(2, 30 * MiB);
  sim.free(2);  // 30 MiB cached
  const std::vector<std::int64_t> workspaces{90 * MiB, 50 * MiB, 12 * MiB};
  EXPECT_EQ(sim.first_granted(workspaces, 0, 0, 200 * MiB), 0u);
  // 100 MiB: 90 does not fit beside 70 reserved, nor beside 40 once the
  // cache is given back; then 50 does.
  EXPECT_EQ(sim.first_granted(workspaces, 0, 0, 100 * MiB), 1u);
  // 60 MiB: only 12, in a segment of its own beside the 40 held.
  EXPECT_EQ(sim.first_granted(workspaces, 0, 0, 60 * MiB), 2u);
  EXPECT_EQ(sim.first_granted({90 * MiB, 50 * MiB}, 0, 0, 60 * MiB), std::nullopt);
  EXPECT_EQ(sim.first_granted({90 * MiB, 0}, 0, 0, 10 * MiB), 1u);  // no workspace at all
  EXPECT_EQ(sim.reserved_bytes(), 70 * MiB);
  EXPECT_EQ(sim.allocated_bytes(), 40 * MiB);
  EXPECT_EQ(sim.stats().num_ooms, 0);
}

// per_process_memory_fraction limits what the allocator reserves, below the
// device's memory.
TEST(CachingAllocator, MemoryFractionLimitsReserved) {
  CachingAllocatorSim sim(parse_allocator_config("per_process_memory_fraction:0.5"), 100 * MiB);
  sim.malloc(1, 40 * MiB);
  EXPECT_THROW(sim.malloc(2, 20 * MiB), MemoryExceeded);
}

// expandable_segments:True: one address space per pool (the device's memory
// and an eighth: here 200 + 25 MiB, 12 pages of 20 MiB), memory mapped
// into it a page at a time where a block must grow; no segment counted,
// no inactive split blocks; free pages unmapped by empty_cache.
TEST(CachingAllocator, ExpandableSegmentsGrowInPlace) {
  CachingAllocatorSim sim(parse_allocator_config("expandable_segments:True"), 200 * MiB);
  const AllocatorStats& s = sim.stats();
  sim.malloc(1, 6 * MiB);  // maps one page: [0, 6) allocated, [6, 20) free, [20, 240) unmapped
  const std::int64_t base = sim.blocks().begin()->first;
  EXPECT_EQ(sim.segments().at(base).size, 240 * MiB);
  EXPECT_EQ(sim.reserved_bytes(), 20 * MiB);
  EXPECT_EQ(s.segment[0].current, 0);
  EXPECT_EQ(s.num_device_alloc, 1);
  sim.malloc(2, 9 * MiB);  // [6, 15), leaving [15, 20) free before the unmapped rest
  sim.free(1);
  EXPECT_EQ(s.inactive_split[0].current, 0);
  // Best fit counts a block before unmapped space as large as it could
  // grow: the 5 MiB request goes to [0, 6), not to [15, 20).
  sim.malloc(3, 5 * MiB);
  EXPECT_TRUE(sim.blocks().at(base).allocated);
  EXPECT_EQ(sim.blocks().at(base).size, 5 * MiB);  // split to 512 bytes in any pool
  // 30 MiB: [15, 20) grows by two pages and holds it, where without
  // expandable segments a new 30 MiB segment would.
  sim.malloc(4, 30 * MiB);
  EXPECT_TRUE(sim.blocks().at(base + 15 * MiB).allocated);
  EXPECT_EQ(sim.reserved_bytes(), 60 * MiB);
  EXPECT_EQ(s.num_device_alloc, 2);  // one map call for both pages
  sim.free(4);  // [15, 60) free
  sim.empty_cache();  // unmaps the whole pages [20, 60); [15, 20) stays mapped
  EXPECT_EQ(sim.reserved_bytes(), 20 * MiB);
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(sim.snapshot_segments().size(), 1u);
  EXPECT_EQ(sim.snapshot_segments()[0].size, 20 * MiB);
  sim.free(2);
  sim.free(3);
  sim.empty_cache();  // nothing mapped is left: the address space goes too
  EXPECT_EQ(sim.reserved_bytes(), 0);
  EXPECT_TRUE(sim.segments().empty());
  EXPECT_EQ(s.reserved_bytes[0].peak, 60 * MiB);
}

// Out of memory with expandable segments, c10 unmaps the free pages and
// retries: the freed pages come back where the request fits.
TEST(CachingAllocator, ExpandableSegmentsUnmapFreePagesOnOutOfMemory) {
  CachingAllocatorSim sim(parse_allocator_config("expandable_segments:True"), 70 * MiB);  // 4 pages of address space
  for (std::uint32_t id : {1, 2, 3}) sim.malloc(id, 20 * MiB);
  sim.free(1);
  sim.free(3);  // [0, 20) and [40, 60) free, [60, 80) unmapped
  const std::int64_t base = sim.blocks().begin()->first;
  sim.malloc(4, 40 * MiB);  // [40, 80) needs a fourth page: 80 MiB > 70
  EXPECT_EQ(sim.stats().num_alloc_retries, 1);
  EXPECT_EQ(sim.stats().num_device_free, 2);  // [0, 20) and [40, 60) unmapped first
  EXPECT_TRUE(sim.blocks().at(base + 40 * MiB).allocated);
  EXPECT_EQ(sim.reserved_bytes(), 60 * MiB);
  EXPECT_THROW(sim.malloc(5, 20 * MiB), MemoryExceeded);
  EXPECT_EQ(sim.stats().num_ooms, 1);
}

// A segment is its stream's: a block freed on one stream is cached for
// that stream alone.
TEST(CachingAllocator, StreamsHaveTheirOwnSegments) {
  CachingAllocatorSim sim;
  sim.malloc(1, 30 * MiB, 1);
  sim.free(1);
  sim.malloc(2, 30 * MiB);  // stream 0 cannot take stream 1's cached block
  EXPECT_EQ(sim.reserved_bytes(), 60 * MiB);
  sim.malloc(3, 30 * MiB, 1);  // stream 1 can
  EXPECT_EQ(sim.reserved_bytes(), 60 * MiB);
  EXPECT_EQ(sim.stats().segment[0].current, 2);
}

// record_stream: the free waits until the other stream's work is done,
// which the fake runtime's events say at once, so the next malloc (or
// empty_cache) finds it: until then the block stays active, not allocated.
TEST(CachingAllocator, RecordedStreamsDelayTheFreeToTheNextMalloc) {
  CachingAllocatorSim sim;
  sim.malloc(1, 4 * MiB);
  sim.record_stream(1, 0);  // its own stream: nothing to wait for
  sim.record_stream(1, 2);
  sim.free(1);
  EXPECT_EQ(sim.allocated_bytes(), 0);
  EXPECT_EQ(sim.stats().active_bytes[0].current, 4 * MiB);
  sim.malloc(2, 4 * MiB);  // the pending block goes back first, and serves
  EXPECT_EQ(sim.stats().active_bytes[0].current, 4 * MiB);
  EXPECT_EQ(sim.reserved_bytes(), 20 * MiB);
  sim.record_stream(2, 3);
  sim.free(2);
  sim.empty_cache();  // waits for every stream, then gives the segment back
  EXPECT_EQ(sim.stats().active_bytes[0].current, 0);
  EXPECT_EQ(sim.reserved_bytes(), 0);
}

TEST(CachingAllocator, FirstDifferenceNamesTheStatisticAsTorchDoes) {
  AllocatorStats a, b;
  EXPECT_EQ(first_difference(a, b), "");
  b.num_ooms = 1;
  EXPECT_EQ(first_difference(a, b), "num_ooms: 0 vs 1");
  b.reserved_bytes[2].peak = 4096;
  EXPECT_EQ(first_difference(a, b), "reserved_bytes.large_pool.peak: 0 vs 4096");
}

TEST(AllocatorConfig, ParsesAsTorchDoes) {
  const AllocatorConfig intervals = parse_allocator_config("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]");
  EXPECT_EQ(intervals.divisions_for(1 * MiB), 1);      // before the first interval named: its value
  EXPECT_EQ(intervals.divisions_for(300 * MiB), 1);    // [256 MiB, 512 MiB)
  EXPECT_EQ(intervals.divisions_for(600 * MiB), 2);
  EXPECT_EQ(intervals.divisions_for(1536 * MiB), 8);   // '>' fills from the last interval named on
  EXPECT_EQ(intervals.divisions_for(64 * 1024 * MiB), 8);
  const AllocatorConfig several = parse_allocator_config(
      " max_split_size_mb:64, garbage_collection_threshold:0.5,per_process_memory_fraction:1,"
      "large_segment_size_mb:40,expandable_segments:False");
  EXPECT_EQ(several.max_split_size, 64 * MiB);
  EXPECT_EQ(several.garbage_collection_threshold, 0.5);
  EXPECT_EQ(several.per_process_memory_fraction, 1);
  EXPECT_EQ(several.large_segment_size, 40 * MiB);
  EXPECT_FALSE(several.expandable_segments);
}

TEST(AllocatorConfig, RefusesWhatTorchRefuses) {
  EXPECT_EQ(parse_allocator_config("large_segment_size_mb:11").large_segment_size, 11 * MiB);
  for (const char* bad : {"max_split_size_mb:19", "large_segment_size_mb:10", "roundup_power2_divisions:3", "garbage_collection_threshold:1",
                          "expandable_segments:yes", "max_split_size_mb", "nonsense:1",
                          "backend:cudaMallocAsync", "roundup_power2_divisions:[300:2]"})
    EXPECT_THROW(parse_allocator_config(bad), std::invalid_argument) << bad;
}

// A CUDA graph's private pool: what is allocated while requests are routed
// to it comes from segments of its own, which the device's requests never
// take, and which stay reserved until the pool is released and emptied.
TEST(CachingAllocator, PrivatePoolsKeepTheirOwnSegments) {
  CachingAllocatorSim sim;
  sim.malloc(1, 3 * MiB);
  sim.free(1);  // a free 20 MiB segment of the device's own pool
  sim.begin_allocate_to_pool(1);
  sim.malloc(2, 3 * MiB);  // not in that free segment: one of the pool's
  EXPECT_EQ(sim.reserved_bytes(), 40 * MiB);
  sim.malloc(3, 5 * MiB);  // the pool's segment holds it
  sim.end_allocate_to_pool(1);
  sim.malloc(4, 3 * MiB);  // the device's free segment again
  EXPECT_EQ(sim.reserved_bytes(), 40 * MiB);
  EXPECT_EQ(sim.allocated_bytes(), 11 * MiB);
  sim.free(2);
  sim.free(3);
  sim.free(4);
  sim.empty_cache();  // the pool is in use: only the device's segment goes
  EXPECT_EQ(sim.reserved_bytes(), 20 * MiB);
  sim.release_pool(1);
  sim.empty_cache();
  EXPECT_EQ(sim.reserved_bytes(), 0);
  EXPECT_TRUE(sim.segments().empty());
}

// torch.cuda.graph routes its capture stream's requests; cudagraph trees
// route a thread's (every request). The latest routing that takes a
// request serves it.
TEST(CachingAllocator, RoutingsByStreamLatestFirst) {
  CachingAllocatorSim sim;
  sim.begin_allocate_to_pool(1, 1);
  sim.malloc(1, 100, 0);  // the default stream's: the device's pool
  sim.malloc(2, 100, 1);  // the pool's
  sim.begin_allocate_to_pool(2);
  sim.malloc(3, 100, 1);  // pool 2's, begun later
  const auto pool_of = [&](std::int64_t segment_index) {
    return std::next(sim.segments().begin(), segment_index)->second.pool;
  };
  ASSERT_EQ(sim.segments().size(), 3u);
  EXPECT_EQ(pool_of(0), 0);
  EXPECT_EQ(pool_of(1), 1);
  EXPECT_EQ(pool_of(2), 2);
  sim.end_allocate_to_pool(2);
  sim.malloc(4, 100, 1);  // pool 1's segment has room
  EXPECT_EQ(sim.segments().size(), 3u);
}

// A stream that waits on a capturing stream's work is captured too: c10
// routes its requests to the graph's pool until the capture ends.
TEST(PoolRoutes, AStreamJoinsACaptureUntilItEnds) {
  PoolRoutes routes;
  routes.begin(1, 1);
  EXPECT_EQ(routes.pool_for(2), 0);
  routes.join(1, 2);
  routes.join(1, 2);  // joined already: nothing changes
  EXPECT_EQ(routes.pool_for(2), 1);
  EXPECT_EQ(routes.pool_for(1), 1);
  EXPECT_EQ(routes.pool_for(0), 0);
  routes.end(1);
  EXPECT_EQ(routes.pool_for(2), 0);
  EXPECT_EQ(routes.pool_for(1), 0);
  EXPECT_THROW(routes.join(1, 2), std::invalid_argument);  // no capture underway
  routes.begin(2, std::nullopt);
  EXPECT_THROW(routes.join(2, 3), std::invalid_argument);  // a thread's routing
}

TEST(CachingAllocator, RefusesPoolMisuse) {
  CachingAllocatorSim sim;
  EXPECT_THROW(sim.begin_allocate_to_pool(0), std::invalid_argument);
  EXPECT_THROW(sim.end_allocate_to_pool(1), std::invalid_argument);
  EXPECT_THROW(sim.release_pool(1), std::invalid_argument);
  sim.begin_allocate_to_pool(1);
  EXPECT_THROW(sim.begin_allocate_to_pool(1), std::invalid_argument);  // routed already
  EXPECT_THROW(sim.release_pool(1), std::invalid_argument);            // still routed
  sim.end_allocate_to_pool(1);
  sim.begin_allocate_to_pool(1);  // a second use
  sim.end_allocate_to_pool(1);
  sim.release_pool(1);
  sim.release_pool(1);
  EXPECT_THROW(sim.release_pool(1), std::invalid_argument);
  EXPECT_THROW(sim.begin_allocate_to_pool(1), std::invalid_argument);  // released: a new pool needs a new number
}

// A CUDA graph tree returns its pool to the layout it had after a recording
// (c10's setCheckpointPoolState): what the pool holds is freed, each
// checkpointed segment is allocated whole and then freed where the
// checkpoint had free blocks, and the checkpoint's allocated blocks go to
// new holders. Segments whose first block is allocated are laid out in the
// order that peaks highest, fewest free bytes first.
TEST(CachingAllocator, PoolsReturnToCheckpoints) {
  CachingAllocatorSim sim;
  sim.begin_allocate_to_pool(1);
  sim.malloc(5, 12 * MiB);  // a 12 MiB segment at 0, all allocated
  sim.malloc(1, 3 * MiB);   // a 20 MiB segment at 14 MiB: 3 allocated, 17 free
  AllocatorCall checkpoint;
  checkpoint.kind = AllocatorCall::Kind::PoolCheckpoint;
  checkpoint.pool = 1;
  sim.on_allocator_call(checkpoint);
  ASSERT_EQ(sim.checkpoint(0).segments.size(), 2u);
  EXPECT_EQ(sim.checkpoint(0).segments[0].front().address, 0);  // no free bytes: first
  sim.free(1);
  sim.malloc(3, 8 * MiB);  // split off the 20 MiB segment's start
  EXPECT_EQ(sim.allocated_bytes(), 20 * MiB);
  sim.reset_peaks();

  AllocatorCall restore;
  restore.kind = AllocatorCall::Kind::PoolRestore;
  restore.held_by = {1, 5};
  restore.buffers = {7, 6};
  sim.on_allocator_call(restore);
  // Freed to nothing; the 12 MiB segment allocated, then the 20 MiB one
  // whole (32 MiB), its 17 free MiB freed again.
  EXPECT_EQ(sim.peak_allocated_bytes(), 32 * MiB);
  EXPECT_EQ(sim.allocated_bytes(), 15 * MiB);
  EXPECT_EQ(sim.reserved_bytes(), 32 * MiB);
  EXPECT_EQ(sim.address_of(6), 0);
  EXPECT_EQ(sim.address_of(7), 14 * MiB);
  EXPECT_EQ(sim.address_of(3), CachingAllocatorSim::kUnallocated);
  EXPECT_EQ(sim.blocks().at(14 * MiB + 3 * MiB).size, 17 * MiB);
  EXPECT_FALSE(sim.blocks().at(14 * MiB + 3 * MiB).allocated);
  sim.malloc(7, 3 * MiB);  // a restored block's holder: allocated already
  EXPECT_EQ(sim.allocated_bytes(), 15 * MiB);
  sim.free(7);
  sim.free(6);
  EXPECT_EQ(sim.allocated_bytes(), 0);

  // Every block the checkpoint had allocated needs a holder.
  restore.held_by = {5};
  restore.buffers = {8};
  EXPECT_THROW(sim.on_allocator_call(restore), std::invalid_argument);
  CachingAllocatorSim expandable(parse_allocator_config("expandable_segments:True"));
  expandable.begin_allocate_to_pool(1);
  expandable.on_allocator_call(checkpoint);
  restore.held_by = restore.buffers = {};
  EXPECT_THROW(expandable.on_allocator_call(restore), std::invalid_argument);
}

TEST(AllocatorEvents, WrittenListsReadBack) {
  const std::vector<AllocatorEvent> events = {{AllocatorEvent::Kind::Alloc, 0, 4096},
                                              {AllocatorEvent::Kind::Alloc, 1, 512, 3},
                                              {AllocatorEvent::Kind::RecordStream, 1, 0, 5},
                                              {AllocatorEvent::Kind::Free, 1},
                                              {AllocatorEvent::Kind::ResetPeaks},
                                              {AllocatorEvent::Kind::PoolBegin, 0, 0, 2, 7},
                                              {AllocatorEvent::Kind::PoolEnd, 0, 0, 0, 7},
                                              {AllocatorEvent::Kind::PoolBegin, 0, 0, AllocatorEvent::kEveryStream, 7},
                                              {AllocatorEvent::Kind::PoolEnd, 0, 0, 0, 7},
                                              {AllocatorEvent::Kind::PoolRelease, 0, 0, 0, 7},
                                              {AllocatorEvent::Kind::Free, 0},
                                              {AllocatorEvent::Kind::EmptyCache},
                                              {AllocatorEvent::Kind::PoolBegin, 0, 0, AllocatorEvent::kEveryStream, 8},
                                              {AllocatorEvent::Kind::Alloc, 2, 4096},
                                              {AllocatorEvent::Kind::PoolCheckpoint, 0, 0, 0, 8},
                                              {AllocatorEvent::Kind::PoolRestore, 0, 0, 0, 0, {2}, {3}}};
  std::stringstream text;
  write_allocator_events(text, events);
  const std::vector<AllocatorEvent> read = read_allocator_events(text, "list");
  ASSERT_EQ(read.size(), events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(read[i].kind, events[i].kind);
    EXPECT_EQ(read[i].id, events[i].id);
    EXPECT_EQ(read[i].bytes, events[i].bytes);
    EXPECT_EQ(read[i].stream, events[i].stream);
    EXPECT_EQ(read[i].pool, events[i].pool);
    EXPECT_EQ(read[i].held_by, events[i].held_by);
    EXPECT_EQ(read[i].buffers, events[i].buffers);
  }
}

TEST(AllocatorEvents, BadListsNameTheLine) {
  auto error_of = [](const std::string& text) {
    std::istringstream in(text);
    try {
      read_allocator_events(in, "f.txt");
    } catch (const std::invalid_argument& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of("alloc 1 2\n"), "f.txt: not a metamem allocator event list (its first line is not "
                                     "'metamem allocator events 1')");
  EXPECT_EQ(error_of("metamem allocator events 1\nalloc 1 2\nfree 2\n"), "f.txt:3: allocation 2 is not live");
  EXPECT_EQ(error_of("metamem allocator events 1\nalloc 1 2\nalloc 1 2\n"), "f.txt:3: allocation 1 is live");
  EXPECT_EQ(error_of("metamem allocator events 1\nalloc 1\n"), "f.txt:2: 'alloc' needs an ID and a size in bytes");
  EXPECT_EQ(error_of("metamem allocator events 1\nmalloc 1 2\n"), "f.txt:2: unknown event 'malloc'");
  EXPECT_EQ(error_of("metamem allocator events 1\nfree 1 2\n"), "f.txt:2: allocation 1 is not live");
  EXPECT_EQ(error_of("metamem allocator events 1\nalloc 1 2 32\n"), "f.txt:2: streams are numbered 0 to 31, got 32");
  EXPECT_EQ(error_of("metamem allocator events 1\nalloc 1 2 x\n"), "f.txt:2: 'alloc' takes a stream number");
  EXPECT_EQ(error_of("metamem allocator events 1\nrecord_stream 1 2\n"), "f.txt:2: allocation 1 is not live");
  EXPECT_EQ(error_of("metamem allocator events 1\nalloc 1 2\nrecord_stream 1\n"),
            "f.txt:3: 'record_stream' needs an ID and a stream number");
  const std::string header = "metamem allocator events 1\n";
  EXPECT_EQ(error_of(header + "pool_begin 0\n"), "f.txt:2: 'pool_begin' needs a pool number (1, 2, ...)");
  EXPECT_EQ(error_of(header + "pool_begin 1 40\n"), "f.txt:2: streams are numbered 0 to 31, got 40");
  EXPECT_EQ(error_of(header + "pool_begin 1\npool_begin 1\n"), "f.txt:3: requests are already routed to pool 1");
  EXPECT_EQ(error_of(header + "pool_end 1\n"), "f.txt:2: requests are not routed to pool 1");
  EXPECT_EQ(error_of(header + "pool_release 1\n"), "f.txt:2: pool 1 has no use to release");
  EXPECT_EQ(error_of(header + "pool_begin 1\npool_release 1\n"),
            "f.txt:3: requests are routed to pool 1: end that first");
  EXPECT_EQ(error_of(header + "pool_checkpoint 1\n"),
            "f.txt:2: pool 1 has no use: c10 checkpoints only a pool in use");
  EXPECT_EQ(error_of(header + "pool_restore 0 1:2\n"),
            "f.txt:2: 'pool_restore' needs the number of a checkpoint taken before");
  EXPECT_EQ(error_of(header + "pool_begin 1\npool_checkpoint 1\npool_restore 0 1-2\n"),
            "f.txt:4: 'pool_restore' takes pairs HELD:ID, got '1-2'");
  EXPECT_EQ(error_of(header + "pool_begin 1\npool_checkpoint 1\npool_restore 0 1:x\n"),
            "f.txt:4: 'pool_restore' takes pairs HELD:ID, got '1:x'");
  EXPECT_EQ(error_of(header + "pool_begin 1\npool_end 1\npool_release 1\npool_begin 1\n"),
            "f.txt:5: pool 1 was released; a new pool needs a new number");
}

}  // namespace
}  // namespace metamem
