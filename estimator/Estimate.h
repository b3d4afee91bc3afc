// Everything metamem says about one traced step.
#pragma once

#include <cstdint>

#include "estimator/NodeTable.h"
#include "estimator/TracePlan.h"
#include "profiler/Step.h"

namespace metamem {

struct ModelStates {
  std::int64_t param_bytes = 0;
  std::int64_t grad_bytes = 0;
  std::int64_t optimizer_bytes = 0;  // states, and fp32 master weights when mixed
};

ModelStates model_states(const Trace& trace, const StepOptions& options);

struct AllocatorPeaks {
  std::int64_t allocated = 0;  // max_memory_allocated over the step
  std::int64_t reserved = 0;   // max_memory_reserved over the step
};

// Replays the trace through CachingAllocatorSim, peaks reset at the step's start.
AllocatorPeaks simulate_allocator(const Trace& trace, int roundup_power2_divisions = 0);

struct Estimate {
  Trace trace;
  NodeTable nodes;
  ModelStates states;
  AllocatorPeaks allocator;
  TracePlan plan;
};

Estimate estimate(Trace trace, const StepOptions& options, int roundup_power2_divisions = 0);

}  // namespace metamem
