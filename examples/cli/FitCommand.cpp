// metamem fit: the largest batch size whose predicted steady-state step fits
// in memory, with or without checkpointing.
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
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

using Fit = std::optional<std::pair<std::int64_t, Trial>>;

// The bytes a trace needs: on CUDA the allocator's segments, on CPU the live bytes.
std::int64_t needed_bytes(const ModelFlags& m, const Trace& trace) {
  return m.device == "cuda" ? simulate_allocator(trace, m.allocator_divisions()).reserved
                            : trace.measured().peak_bytes;
}

// The largest batch up to `max_batch` whose trial fits: doubling from
// `fits_at` (a batch known to fit, or 0), then bisection between the last
// batch that fits and the first that does not.
template <typename TrialFn>
Fit largest_batch(const TrialFn& trial, std::int64_t max_batch, std::int64_t fits_at = 0) {
  Fit best;
  std::int64_t fails = 0;
  const std::int64_t start = std::clamp<std::int64_t>(fits_at, 1, max_batch);
  for (std::int64_t batch = start; batch <= max_batch; batch *= 2) {
    Trial t = trial(batch);
    if (!t.fits) {
      fails = batch;
      break;
    }
    best.emplace(batch, std::move(t));
  }
  if (!best && start > 1) return largest_batch(trial, start - 1);  // the hint did not fit after all
  if (fails == 0) fails = max_batch + 1;
  std::int64_t low = best ? best->first : 0;
  while (fails - low > 1) {
    const std::int64_t batch = low + (fails - low) / 2;
    Trial t = trial(batch);
    if (t.fits) {
      best.emplace(batch, std::move(t));
      low = batch;
    } else {
      fails = batch;
    }
  }
  return best;
}

// One parallel layout of the GPUs and how much it recomputes.
struct Layout {
  std::int64_t tp = 1;
  int dp = 1, zero = 0;
  enum class Recompute { None, Selective, Full } recompute = Recompute::None;
};

const char* recompute_name(Layout::Recompute r) {
  switch (r) {
    case Layout::Recompute::None: return "none";
    case Layout::Recompute::Selective: return "selective";
    case Layout::Recompute::Full: return "full";
  }
  return "?";
}

// Every layout of `gpus` (tensor parallel within a node, with sequence
// parallelism; data parallel over the rest with each ZeRO stage; no,
// selective or full recompute) with its largest micro-batch that fits,
// ordered by least recompute, then largest micro-batch.
int search_layouts(const ModelFlags& m, std::int64_t gpus, std::int64_t memory, std::int64_t max_batch,
                   const std::string& format) {
  if (m.zoo.model != "gpt2" && m.zoo.model != "llama")
    throw UsageError("fit --search lays out gpt2 and llama over GPUs");
  if (m.tp != 1 || m.sequence_parallel || m.selective_recompute || m.dp != 1 || m.zero != 0 || m.fsdp != "none" ||
      m.policy != "none")
    throw UsageError("fit --search chooses --tp, --dp, --zero and recompute itself: leave them out");
  if (gpus < 1 || gpus > 4096) throw UsageError("--gpus must be between 1 and 4096");
  const auto started = std::chrono::steady_clock::now();
  const c10::Device device(m.device);
  const ZooConfig model = m.config();
  zoo_step(model);  // the model itself must be valid; layouts it cannot split are skipped
  std::int64_t traces = 0;
  Progress progress("fit --search");
  auto fit = [&](const Layout& layout, std::int64_t fits_at) {
    ZooConfig config = model;
    config.tensor_parallel = {layout.tp, layout.tp > 1};
    config.selective_recompute = layout.recompute == Layout::Recompute::Selective;
    if (layout.recompute == Layout::Recompute::Full)
      for (std::int32_t u = 0; u < config.layers; ++u) config.checkpoint.segments.push_back({u, u, {}});
    StepOptions options = m.step_options();
    options.data_parallel = {layout.dp, layout.zero};
    return largest_batch(
        [&](std::int64_t batch) {
          progress.update(fmt::format("tp {} dp {} zero {} recompute {}: batch {}", layout.tp, layout.dp, layout.zero,
                                      recompute_name(layout.recompute), batch));
          config.batch = batch;
          ++traces;
          const Trace trace = trace_step(zoo_step(config), device, options);
          Trial t;
          t.bytes = needed_bytes(m, trace);
          t.fits = t.bytes <= memory;
          return t;
        },
        max_batch, fits_at);
  };

  struct Row {
    Layout layout;
    std::int64_t micro_batch, bytes;
  };
  std::vector<Row> rows;
  for (std::int64_t tp = 1; tp <= std::min<std::int64_t>(gpus, 8); tp *= 2) {
    if (gpus % tp != 0) continue;
    const int dp = static_cast<int>(gpus / tp);
    std::vector<std::int64_t> fits_at(4, 0);  // per ZeRO stage: more recompute fits at least as much
    for (auto recompute : {Layout::Recompute::None, Layout::Recompute::Selective, Layout::Recompute::Full}) {
      if (recompute == Layout::Recompute::Selective && model.flash_attention) continue;  // nothing to recompute
      std::int64_t fits_below = 0;  // a higher ZeRO stage fits at least as much
      for (int zero = 0; zero <= (dp > 1 ? 3 : 0); ++zero) {
        const Layout layout{tp, dp, zero, recompute};
        Fit best;
        try {
          best = fit(layout, std::max(fits_at[zero], fits_below));
        } catch (const std::invalid_argument&) {
          continue;  // the model does not split so (its ffn or vocabulary over tp ranks)
        }
        if (!best) continue;
        fits_at[zero] = fits_below = best->first;
        rows.push_back({layout, best->first, best->second.bytes});
      }
    }
  }
  progress.finish();
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    if (a.layout.recompute != b.layout.recompute) return a.layout.recompute < b.layout.recompute;
    return a.micro_batch > b.micro_batch;
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (format == "json") {
    nlohmann::json layouts = nlohmann::json::array();
    for (const auto& [l, micro_batch, bytes] : rows)
      layouts.push_back({{"tp", l.tp}, {"sequence_parallel", l.tp > 1}, {"dp", l.dp}, {"zero_stage", l.zero},
                         {"recompute", recompute_name(l.recompute)}, {"micro_batch", micro_batch},
                         {"predicted_bytes", bytes}});
    std::cout << nlohmann::json{{"model", m.zoo.model}, {"gpus", gpus}, {"memory_bytes", memory},
                                {"layouts", layouts}, {"traces", traces}, {"seconds", seconds}}
                     .dump(2)
              << "\n";
    return 0;
  }
  fmt::print("{} layouts of {} on {} GPUs of {} that fit ({} traces, {:.1f} s); tensor parallel with sequence "
             "parallelism, no pipeline parallelism\n",
             rows.size(), m.zoo.model, gpus, human_bytes(memory), traces, seconds);
  fmt::print("{:>4} {:>5} {:>5} {:>10} {:>12} {:>14}\n", "tp", "dp", "zero", "recompute", "micro-batch",
             m.device == "cuda" ? "reserved" : "peak");
  for (const auto& [l, micro_batch, bytes] : rows)
    fmt::print("{:>4} {:>5} {:>5} {:>10} {:>12} {:>14}\n", l.tp, l.dp, l.zero, recompute_name(l.recompute),
               micro_batch, human_bytes(bytes));
  return 0;
}

}  // namespace

int fit_command(const std::vector<std::string>& args) {
  ModelFlags m;
  std::string memory_text, format = "table", checkpoint = "none";
  std::int64_t max_batch = 1 << 16, gpus = 0;
  bool search = false;
  Flags flags;
  m.add_to(flags);
  flags.add("--memory", &memory_text);
  flags.add_switch("--search", &search);
  flags.add("--gpus", &gpus);
  flags.add("--max-batch", &max_batch);
  flags.add("--format", &format, {"table", "json"});
  flags.add("--checkpoint", &checkpoint, checkpoint_solvers());
  if (const auto extra = flags.parse(args); !extra.empty())
    throw UsageError("unexpected argument '" + extra[0] + "'");
  if (memory_text.empty()) throw UsageError("fit needs --memory");
  if (max_batch < 1) throw UsageError("--max-batch must be positive");
  if (m.is_script()) throw UsageError("fit varies the batch of a zoo model; a TorchScript model's batch is in its --input");
  const std::int64_t memory = parse_memory(memory_text, "--memory");
  if (search != (gpus != 0)) throw UsageError("--search and --gpus N go together");
  if (search) {
    if (checkpoint != "none") throw UsageError("fit --search tries no, selective and full recompute itself");
    return search_layouts(m, gpus, memory, max_batch, format);
  }
  const StepOptions options = m.step_options();
  const c10::Device device(m.device);

  std::int64_t traces = 0;
  auto trace_with = [&](std::int64_t batch, const CheckpointPolicy& policy) {
    ZooConfig config = m.config();
    config.batch = batch;
    config.checkpoint = policy;
    ++traces;
    return trace_step(zoo_step(config), device, options);
  };
  Progress progress("fit");
  auto trial = [&](std::int64_t batch) {
    progress.update(fmt::format("tracing batch {}", batch));
    Trial result;
    const Trace plain = trace_with(batch, {});
    result.bytes = needed_bytes(m, plain);
    result.fits = result.bytes <= memory;
    if (result.fits || checkpoint == "none") return result;
    CheckpointSimulator simulator([&](const CheckpointPolicy& policy) {
      return policy.segments.empty() && policy.keep.empty() ? plain : trace_with(batch, policy);
    });
    std::int64_t budget = memory;
    for (int replan = 0; replan < kReplans; ++replan) {
      std::optional<CheckpointPlan> plan = solve_checkpointing(simulator, checkpoint, budget);
      if (!plan) break;
      const std::int64_t bytes = needed_bytes(m, trace_with(batch, plan->policy));
      if (bytes <= memory) return Trial{true, bytes, std::move(plan), simulator.step_flops()};
      budget -= bytes - memory;
    }
    return result;
  };

  const std::optional<std::pair<std::int64_t, Trial>> best = largest_batch(trial, max_batch);
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
