#include "estimator/MemoryTimeline.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "estimator/NodeTable.h"

namespace metamem {
namespace {

std::int64_t total(const CategoryBytes& live) { return std::accumulate(live.begin(), live.end(), std::int64_t{0}); }

}  // namespace

std::vector<TimelinePoint> memory_timeline(const Trace& trace, const std::vector<std::int64_t>& reserved_after,
                                           std::size_t max_points) {
  const std::size_t begin = trace.measured().begin, end = trace.events.size();
  if (begin >= end || max_points == 0) return {};

  const std::size_t per_point = (end - begin + max_points - 1) / max_points;
  std::vector<TimelinePoint> points;
  CategoryBytes live = begin == 0 ? CategoryBytes{} : trace.live_by_category(begin - 1);
  Phase phase = Phase::Setup;
  TimelinePoint best;
  std::int64_t best_total = -1;
  for (std::size_t e = begin; e < end; ++e) {
    const Event& event = trace.events[e];
    if (event.kind == EventKind::Op) {
      phase = trace.ops[event.index].phase;
    } else {
      const Buffer& buffer = trace.buffers[event.index];
      live[static_cast<std::size_t>(buffer.category)] += event.kind == EventKind::Alloc ? buffer.bytes : -buffer.bytes;
    }
    if (total(live) > best_total) {
      best = {e, phase, live, reserved_after[e]};
      best_total = total(live);
    }
    if ((e - begin + 1) % per_point == 0 || e + 1 == end) {
      points.push_back(best);
      best_total = -1;
    }
  }
  return points;
}

std::vector<std::pair<std::string, std::int64_t>> live_at_peak_by_module(const Trace& trace, int depth,
                                                                         std::size_t top) {
  const std::size_t peak = trace.measured().peak_event;
  std::map<std::string, std::int64_t> bytes;
  for (const Buffer& buffer : trace.buffers) {
    if (buffer.alloc_event > peak || (buffer.free_event != Buffer::kAlive && buffer.free_event <= peak)) continue;
    if (buffer.category != Category::Activation && buffer.category != Category::Temporary) continue;
    std::string module = "(no module)";
    if (buffer.producer_op >= 0) {
      const std::string& scope = trace.scopes[trace.ops[static_cast<std::size_t>(buffer.producer_op)].scope];
      if (!scope.empty()) module = module_prefix(scope, depth);
    }
    bytes[module] += buffer.bytes;
  }
  std::vector<std::pair<std::string, std::int64_t>> sorted(bytes.begin(), bytes.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  if (sorted.size() > top) sorted.resize(top);
  return sorted;
}

}  // namespace metamem
