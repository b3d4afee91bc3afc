#include "estimator/Estimate.h"

#include <algorithm>

#include "estimator/CachingAllocator.h"

namespace metamem {

ModelStates model_states(const Trace& trace) {
  CategoryBytes live{}, most{};
  const std::size_t begin = trace.measured().begin;
  for (std::size_t e = 0; e < trace.events.size(); ++e) {
    const Event& event = trace.events[e];
    if (event.kind == EventKind::Op) continue;
    const Buffer& buffer = trace.buffers[event.index];
    const auto category = static_cast<std::size_t>(buffer.category);
    live[category] += event.kind == EventKind::Alloc ? buffer.bytes : -buffer.bytes;
    if (e + 1 >= begin)
      for (std::size_t c = 0; c < kCategories; ++c) most[c] = std::max(most[c], live[c]);
  }
  auto of = [&](Category c) { return most[static_cast<std::size_t>(c)]; };
  return {of(Category::Parameter), of(Category::Gradient), of(Category::OptimizerState)};
}

AllocatorPeaks simulate_allocator(const Trace& trace, const AllocatorSetup& allocator,
                                  std::vector<std::int64_t>* reserved_after) {
  CachingAllocatorSim sim(allocator);
  const std::size_t begin = trace.measured().begin, end = trace.events.size();
  if (reserved_after) reserved_after->assign(end, 0);
  trace.replay(sim, [&](std::size_t e) {  // before event e
    if (e == begin) sim.reset_peaks();
    if (reserved_after && e > 0) (*reserved_after)[e - 1] = sim.reserved_bytes();
  });
  if (reserved_after && end > 0) reserved_after->back() = sim.reserved_bytes();
  if (begin >= end) sim.reset_peaks();
  return {sim.peak_allocated_bytes(), sim.peak_reserved_bytes()};
}

Estimate estimate(Trace trace, const AllocatorSetup& allocator) {
  Estimate result;
  result.nodes = node_table(trace);
  result.states = model_states(trace);
  result.live_at_peak = trace.live_by_category(trace.measured().peak_event);
  std::vector<std::int64_t> reserved_after;
  result.allocator = simulate_allocator(trace, allocator, &reserved_after);
  result.plan = plan_trace(trace);
  result.timeline = memory_timeline(trace, reserved_after);
  result.trace = std::move(trace);
  return result;
}

}  // namespace metamem
