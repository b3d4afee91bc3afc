// What the planners share: each places the unpinned ranges; pinned ranges
// go below them, one after another, before any planner runs.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "memonger/Plan.h"

namespace memonger {

// Offsets of `items` (indices into the problem's ranges), in that order.
struct Placement {
  std::vector<std::int64_t> offsets;
  std::int64_t height = 0;
  std::int64_t buffers = 0;
  std::int64_t bound = 0;  // proven: no placement of the items is lower (0: the planner proved nothing)
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

// What a search may spend: it stops at `deadline`, or once the work spent
// on the whole plan (`spent`, shared by its searches one after another)
// reaches `work`.
struct Budget {
  std::chrono::steady_clock::time_point deadline;
  std::int64_t work;
  std::int64_t& spent;
  bool exhausted() const { return spent >= work || std::chrono::steady_clock::now() > deadline; }
};

// Squeaky wheel optimisation: packings into a fixed height in a learnt
// priority order (Arena.cpp), heights stepped down from `start`'s until the
// budget is spent (a packing costs one unit per range). Proves nothing:
// bound as `start`'s.
Placement arena_squeaky_wheel(const Problem& problem, const Items& items, Placement start, const Budget& budget);

// What the exact search may spend (a node costs one unit), and in decision
// mode the height to reach.
struct SearchLimits {
  Budget budget;
  std::optional<std::int64_t> capacity;
};

// Exact arena offsets by branch and bound over canonical placements
// (ArenaSearch.cpp), started from `start`. With a capacity: the first
// placement within it, or `start` with a bound above it if none exists.
// Without: the lowest placement, binary-searched between the proven bound
// and the best found. Anytime: when its budget is spent, the best so far
// and the bound proven so far.
Placement arena_search(const Problem& problem, const Items& items, Placement start,
                       const SearchLimits& limits);

// Distinct offsets: the buffers of an arena placement.
std::int64_t count_offsets(const std::vector<std::int64_t>& offsets);

// Max live bytes of `items` alone.
std::int64_t items_lower_bound(const Problem& problem, const Items& items);

// For each range k alive over steps [first[k], last[k]], the others alive at
// one of its steps, found by a sweep in time: the work is the pairs found.
// None past `deadline` or beyond kMostOverlaps pairs (a gibibyte of lists),
// where a search over the pairs could not finish in time anyway.
constexpr std::int64_t kMostOverlaps = std::int64_t{1} << 26;
std::optional<std::vector<Items>> overlap_lists(const std::vector<std::int64_t>& first,
                                                const std::vector<std::int64_t>& last,
                                                std::chrono::steady_clock::time_point deadline);

}  // namespace memonger
