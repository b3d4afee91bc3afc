#include <algorithm>
#include <iterator>
#include <optional>
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

  // Sweep over time with the ranges alive, by offset. While they are
  // disjoint, a range that arrives overlaps one of them only if it overlaps
  // its neighbour below or above: O(n log n) however many ranges are alive
  // together.
  std::vector<std::size_t> by_first;
  for (std::size_t i = 0; i < ranges.size(); ++i)
    if (problem.bytes(i) > 0) by_first.push_back(i);
  std::stable_sort(by_first.begin(), by_first.end(),
                   [&](auto a, auto b) { return ranges[a].first < ranges[b].first; });
  std::set<std::pair<std::int64_t, std::size_t>> alive_by_offset, alive_by_last;
  for (std::size_t i : by_first) {
    while (!alive_by_last.empty() && alive_by_last.begin()->first < ranges[i].first) {
      const std::size_t gone = alive_by_last.begin()->second;
      alive_by_last.erase(alive_by_last.begin());
      alive_by_offset.erase({plan.offsets[gone], gone});
    }
    const auto above = alive_by_offset.lower_bound({plan.offsets[i], 0});
    std::optional<std::size_t> clash;
    if (above != alive_by_offset.end() && above->first < end(i)) clash = above->second;
    if (above != alive_by_offset.begin() && end(std::prev(above)->second) > plan.offsets[i])
      clash = std::prev(above)->second;
    if (clash) {
      errors.push_back(name(*clash) + " and " + name(i) + " are alive together and overlap");
      continue;  // kept out, so the ranges alive stay disjoint
    }
    alive_by_offset.emplace(plan.offsets[i], i);
    alive_by_last.emplace(ranges[i].last, i);
  }

  // A pinned range's bytes belong to it for the whole step: no other range
  // may use them at any time. By offset, a range's bytes meet those of one
  // before it iff it starts below the highest end before it.
  std::vector<std::size_t> by_offset = by_first;
  std::stable_sort(by_offset.begin(), by_offset.end(),
                   [&](auto a, auto b) { return plan.offsets[a] < plan.offsets[b]; });
  std::optional<std::size_t> highest, highest_pinned;  // the earlier range reaching highest
  for (std::size_t i : by_offset) {
    auto meets = [&](std::optional<std::size_t> j) { return j && end(*j) > plan.offsets[i]; };
    if (ranges[i].pinned && meets(highest))
      errors.push_back("pinned " + name(i) + " shares bytes with " + name(*highest));
    else if (meets(highest_pinned))
      errors.push_back("pinned " + name(*highest_pinned) + " shares bytes with " + name(i));
    if (!highest || end(i) > end(*highest)) highest = i;
    if (ranges[i].pinned && (!highest_pinned || end(i) > end(*highest_pinned))) highest_pinned = i;
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
