#include <algorithm>
#include <set>
#include <utility>

#include "memonger/Placement.h"

namespace memonger {

std::int64_t lower_bound_bytes(const Problem& problem) {
  std::int64_t pinned = 0;
  Items items;
  for (std::size_t i = 0; i < problem.size(); ++i) {
    if (problem.ranges()[i].pinned)
      pinned += problem.bytes(i);
    else
      items.push_back(i);
  }
  return pinned + items_lower_bound(problem, items);
}

std::vector<std::string> verify(const Problem& problem, const Plan& plan) {
  std::vector<std::string> errors;
  const auto& ranges = problem.ranges();
  if (plan.offsets.size() != ranges.size()) {
    errors.push_back("plan places " + std::to_string(plan.offsets.size()) + " ranges, problem has " +
                     std::to_string(ranges.size()));
    return errors;
  }
  auto name = [&](std::size_t i) { return "range " + std::to_string(ranges[i].id); };
  auto end = [&](std::size_t i) { return plan.offsets[i] + problem.bytes(i); };
  for (std::size_t i = 0; i < ranges.size(); ++i)
    if (plan.offsets[i] < 0 || end(i) > plan.planned_bytes)
      errors.push_back(name(i) + " lies outside the arena");

  // Sweep over time; check bytes only between ranges alive together.
  std::vector<std::size_t> by_first(ranges.size());
  for (std::size_t i = 0; i < by_first.size(); ++i) by_first[i] = i;
  std::sort(by_first.begin(), by_first.end(),
            [&](auto a, auto b) { return ranges[a].first < ranges[b].first; });
  std::set<std::pair<std::int64_t, std::size_t>> alive;  // (last, index)
  for (std::size_t i : by_first) {
    while (!alive.empty() && alive.begin()->first < ranges[i].first) alive.erase(alive.begin());
    for (const auto& [last, j] : alive)
      if (problem.bytes(i) > 0 && problem.bytes(j) > 0 && plan.offsets[i] < end(j) &&
          plan.offsets[j] < end(i))
        errors.push_back(name(i) + " and " + name(j) + " are alive together and overlap");
    alive.emplace(ranges[i].last, i);
  }

  // A pinned range's bytes belong to it for the whole step.
  std::vector<std::size_t> by_offset = by_first;
  std::sort(by_offset.begin(), by_offset.end(),
            [&](auto a, auto b) { return plan.offsets[a] < plan.offsets[b]; });
  for (std::size_t k = 0; k < by_offset.size(); ++k) {
    const std::size_t i = by_offset[k];
    if (!ranges[i].pinned || problem.bytes(i) == 0) continue;
    for (std::size_t m = 0; m < by_offset.size() && plan.offsets[by_offset[m]] < end(i); ++m) {
      const std::size_t j = by_offset[m];
      if (j != i && problem.bytes(j) > 0 && end(j) > plan.offsets[i] && !overlap_in_time(ranges[i], ranges[j]))
        errors.push_back("pinned " + name(i) + " shares bytes with " + name(j));
    }
  }
  return errors;
}

Statistics compute_statistics(const Problem& problem, const Plan& plan) {
  Statistics stats;
  for (std::size_t i = 0; i < problem.size(); ++i) stats.baseline_bytes += problem.bytes(i);
  stats.planned_bytes = plan.planned_bytes;
  stats.lower_bound_bytes = lower_bound_bytes(problem);
  stats.proven_bound_bytes = std::max(stats.lower_bound_bytes, plan.proven_bound_bytes);
  stats.buffers = plan.buffers;
  return stats;
}

}  // namespace memonger
