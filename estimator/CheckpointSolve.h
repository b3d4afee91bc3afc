// Checkpointing strategies: which units to recompute so that a step fits a
// memory budget with the least recomputation. Every solver's answer is
// checked with the exact simulator; the model solvers plan with is only
// their guide.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "estimator/CheckpointSim.h"

namespace metamem {

struct CheckpointPlan {
  std::string solver;
  CheckpointPolicy policy;
  SimulatedStep step;  // exact
};

// none, uniform (every k-th unit, the largest k that fits), chen (sqrt(n)
// segments, or Chen et al.'s budgeted greedy), rotor (Beaumont et al.'s
// dynamic program, nested segments), selective (checkpointed units keep
// the outputs of their products; never worse than rotor), auto (the
// cheapest of them).
const std::vector<std::string>& checkpoint_solvers();

// The plan `solver` finds with the least recompute whose exact peak is at
// most `budget`, or nothing when none it tries fits (selective calibrates
// the simulator for the ops it keeps). Throws std::invalid_argument for an
// unknown solver.
std::optional<CheckpointPlan> solve_checkpointing(CheckpointSimulator& simulator,
                                                  const std::string& solver, std::int64_t budget);

// The lowest exact peak any solver reaches: below it nothing fits.
std::int64_t lowest_checkpointed_peak(CheckpointSimulator& simulator);

// --- rotor's chain model, exposed for tests ---

// A policy's peak above the chain's base and its forward FLOPs (the first
// forward of each stage included) in the model: a stage's forward with
// autograd peaks at forward_peak and leaves `kept`; without it, at
// no_grad_peak beside its input, leaving its output; its backward peaks at
// backward_peak above its kept bytes and incoming gradient, then frees them
// and leaves its input's gradient. A segment's output is freed when its
// backward starts. The last stage is never checkpointed.
struct ModelStep {
  std::int64_t peak = 0;
  std::int64_t flops = 0;
};
ModelStep model_step(const std::vector<ChainStage>& chain, const CheckpointPolicy& policy);

// Rotor's dynamic program over the model, memory in `slots` equal steps up
// to `max_memory` (sizes rounded up, budgets down). Filled once for every
// memory level; a level's policy is read back without solving again.
class RotorTable {
 public:
  RotorTable(std::vector<ChainStage> chain, std::int64_t max_memory, int slots = 500);
  // The least forward FLOPs at `memory` above the chain's base, or nothing
  // when no policy fits, and the policy that achieves it.
  std::optional<std::int64_t> flops(std::int64_t memory) const;
  std::optional<CheckpointPolicy> policy(std::int64_t memory) const;
  std::int64_t slot_bytes() const { return slot_; }
  std::int64_t max_memory() const { return slot_ * slots_; }

 private:
  std::size_t index(std::size_t s, std::size_t t, std::int64_t m) const;
  std::int64_t slots_of(std::int64_t memory) const;
  void build(std::size_t s, std::size_t t, std::int64_t m, std::vector<Segment>& out) const;

  std::vector<ChainStage> chain_;
  std::int64_t slot_;
  int slots_;
  std::vector<std::int64_t> cost_;   // per (s, t, m); -1: infeasible
  std::vector<std::int32_t> choice_;  // 0: stage s plain; s' > s: segment [s, s'-1]
};

}  // namespace metamem
