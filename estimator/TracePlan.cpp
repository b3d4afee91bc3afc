#include "estimator/TracePlan.h"

namespace metamem {

std::vector<memonger::LiveRange> trace_live_ranges(const Trace& trace) {
  std::vector<memonger::LiveRange> ranges;
  for (std::size_t b = 0; b < trace.buffers.size(); ++b) {
    const Buffer& buffer = trace.buffers[b];
    const bool alive = buffer.free_event == Buffer::kAlive;
    if (!alive && buffer.free_event < trace.measured().begin) continue;  // gone before the step
    memonger::LiveRange range;
    range.id = static_cast<std::int64_t>(b);
    range.first = static_cast<std::int64_t>(buffer.alloc_event);
    range.last = static_cast<std::int64_t>(alive ? trace.events.size() : buffer.free_event);
    range.bytes = buffer.bytes;
    range.pinned = buffer.alloc_event < trace.measured().begin;
    ranges.push_back(range);
  }
  return ranges;
}

TracePlan plan_trace(const Trace& trace, const std::string& algorithm) {
  const memonger::Problem problem(trace_live_ranges(trace));
  TracePlan result;
  memonger::PlanLimits limits;
  limits.seconds = 0.2;
  result.plan = memonger::make_planner(algorithm, limits)->plan(problem);
  result.stats = memonger::compute_statistics(problem, result.plan);
  return result;
}

}  // namespace metamem
