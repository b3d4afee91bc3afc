// What a CUDA caching allocator is asked during a trace, as a list anyone
// can replay: the simulator here, or PyTorch's own allocator under the fake
// CUDA runtime (oracle/). Written and read as text, one event a line:
//
//   metamem allocator events 1
//   alloc ID BYTES [STREAM]   a request of BYTES for the allocation named ID,
//                             on STREAM (0, the default stream, to 31)
//   record_stream ID STREAM   the allocation is used on STREAM too
//   free ID                   the allocation named ID goes back
//   reset_peaks               torch.cuda.reset_peak_memory_stats()
//   empty_cache               torch.cuda.empty_cache()
//   pool_begin POOL [STREAM]  requests on STREAM (without one: every request,
//                             as torch routes a thread's) go to private pool
//                             POOL (1, 2, ...), made or used once more
//   pool_end POOL             that routing ends
//   pool_release POOL         one use of the pool ends (a CUDA graph
//                             destroyed; not while routed to); with none
//                             left, empty_cache frees its cached segments,
//                             and POOL is not used again
//   pool_checkpoint POOL      a CUDA graph tree keeps the pool's layout
//                             (c10's getCheckpointState); checkpoints are
//                             numbered 0, 1, ... in order
//   pool_restore N HELD:ID ...
//                             the tree returns the pool to checkpoint N
//                             (c10's setCheckpointPoolState): every block
//                             the pool holds is freed, and the block the
//                             allocation named HELD held at the checkpoint
//                             is held by the one named ID, one pair for
//                             each block it had allocated
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "profiler/Trace.h"

namespace metamem {

class CachingAllocatorSim;

struct AllocatorEvent {
  enum class Kind : std::uint8_t {
    Alloc, Free, RecordStream, ResetPeaks, EmptyCache, PoolBegin, PoolEnd, PoolRelease, PoolCheckpoint, PoolRestore
  };
  static constexpr int kEveryStream = -1;  // PoolBegin without a stream
  Kind kind = Kind::Alloc;
  std::uint32_t id = 0;    // Alloc, Free, RecordStream; PoolRestore: the checkpoint
  std::int64_t bytes = 0;  // Alloc
  int stream = 0;          // Alloc, RecordStream, PoolBegin
  int pool = 0;            // PoolBegin, PoolEnd, PoolRelease, PoolCheckpoint
  std::vector<std::uint32_t> held_by{}, buffers{};  // PoolRestore, as AllocatorCall's
};


// The trace's allocations and frees in order, with its allocator calls
// and a reset of the peaks where its last (measured) step begins: the
// peaks at the end are that step's, as the estimate reports them.
std::vector<AllocatorEvent> allocator_events(const Trace& trace);

void write_allocator_events(std::ostream& out, const std::vector<AllocatorEvent>& events);
// Throws std::invalid_argument naming `source` and the line of what it
// cannot read (an unknown event, a free of an ID not allocated, ...).
std::vector<AllocatorEvent> read_allocator_events(std::istream& in, const std::string& source);

// Does to the simulator what the event asks.
void apply(CachingAllocatorSim& sim, const AllocatorEvent& event);

}  // namespace metamem
