// metamem fit: the largest batch size whose predicted steady-state step fits
// in memory, with or without checkpointing.
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <iostream>
#include <optional>

#include "estimator/CheckpointSolve.h"
#include "estimator/Estimate.h"
#include "estimator/Units.h"
#include "examples/cli/Commands.h"
#include "examples/cli/Flags.h"
#include "examples/cli/ModelFlags.h"
#include "examples/cli/Output.h"

namespace metamem::cli {
namespace {

// One batch size tried.
struct Trial {
  bool fits = false;
  std::int64_t bytes = 0;  // reserved by the CUDA allocator (fake cuda) or live (fake cpu)
  std::optional<CheckpointPlan> plan;  // with --checkpoint
  std::int64_t step_flops = 0;         // without checkpointing
};

// Bounds a batch search re-plans with: the live-bytes budget shrinks by
// what the allocator reserved beyond the memory, a few times at most.
constexpr int kReplans = 4;

}  // namespace

int fit_command(const std::vector<std::string>& args) {
  ModelFlags m;
  std::string memory_text, format = "table", checkpoint = "none";
  std::int64_t max_batch = 1 << 16;
  Flags flags;
  m.add_to(flags);
  flags.add("--memory", &memory_text);
  flags.add("--max-batch", &max_batch);
  flags.add("--format", &format, {"table", "json"});
  flags.add("--checkpoint", &checkpoint, checkpoint_solvers());
  if (const auto extra = flags.parse(args); !extra.empty())
    throw UsageError("unexpected argument '" + extra[0] + "'");
  if (memory_text.empty()) throw UsageError("fit needs --memory");
  if (max_batch < 1) throw UsageError("--max-batch must be positive");
  if (m.is_script()) throw UsageError("fit varies the batch of a zoo model; a TorchScript model's batch is in its --input");
  const std::int64_t memory = parse_memory(memory_text, "--memory");
  const StepOptions options = m.step_options();
  const int divisions = m.allocator_divisions();
  const c10::Device device(m.device);

  std::int64_t traces = 0;
  auto trace_with = [&](std::int64_t batch, const CheckpointPolicy& policy) {
    ZooConfig config = m.config();
    config.batch = batch;
    config.checkpoint = policy;
    ++traces;
    return trace_step(zoo_step(config), device, options);
  };
  // On CUDA the allocator's segments must fit; on CPU the live bytes.
  auto needed = [&](const Trace& trace) {
    return m.device == "cuda" ? simulate_allocator(trace, divisions).reserved : trace.measured().peak_bytes;
  };
  Progress progress("fit");
  auto trial = [&](std::int64_t batch) {
    progress.update(fmt::format("tracing batch {}", batch));
    Trial result;
    const Trace plain = trace_with(batch, {});
    result.bytes = needed(plain);
    result.fits = result.bytes <= memory;
    if (result.fits || checkpoint == "none") return result;
    CheckpointSimulator simulator([&](const CheckpointPolicy& policy) {
      return policy.segments.empty() && policy.keep.empty() ? plain : trace_with(batch, policy);
    });
    std::int64_t budget = memory;
    for (int replan = 0; replan < kReplans; ++replan) {
      std::optional<CheckpointPlan> plan = solve_checkpointing(simulator, checkpoint, budget);
      if (!plan) break;
      const std::int64_t bytes = needed(trace_with(batch, plan->policy));
      if (bytes <= memory) return Trial{true, bytes, std::move(plan), simulator.step_flops()};
      budget -= bytes - memory;
    }
    return result;
  };

  // Doubling, then bisection between the last batch that fits and the first that does not.
  std::int64_t fails = 0;
  std::optional<std::pair<std::int64_t, Trial>> best;
  for (std::int64_t batch = 1; batch <= max_batch; batch *= 2) {
    Trial t = trial(batch);
    if (!t.fits) {
      fails = batch;
      break;
    }
    best.emplace(batch, std::move(t));
  }
  if (fails == 0) fails = max_batch + 1;
  while (fails - (best ? best->first : 0) > 1) {
    const std::int64_t batch = (best ? best->first : 0) + (fails - (best ? best->first : 0)) / 2;
    Trial t = trial(batch);
    if (t.fits)
      best.emplace(batch, std::move(t));
    else
      fails = batch;
  }

  progress.finish();

  const std::int64_t batch = best ? best->first : 0;
  const std::optional<CheckpointPlan> plan = best ? best->second.plan : std::nullopt;
  if (format == "json") {
    nlohmann::json out{{"model", m.zoo.model},
                       {"device", m.device},
                       {"memory_bytes", memory},
                       {"batch", batch},
                       {"predicted_bytes", best ? best->second.bytes : 0},
                       {"checkpoint", checkpoint},
                       {"traces", traces}};
    if (plan)
      out["plan"] = {{"solver", plan->solver},
                     {"policy_text", to_string(plan->policy)},
                     {"recompute_flops", plan->step.recompute_flops},
                     {"step_flops", best->second.step_flops}};
    std::cout << out.dump(2) << "\n";
  } else if (!best) {
    fmt::print("{} does not fit in {} even at batch 1 (fake {}{}).\n", m.zoo.model, human_bytes(memory),
               m.device, checkpoint == "none" ? "" : ", with checkpointing");
  } else {
    fmt::print("largest batch that fits in {}: {} ({} predicted{}; {} traces)\n", human_bytes(memory), batch,
               human_bytes(best->second.bytes), m.device == "cuda" ? " reserved by the CUDA allocator" : "",
               traces);
    if (plan)
      fmt::print("  with checkpointing ({}): units {}, recomputing {} ({:.1f}% of the step)\n", plan->solver,
                 to_string(plan->policy), human_flops(plan->step.recompute_flops),
                 100.0 * static_cast<double>(plan->step.recompute_flops) /
                     static_cast<double>(std::max<std::int64_t>(best->second.step_flops, 1)));
  }
  return 0;
}

}  // namespace metamem::cli
