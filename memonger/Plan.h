// A memory plan for a Problem, its checks and its figures.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "memonger/LiveRange.h"

namespace memonger {

// Where each range lives in one arena. Shared-buffer plans lay their buffers
// end to end, so every plan is an arena plan.
struct Plan {
  std::string algorithm;
  std::vector<std::int64_t> offsets;  // one per range, as in Problem::ranges()
  std::int64_t planned_bytes = 0;     // arena size
  std::int64_t buffers = 0;           // shared buffers; distinct offsets for arena plans
  // No plan is smaller, as far as the planner proved (best fit: max live bytes;
  // the exact search: more where it could). Statistics adds max live bytes.
  std::int64_t proven_bound_bytes = 0;
};

// Max live bytes over all steps (XLA's NoFragmentationStatsHeap). Pinned
// ranges may share with nothing, so they count as live at every step.
std::int64_t lower_bound_bytes(const Problem& problem);

// Every way `plan` breaks the rules, empty when it keeps them: each range
// placed once inside the arena, no two ranges alive at one step with
// overlapping bytes, pinned ranges overlapping nothing at all.
std::vector<std::string> verify(const Problem& problem, const Plan& plan);

// Caffe2's compute_statistics, with the lower bound beside the plan.
struct Statistics {
  std::int64_t baseline_bytes = 0;  // no sharing: the sum of sizes
  std::int64_t planned_bytes = 0;
  std::int64_t lower_bound_bytes = 0;   // max live bytes
  std::int64_t proven_bound_bytes = 0;  // at least the lower bound; planned when proven optimal
  std::int64_t buffers = 0;
  bool optimal() const { return planned_bytes == proven_bound_bytes; }
  double ratio() const {  // planned / lower_bound
    return lower_bound_bytes == 0 ? 1.0
                                  : static_cast<double>(planned_bytes) / lower_bound_bytes;
  }
};
Statistics compute_statistics(const Problem& problem, const Plan& plan);

class Planner {
 public:
  virtual ~Planner() = default;
  virtual std::string name() const = 0;
  virtual Plan plan(const Problem& problem) const = 0;
};

// What a plan must reach and may cost; only the exact search reads them.
struct PlanLimits {
  std::optional<double> seconds;         // time limit: 10 s for "exact", 1 s within "auto" (10 s with a capacity)
  std::optional<std::int64_t> capacity;  // decision: the first plan within it will do
  // Work limit: nodes of the exact search plus ranges the squeaky wheel
  // places. Unlike a time limit it gives the same plan on any machine. None
  // by default; whichever limit comes first ends the search.
  std::optional<std::int64_t> work;
};

// "greedy" and "dp" (Caffe2's shared buffers: a buffer costs its largest
// member), "bestfit" (arena offsets), "exact" (arena offsets by branch and
// bound), "auto" (the best of those that apply). Throws InputError for
// another name.
std::unique_ptr<Planner> make_planner(const std::string& name, const PlanLimits& limits = {});

// The exact search gave up: the instance is too large for it.
class PlanLimitError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace memonger
