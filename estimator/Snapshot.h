// A memory snapshot PyTorch's memory_viz page opens: the trace replayed
// through the simulated CUDA caching allocator.
#pragma once

#include <string>

#include "profiler/Trace.h"

namespace metamem {

// {"segments": [...], "device_traces": [[...]]} as a pickle. Trace entries
// are stamped with the event index as time_us and the producing op and
// module as their frame. The allocator rounds as in simulate_allocator.
std::string memory_snapshot_pickle(const Trace& trace, int roundup_power2_divisions = 0);

}  // namespace metamem
