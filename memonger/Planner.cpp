#include <algorithm>
#include <limits>
#include <numeric>

#include "memonger/Placement.h"

namespace memonger {

Plan assemble(const Problem& problem, std::string algorithm,
              const std::function<Placement(const Items&)>& place) {
  Plan plan;
  plan.algorithm = std::move(algorithm);
  plan.offsets.assign(problem.size(), 0);
  Items items;
  for (std::size_t i = 0; i < problem.size(); ++i) {
    if (!problem.ranges()[i].pinned) {
      items.push_back(i);
      continue;
    }
    plan.offsets[i] = plan.planned_bytes;
    plan.planned_bytes += problem.bytes(i);
    ++plan.buffers;
  }
  const Placement placement = place(items);
  for (std::size_t k = 0; k < items.size(); ++k)
    plan.offsets[items[k]] = plan.planned_bytes + placement.offsets[k];
  plan.proven_bound_bytes = plan.planned_bytes + placement.bound;
  plan.planned_bytes += placement.height;
  plan.buffers += placement.buffers;
  return plan;
}

std::int64_t count_offsets(const std::vector<std::int64_t>& offsets) {
  std::vector<std::int64_t> distinct = offsets;
  std::sort(distinct.begin(), distinct.end());
  return std::unique(distinct.begin(), distinct.end()) - distinct.begin();
}

std::int64_t items_lower_bound(const Problem& problem, const Items& items) {
  std::vector<std::pair<std::int64_t, std::int64_t>> deltas;
  deltas.reserve(2 * items.size());
  for (std::size_t i : items) {
    deltas.emplace_back(problem.ranges()[i].first, problem.bytes(i));
    deltas.emplace_back(problem.ranges()[i].last + 1, -problem.bytes(i));
  }
  std::sort(deltas.begin(), deltas.end());
  std::int64_t live = 0, peak = 0;
  for (const auto& [step, delta] : deltas) peak = std::max(peak, live += delta);
  return peak;
}

std::optional<std::vector<Items>> overlap_lists(const std::vector<std::int64_t>& first,
                                                const std::vector<std::int64_t>& last,
                                                std::chrono::steady_clock::time_point deadline) {
  Items by_first(first.size());
  std::iota(by_first.begin(), by_first.end(), std::size_t{0});
  std::sort(by_first.begin(), by_first.end(), [&](auto a, auto b) { return first[a] < first[b]; });
  std::vector<Items> lists(first.size());
  std::int64_t pairs = 0;
  for (std::size_t a = 0; a < by_first.size(); ++a)
    for (std::size_t b = a + 1; b < by_first.size() && first[by_first[b]] <= last[by_first[a]]; ++b) {
      lists[by_first[a]].push_back(by_first[b]);
      lists[by_first[b]].push_back(by_first[a]);
      if ((++pairs & 0xffff) == 0 && (pairs > kMostOverlaps || std::chrono::steady_clock::now() > deadline))
        return std::nullopt;
    }
  return lists;
}

namespace {

constexpr std::int64_t kDpNodeLimit = 2'000'000;
constexpr std::size_t kAutoDpRanges = 24;         // auto tries the shared-buffer search up to this size
constexpr std::size_t kAutoExactRanges = 2'000;  // and the exact arena search up to this size
constexpr double kExactSeconds = 10;
// auto's exact search when minimising: its plan is one candidate of several.
// A decision (a capacity) gets exact's own limit: giving up says nothing,
// and MiniMalloc's hardest take 1 s on an idle machine.
constexpr double kAutoExactSeconds = 1;

// Pinned ranges first, then `place` on the rest.
class PlacementPlanner final : public Planner {
 public:
  using Place = std::function<Placement(const Problem&, const Items&)>;
  PlacementPlanner(std::string name, Place place) : name_(std::move(name)), place_(std::move(place)) {}
  std::string name() const override { return name_; }
  Plan plan(const Problem& p) const override {
    return assemble(p, name_, [&](const Items& items) { return place_(p, items); });
  }

 private:
  std::string name_;
  Place place_;
};

std::unique_ptr<Planner> greedy() { return std::make_unique<PlacementPlanner>("greedy", shared_greedy); }
std::unique_ptr<Planner> dp() {
  return std::make_unique<PlacementPlanner>("dp", [](const Problem& p, const Items& items) {
    return shared_optimal(p, items, kDpNodeLimit);
  });
}
std::unique_ptr<Planner> bestfit() { return std::make_unique<PlacementPlanner>("bestfit", arena_best_fit); }

// Best fit first, then the exact search from its plan. The clock starts
// with the best-fit plan, so the time limit covers all of it. Minimising
// from a plan more than 1% above max live bytes, the search gets half the
// time and work (small instances are proved there); if it proves nothing,
// the squeaky wheel takes three eighths, being better on large instances
// without slack (where the search's mistakes show only after its node
// limits), and the search goes on from its plan. Nearer the bound, the
// search's own fine steps do better, and it gets all of both.
std::unique_ptr<Planner> exact(const PlanLimits& limits, double default_seconds) {
  return std::make_unique<PlacementPlanner>("exact", [limits, default_seconds](const Problem& p,
                                                                                const Items& items) {
    using Clock = std::chrono::steady_clock;
    const auto seconds = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(limits.seconds.value_or(default_seconds)));
    const auto start = Clock::now();
    const std::int64_t work = limits.work.value_or(std::numeric_limits<std::int64_t>::max());
    std::int64_t spent = 0;
    // The budget up to `eighths` of both limits: what a phase leaves is the next one's.
    auto until = [&](int eighths) {
      return Budget{start + seconds * eighths / 8, eighths == 8 ? work : work / 8 * eighths, spent};
    };
    SearchLimits search{until(8), std::nullopt};
    Placement plan = arena_best_fit(p, items);
    if (limits.capacity) {
      std::int64_t pinned = 0;
      for (std::size_t i = 0; i < p.size(); ++i)
        if (p.ranges()[i].pinned) pinned += p.bytes(i);
      search.capacity = *limits.capacity - pinned;
    } else if ((plan.height - plan.bound) * 100 > plan.height) {
      plan = arena_search(p, items, std::move(plan), {until(4), std::nullopt});
      if (plan.height == plan.bound) return plan;
      plan = arena_squeaky_wheel(p, items, std::move(plan), until(7));
    }
    return arena_search(p, items, std::move(plan), search);
  });
}

std::size_t unpinned(const Problem& p) {
  return std::count_if(p.ranges().begin(), p.ranges().end(), [](const LiveRange& r) { return !r.pinned; });
}

// The smallest plan of the others; the exact searches only where they are cheap.
class AutoPlanner final : public Planner {
 public:
  explicit AutoPlanner(PlanLimits limits) : limits_(std::move(limits)) {}
  std::string name() const override { return "auto"; }
  Plan plan(const Problem& p) const override {
    const std::size_t n = unpinned(p);
    const double seconds = limits_.capacity ? kExactSeconds : kAutoExactSeconds;
    Plan best = n <= kAutoExactRanges ? exact(limits_, seconds)->plan(p) : bestfit()->plan(p);
    auto consider = [&](Plan candidate) {
      const std::int64_t bound = std::max(best.proven_bound_bytes, candidate.proven_bound_bytes);
      if (candidate.planned_bytes < best.planned_bytes) best = std::move(candidate);
      best.proven_bound_bytes = bound;
    };
    consider(greedy()->plan(p));
    if (n <= kAutoDpRanges) {
      try {
        consider(dp()->plan(p));
      } catch (const PlanLimitError&) {
      }
    }
    return best;
  }

 private:
  PlanLimits limits_;
};

}  // namespace

std::unique_ptr<Planner> make_planner(const std::string& name, const PlanLimits& limits) {
  if (name == "greedy") return greedy();
  if (name == "dp") return dp();
  if (name == "bestfit") return bestfit();
  if (name == "exact") return exact(limits, kExactSeconds);
  if (name == "auto") return std::make_unique<AutoPlanner>(limits);
  throw InputError("unknown algorithm '" + name + "' (known: greedy, dp, bestfit, exact, auto)");
}

}  // namespace memonger
