// Live memory over the measured step, by category, sampled for drawing; and
// what is live at its peak, by module.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "profiler/Trace.h"

namespace metamem {

struct TimelinePoint {
  std::size_t event = 0;        // the trace event it shows (live bytes after it)
  Phase phase = Phase::Setup;   // of the op running then
  CategoryBytes live{};         // by category
  std::int64_t reserved = 0;    // the simulated CUDA allocator's segments
};

// At most `max_points` points over the measured step: of each run of
// consecutive events, the one with the most live bytes, so that every peak
// (the step's included) is drawn at its height. `reserved_after`: the
// simulated allocator's reserved bytes after each event (simulate_allocator).
std::vector<TimelinePoint> memory_timeline(const Trace& trace, const std::vector<std::int64_t>& reserved_after,
                                           std::size_t max_points = 1000);

// Activations and temporaries live at the measured step's peak, by the
// module whose op made them (paths cut to `depth`, as module_table does),
// most first, at most `top`; those made outside any module are "(no module)".
std::vector<std::pair<std::string, std::int64_t>> live_at_peak_by_module(const Trace& trace, int depth,
                                                                         std::size_t top = 10);

}  // namespace metamem
