#include "estimator/CheckpointSolve.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace metamem {
namespace {

// The model's walk over a (sub)chain [s, t]: `live` is above the base,
// which holds stage s's input; `gradient` (of stage t's output) is live.
class ModelWalk {
 public:
  explicit ModelWalk(const std::vector<ChainStage>& chain) : chain_(chain) {}

  ModelStep run(const CheckpointPolicy& policy) {
    const auto last = static_cast<std::int32_t>(chain_.size()) - 1;
    process(0, last, policy.segments, 0);
    return result_;
  }

 private:
  std::int64_t input(std::int32_t u) const {
    return u < static_cast<std::int32_t>(chain_.size()) ? chain_[static_cast<std::size_t>(u)].input : 0;
  }
  const ChainStage& stage(std::int32_t u) const { return chain_[static_cast<std::size_t>(u)]; }
  void peak(std::int64_t bytes) { result_.peak = std::max(result_.peak, bytes); }

  // Returns the live bytes afterwards (the gradient of stage s's input
  // instead of the incoming one).
  std::int64_t process(std::int32_t s, std::int32_t t, const std::vector<Segment>& segments,
                       std::int64_t live) {
    const std::int32_t chain_last = static_cast<std::int32_t>(chain_.size()) - 1;
    for (std::int32_t u = s; u <= t;) {
      const Segment* segment = starting(segments, u);
      if (segment == nullptr) {
        peak(live + stage(u).forward_peak);
        live += stage(u).kept;
        result_.flops += stage(u).forward_flops;
        ++u;
        continue;
      }
      for (std::int32_t v = segment->first; v <= segment->last; ++v) {
        peak(live + (v > segment->first ? input(v) : 0) + stage(v).no_grad_peak);
        result_.flops += stage(v).forward_flops;
      }
      live += input(segment->last + 1);
      u = segment->last + 1;
    }
    for (std::int32_t u = t; u >= s;) {
      const Segment* segment = ending(segments, u);
      if (segment == nullptr) {
        peak(live + stage(u).backward_peak);
        const std::int64_t incoming = u == chain_last ? 0 : input(u + 1);
        live += input(u) - stage(u).kept - incoming;
        --u;
        continue;
      }
      live -= input(segment->last + 1);
      live = process(segment->first, segment->last, segment->inner, live);
      u = segment->first - 1;
    }
    return live;
  }

  static const Segment* starting(const std::vector<Segment>& segments, std::int32_t u) {
    for (const Segment& s : segments)
      if (s.first == u) return &s;
    return nullptr;
  }
  static const Segment* ending(const std::vector<Segment>& segments, std::int32_t u) {
    for (const Segment& s : segments)
      if (s.last == u) return &s;
    return nullptr;
  }

  const std::vector<ChainStage>& chain_;
  ModelStep result_;
};

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

bool better(const SimulatedStep& a, const SimulatedStep& b) {
  return a.recompute_flops != b.recompute_flops ? a.recompute_flops < b.recompute_flops
                                                : a.peak_bytes < b.peak_bytes;
}

// The best of `candidates` that fits: least recompute, then lowest peak.
std::optional<CheckpointPlan> best_fit(const CheckpointSimulator& simulator, const std::string& solver,
                                       const std::vector<CheckpointPolicy>& candidates,
                                       std::int64_t budget) {
  std::optional<CheckpointPlan> best;
  for (const CheckpointPolicy& policy : candidates) {
    const SimulatedStep step = simulator.simulate(policy);
    if (step.peak_bytes > budget) continue;
    if (!best || better(step, best->step)) best = CheckpointPlan{solver, policy, step};
  }
  return best;
}

// Every k-th unit checkpointed on its own, for every k.
std::vector<CheckpointPolicy> uniform_candidates(std::int32_t units) {
  std::vector<CheckpointPolicy> candidates;
  for (std::int32_t k = 1; k <= units; ++k) {
    CheckpointPolicy policy;
    for (std::int32_t u = 0; u < units; u += k) policy.segments.push_back({u, u, {}});
    candidates.push_back(std::move(policy));
  }
  return candidates;
}

// Chen et al. 2016: segments of about sqrt(n) units, and their budgeted
// greedy (a segment ends once the activations it holds pass b) over a grid
// of b. Each with the last segment recomputed or left to run plainly.
std::vector<CheckpointPolicy> chen_candidates(const std::vector<ChainStage>& chain) {
  const auto units = static_cast<std::int32_t>(chain.size()) - 1;
  std::vector<std::vector<Segment>> partitions;
  const auto k = static_cast<std::int32_t>(std::ceil(std::sqrt(static_cast<double>(units))));
  std::vector<Segment> sqrt_segments;
  for (std::int32_t u = 0; u < units; u += k) sqrt_segments.push_back({u, std::min(u + k, units) - 1, {}});
  partitions.push_back(std::move(sqrt_segments));
  std::int64_t total = 0, smallest = std::numeric_limits<std::int64_t>::max();
  for (std::int32_t u = 0; u < units; ++u) {
    total += chain[static_cast<std::size_t>(u)].kept;
    smallest = std::min(smallest, chain[static_cast<std::size_t>(u)].kept);
  }
  constexpr int kGrid = 32;
  for (int g = 0; g <= kGrid; ++g) {
    const auto b = static_cast<std::int64_t>(static_cast<double>(smallest) *
                                              std::pow(static_cast<double>(total) / static_cast<double>(smallest),
                                                       static_cast<double>(g) / kGrid));
    std::vector<Segment> segments;
    std::int64_t held = 0;
    std::int32_t first = 0;
    for (std::int32_t u = 0; u < units; ++u) {
      held += chain[static_cast<std::size_t>(u)].kept;
      if (held > b || u + 1 == units) {
        segments.push_back({first, u, {}});
        first = u + 1;
        held = 0;
      }
    }
    partitions.push_back(std::move(segments));
  }
  std::vector<CheckpointPolicy> candidates;
  for (std::vector<Segment>& segments : partitions) {
    candidates.push_back({segments, {}});
    if (segments.size() > 1) {
      segments.pop_back();
      candidates.push_back({segments, {}});
    }
  }
  return candidates;
}

// Rotor's table over the simulator's chain, up to the peak without
// checkpointing plus room for rounding: every stage's sizes round up by at
// most one slot.
RotorTable rotor_table(const CheckpointSimulator& simulator) {
  constexpr int kSlots = 500;
  const std::int64_t top = std::max<std::int64_t>(simulator.simulate({}).peak_bytes - simulator.chain_base(), 1);
  const double rounding = static_cast<double>(simulator.chain().size() + 2) / kSlots;
  const double room = rounding < 0.5 ? 1.0 / (1.0 - rounding) : 2.0;
  return RotorTable(simulator.chain(), static_cast<std::int64_t>(static_cast<double>(top) * room) + 1,
                    rounding < 0.5 ? kSlots : static_cast<int>(4 * (simulator.chain().size() + 2)));
}

// The model only guides: rotor's policies from its most memory down (the
// least recompute first), the first whose exact peak fits.
std::optional<CheckpointPlan> rotor(const CheckpointSimulator& simulator, std::int64_t budget) {
  const RotorTable table = rotor_table(simulator);
  std::optional<std::string> tried;
  for (std::int64_t memory = table.max_memory(); memory >= 0; memory -= table.slot_bytes()) {
    const std::optional<CheckpointPolicy> policy = table.policy(memory);
    if (!policy) break;
    const std::string text = to_string(*policy);
    if (tried == text) continue;
    tried = text;
    const SimulatedStep step = simulator.simulate(*policy);
    if (step.peak_bytes <= budget) return CheckpointPlan{"rotor", *policy, step};
  }
  return std::nullopt;
}

// Selective: checkpointed units keep the outputs of the products with the
// most FLOPs per byte (the first j candidates, for every j) over flat
// policies: every k-th unit, Chen's segments, rotor's plan without its
// inner segments. Rotor's plan as it is competes too: selective never
// does worse than rotor.
std::optional<CheckpointPlan> selective(CheckpointSimulator& simulator, std::int64_t budget) {
  std::optional<CheckpointPlan> best = rotor(simulator, budget);
  std::vector<CheckpointPolicy> flat = uniform_candidates(simulator.units());
  for (CheckpointPolicy& policy : chen_candidates(simulator.chain())) flat.push_back(std::move(policy));
  if (best) {
    CheckpointPolicy outer = best->policy;
    for (Segment& s : outer.segments) s.inner.clear();
    flat.push_back(std::move(outer));
  }
  const std::vector<std::string>& candidates = simulator.keep_candidates();
  for (std::size_t j = 1; j <= candidates.size(); ++j) {
    const std::vector<std::string> keep(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(j));
    simulator.calibrate(keep);
    for (CheckpointPolicy& policy : flat) policy.keep = keep;
    if (auto plan = best_fit(simulator, "selective", flat, budget); plan && (!best || better(plan->step, best->step)))
      best = std::move(plan);
  }
  if (best) best->solver = "selective";
  return best;
}

}  // namespace

const std::vector<std::string>& checkpoint_solvers() {
  static const std::vector<std::string> names = {"none", "uniform", "chen", "rotor", "selective", "auto"};
  return names;
}

std::optional<CheckpointPlan> solve_checkpointing(CheckpointSimulator& simulator,
                                                  const std::string& solver, std::int64_t budget) {
  if (solver == "none") return best_fit(simulator, solver, {CheckpointPolicy{}}, budget);
  if (solver == "uniform") return best_fit(simulator, solver, uniform_candidates(simulator.units()), budget);
  if (solver == "chen") return best_fit(simulator, solver, chen_candidates(simulator.chain()), budget);
  if (solver == "rotor") return rotor(simulator, budget);
  if (solver == "selective") return selective(simulator, budget);
  if (solver == "auto") {
    std::optional<CheckpointPlan> best;
    for (const std::string& name : checkpoint_solvers()) {
      if (name == "auto" || name == "rotor") continue;  // selective tries rotor's plan
      std::optional<CheckpointPlan> plan = solve_checkpointing(simulator, name, budget);
      if (plan && (!best || better(plan->step, best->step))) best = std::move(plan);
    }
    return best;
  }
  std::string known;
  for (const std::string& name : checkpoint_solvers()) known += (known.empty() ? "" : ", ") + name;
  throw std::invalid_argument("unknown checkpoint solver '" + solver + "' (known: " + known + ")");
}

std::int64_t lowest_checkpointed_peak(CheckpointSimulator& simulator) {
  std::int64_t lowest = simulator.simulate({}).peak_bytes;
  auto consider = [&](const CheckpointPolicy& policy) {
    lowest = std::min(lowest, simulator.simulate(policy).peak_bytes);
  };
  for (const CheckpointPolicy& policy : uniform_candidates(simulator.units())) consider(policy);
  for (const CheckpointPolicy& policy : chen_candidates(simulator.chain())) consider(policy);
  const RotorTable table = rotor_table(simulator);
  for (std::int64_t memory = 0; memory <= table.max_memory(); memory += table.slot_bytes()) {
    if (const std::optional<CheckpointPolicy> policy = table.policy(memory)) {
      consider(*policy);  // the least memory rotor can plan with
      break;
    }
  }
  return lowest;
}

ModelStep model_step(const std::vector<ChainStage>& chain, const CheckpointPolicy& policy) {
  validate(policy, static_cast<std::int32_t>(chain.size()) - 1);
  return ModelWalk(chain).run(policy);
}

RotorTable::RotorTable(std::vector<ChainStage> chain, std::int64_t max_memory, int slots)
    : chain_(std::move(chain)), slots_(slots) {
  const std::size_t n = chain_.size();
  // The table holds n² (slots + 1) entries of 12 bytes: up to 1.5 GiB.
  constexpr std::size_t kMaxStages = 8192, kMaxEntries = std::size_t{1} << 27;
  if (slots < 1) throw std::invalid_argument("rotor needs at least one memory slot, not " + std::to_string(slots));
  if (n > kMaxStages || n * n * static_cast<std::size_t>(slots + 1) > kMaxEntries)
    throw std::length_error("rotor's table for " + std::to_string(n) + " stages and " + std::to_string(slots) +
                            " memory slots would exceed " + std::to_string(kMaxEntries) + " entries");
  slot_ = std::max<std::int64_t>(1, ceil_div(max_memory, slots));
  cost_.assign(n * n * static_cast<std::size_t>(slots_ + 1), -1);
  choice_.assign(cost_.size(), 0);
  auto up = [&](std::int64_t bytes) { return ceil_div(std::max<std::int64_t>(bytes, 0), slot_); };
  struct StageSlots {
    std::int64_t input, kept, forward, no_grad, backward, flops;
  };
  std::vector<StageSlots> stage;
  stage.reserve(n);
  for (const ChainStage& c : chain_)
    stage.push_back({up(c.input), up(c.kept), up(c.forward_peak), up(c.no_grad_peak), up(c.backward_peak),
                     c.forward_flops});
  for (std::size_t d = 0; d < n; ++d) {
    for (std::size_t s = 0; s + d < n; ++s) {
      const std::size_t t = s + d;
      // The last stage's output gradient is the loss's, left out.
      const std::int64_t gradient = t + 1 < n ? stage[t + 1].input : 0;
      const StageSlots& first = stage[s];
      for (std::int64_t m = 0; m <= slots_; ++m) {
        std::int64_t best = -1;
        std::int32_t pick = 0;
        // Stage s runs with autograd, then the rest.
        if (gradient + first.forward <= m) {
          if (s == t) {
            if (gradient + first.kept + first.backward <= m) best = first.flops;
          } else if (m >= first.kept && first.kept + stage[s + 1].input + first.backward <= m) {
            const std::int64_t rest = cost_[index(s + 1, t, m - first.kept)];
            if (rest >= 0) best = first.flops + rest;
          }
        }
        // Segment [s, s'-1] without autograd, its output kept; the rest;
        // then the segment recomputed with its own policy.
        std::int64_t forward_flops = 0, forward_peak = 0;
        for (std::size_t next = s + 1; next <= t; ++next) {
          const std::size_t v = next - 1;
          forward_flops += stage[v].flops;
          forward_peak = std::max(forward_peak, (v > s ? stage[v].input : 0) + stage[v].no_grad);
          if (gradient + forward_peak > m || m < stage[next].input) continue;
          const std::int64_t rest = cost_[index(next, t, m - stage[next].input)];
          const std::int64_t again = cost_[index(s, v, m)];
          if (rest < 0 || again < 0) continue;
          const std::int64_t total = forward_flops + rest + again;
          if (best < 0 || total < best) {
            best = total;
            pick = static_cast<std::int32_t>(next);
          }
        }
        cost_[index(s, t, m)] = best;
        choice_[index(s, t, m)] = pick;
      }
    }
  }
}

std::size_t RotorTable::index(std::size_t s, std::size_t t, std::int64_t m) const {
  return (s * chain_.size() + t) * static_cast<std::size_t>(slots_ + 1) + static_cast<std::size_t>(m);
}

std::int64_t RotorTable::slots_of(std::int64_t memory) const {
  return std::min<std::int64_t>(slots_, memory / slot_);
}

std::optional<std::int64_t> RotorTable::flops(std::int64_t memory) const {
  if (memory < 0) return std::nullopt;
  const std::int64_t cost = cost_[index(0, chain_.size() - 1, slots_of(memory))];
  if (cost < 0) return std::nullopt;
  return cost;
}

std::optional<CheckpointPolicy> RotorTable::policy(std::int64_t memory) const {
  if (!flops(memory)) return std::nullopt;
  CheckpointPolicy policy;
  build(0, chain_.size() - 1, slots_of(memory), policy.segments);
  return policy;
}

void RotorTable::build(std::size_t s, std::size_t t, std::int64_t m, std::vector<Segment>& out) const {
  for (;;) {
    const std::int32_t pick = choice_[index(s, t, m)];
    if (pick == 0) {
      if (s == t) return;
      m -= ceil_div(std::max<std::int64_t>(chain_[s].kept, 0), slot_);
      ++s;
      continue;
    }
    const auto next = static_cast<std::size_t>(pick);
    Segment segment{static_cast<std::int32_t>(s), static_cast<std::int32_t>(next - 1), {}};
    build(s, next - 1, m, segment.inner);
    out.push_back(std::move(segment));
    m -= ceil_div(std::max<std::int64_t>(chain_[next].input, 0), slot_);
    s = next;
  }
}

}  // namespace metamem
