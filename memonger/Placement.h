// What the planners share: each places the unpinned ranges; pinned ranges
// go below them, one after another, before any planner runs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "memonger/Plan.h"

namespace memonger {

// Offsets of `items` (indices into the problem's ranges), in that order.
struct Placement {
  std::vector<std::int64_t> offsets;
  std::int64_t height = 0;
  std::int64_t buffers = 0;
};

using Items = std::vector<std::size_t>;

// Runs `place` on the unpinned ranges and stacks them above the pinned ones.
Plan assemble(const Problem& problem, std::string algorithm,
              const std::function<Placement(const Items&)>& place);

// Shared buffers (Caffe2): each range joins a buffer whose members it never
// overlaps in time; a buffer costs its largest member.
Placement shared_greedy(const Problem& problem, const Items& items);
// Exact: branch and bound. Throws PlanLimitError after `node_limit` nodes.
Placement shared_optimal(const Problem& problem, const Items& items, std::int64_t node_limit);

// Arena offsets: greedy best fit under several orderings, then packing into
// a fixed height from both ends, searched down towards the lower bound.
Placement arena_best_fit(const Problem& problem, const Items& items);

// Max live bytes of `items` alone.
std::int64_t items_lower_bound(const Problem& problem, const Items& items);

}  // namespace memonger
