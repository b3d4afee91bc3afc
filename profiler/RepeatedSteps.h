// A training step repeats itself from the second on: the same passes run
// the same ops on buffers of the same bytes; what the first step made once
// (optimizer states, a parallel wrapper's communication buffers, cuBLAS's
// workspace) is simply there. So a trace of one step gives the steady
// state's without running it again, as long as the first step kept nothing
// else.
#pragma once

#include <optional>

#include "profiler/Trace.h"

namespace metamem {

// The trace of `steps` steps from `first`, a trace of one: each later step
// is the first again, less the buffers it left alive and the ops that made
// them. nullopt when the first step kept anything else (a gradient, a
// tensor held from its forward) or freed a buffer made before it: then a
// later step differs, and only tracing it tells how.
std::optional<Trace> repeat_step(const Trace& first, int steps);

}  // namespace metamem
