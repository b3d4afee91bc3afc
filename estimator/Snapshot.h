// A memory snapshot PyTorch's memory_viz page opens: the trace replayed
// through the simulated CUDA caching allocator.
#pragma once

#include <string>

#include "estimator/CachingAllocator.h"
#include "profiler/Trace.h"

namespace metamem {

// {"segments": [...], "device_traces": [[...]]} as a pickle. Trace entries
// are stamped with the event index as time_us and the producing op and
// module as their frame. The allocator runs as in simulate_allocator.
std::string memory_snapshot_pickle(const Trace& trace, const AllocatorSetup& allocator = {});

}  // namespace metamem
