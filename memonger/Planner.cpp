#include <algorithm>

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
  plan.planned_bytes += placement.height;
  plan.buffers += placement.buffers;
  return plan;
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

namespace {

constexpr std::int64_t kDpNodeLimit = 2'000'000;
constexpr std::size_t kAutoDpRanges = 24;  // auto tries the exact search up to this size

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

// The smallest plan of the others; the exact search only where it is cheap.
class AutoPlanner final : public Planner {
 public:
  std::string name() const override { return "auto"; }
  Plan plan(const Problem& p) const override {
    Plan best = bestfit()->plan(p);
    auto consider = [&](Plan candidate) {
      if (candidate.planned_bytes < best.planned_bytes) best = std::move(candidate);
    };
    consider(greedy()->plan(p));
    if (p.size() <= kAutoDpRanges) {
      try {
        consider(dp()->plan(p));
      } catch (const PlanLimitError&) {
      }
    }
    return best;
  }
};

}  // namespace

std::unique_ptr<Planner> make_planner(const std::string& name) {
  if (name == "greedy") return greedy();
  if (name == "dp") return dp();
  if (name == "bestfit") return bestfit();
  if (name == "auto") return std::make_unique<AutoPlanner>();
  throw InputError("unknown algorithm '" + name + "' (known: greedy, dp, bestfit, auto)");
}

}  // namespace memonger
