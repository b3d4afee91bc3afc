// Everything metamem says about one traced step.
#pragma once

#include <cstdint>

#include "estimator/CachingAllocator.h"
#include "estimator/MemoryTimeline.h"
#include "estimator/NodeTable.h"
#include "estimator/TracePlan.h"
#include "profiler/Step.h"

namespace metamem {

// ZeRO's model states, measured: the most bytes of each kind live at once
// during the measured step.
struct ModelStates {
  std::int64_t param_bytes = 0;
  std::int64_t grad_bytes = 0;       // gradients, and fp32 master or main gradients
  std::int64_t optimizer_bytes = 0;  // states, and fp32 master weights
};

ModelStates model_states(const Trace& trace);

struct AllocatorPeaks {
  std::int64_t allocated = 0;  // max_memory_allocated over the measured step
  std::int64_t reserved = 0;   // max_memory_reserved over the measured step
};

// Replays every traced step through CachingAllocatorSim, so that the
// measured step starts from the blocks and segments the steps before left;
// peaks are reset at its start. With `reserved_after`, also what it holds
// reserved after each event (for the report's timeline).
AllocatorPeaks simulate_allocator(const Trace& trace, const AllocatorSetup& allocator = {},
                                  std::vector<std::int64_t>* reserved_after = nullptr);

struct Estimate {
  Trace trace;
  NodeTable nodes;
  ModelStates states;
  CategoryBytes live_at_peak{};  // by category, at the measured step's peak
  AllocatorPeaks allocator;
  TracePlan plan;
  std::vector<TimelinePoint> timeline;  // the measured step, sampled for drawing
};

Estimate estimate(Trace trace, const AllocatorSetup& allocator = {});

}  // namespace metamem
