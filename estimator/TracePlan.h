// A trace's buffers as memonger live ranges, and the best static plan.
#pragma once

#include <string>
#include <vector>

#include "memonger/Plan.h"
#include "profiler/Trace.h"

namespace metamem {

// Every buffer live during the measured step; steps are event indices, so
// a buffer freed at one event and one made at a later event may share.
// Buffers live when it begins (model states, inputs) are pinned.
std::vector<memonger::LiveRange> trace_live_ranges(const Trace& trace);

struct TracePlan {
  memonger::Plan plan;
  memonger::Statistics stats;
};

// Every report plans its trace, so the exact search gets a fifth of a
// second here rather than auto's whole second.
TracePlan plan_trace(const Trace& trace, const std::string& algorithm = "auto");

}  // namespace metamem
