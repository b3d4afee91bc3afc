// metamem fit: the largest batch size whose predicted steady-state step fits
// in memory, with or without checkpointing.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <optional>

#include "estimator/BatchLine.h"
#include "estimator/BatchSearch.h"
#include "estimator/CachingAllocator.h"
#include "estimator/CheckpointSolve.h"
#include "estimator/Estimate.h"
#include "estimator/Units.h"
#include "examples/cli/Commands.h"
#include "examples/cli/Flags.h"
#include "examples/cli/ModelFlags.h"
#include "examples/cli/Output.h"
#include "examples/cli/Processes.h"
#include "meta/MetaMode.h"
#include "profiler/Tracer.h"

namespace metamem::cli {
namespace {

// One batch size tried: its bytes are reserved by the CUDA allocator (fake
// cuda) or live (fake cpu), with a checkpointing plan's where one fitted.
struct Trial {
  BatchTrial measured;
  std::optional<CheckpointPlan> plan{};  // with --checkpoint
};

// The largest --max-batch: a search doubles and adds batches, far from overflowing.
constexpr std::int64_t kMostBatch = std::int64_t{1} << 40;

// The plans one batch's trial makes at most (plan_within).
constexpr int kReplans = 4;

// The bytes a trace needs: on CUDA the allocator's segments, on CPU the
// live bytes. A step that a memory fraction stops needs more than any.
std::int64_t needed_bytes(const ModelFlags& m, const Trace& trace) {
  if (m.device != "cuda") return trace.measured().peak_bytes;
  try {
    return simulate_allocator(trace, m.allocator()).reserved;
  } catch (const MemoryExceeded&) {
    return std::numeric_limits<std::int64_t>::max();
  }
}

// The measured step's live peak over its forward and backward passes: it
// grows evenly with the batch, where the step's own peak sits in the
// optimizer step at small batches.
std::int64_t passes_peak(const Trace& trace) {
  const std::size_t end = trace.backward_ends.empty() ? trace.events.size() : trace.backward_ends.back();
  std::int64_t peak = 0;
  for (std::size_t e = trace.measured().begin; e < end; ++e) peak = std::max(peak, trace.events[e].live_bytes);
  return peak;
}

// What a step's trace needs against `memory`: `bytes` (reserved on CUDA,
// live on CPU), its passes' peak as the even measure; and its FLOPs.
BatchTrial trial_of(const Trace& trace, std::int64_t bytes, std::int64_t memory) {
  const StepFlops flops = trace.measured_flops();
  return {bytes <= memory, bytes, passes_peak(trace), trace.measured().begin_bytes, flops.total, flops.recompute};
}

// The forward FLOPs a step runs again, as a share of its FLOPs without them.
double recomputed_share(const BatchTrial& trial) {
  const std::int64_t plain = trial.flops - trial.recompute_flops;
  return plain > 0 ? static_cast<double>(trial.recompute_flops) / static_cast<double>(plain) : 0;
}

// A step's trace and what it needs, unless it needs more than `memory`
// (the trace stops there). On CUDA what it needs is what `profile` reports
// and a batch read off a line needs (needed_bytes): the segments of an
// allocator that never runs short. One given only `memory` would release
// its cached segments and retry where it runs short, and can fit a batch
// that way; the search does not count on that.
std::optional<LineTrials::Traced> trace_within(const ModelFlags& m, const StepBuilder& step,
                                               const StepOptions& options, std::int64_t memory) {
  const bool cuda = m.device == "cuda";
  LiveBytesLimit live(memory);
  ReservedBytesLimit reserved(m.allocator(memory));
  try {
    Trace trace = trace_step(step, c10::Device(m.device), options,
                             cuda ? static_cast<AllocationObserver*>(&reserved) : &live);
    const BatchTrial trial = trial_of(trace, needed_bytes(m, trace), memory);
    return LineTrials::Traced{std::move(trace), trial};
  } catch (const MemoryExceeded&) {
    return std::nullopt;
  }
}

// Trials of a step by batch against `memory`: traced until two consecutive
// batches fit, then read off their line.
LineTrials batch_trials(const ModelFlags& m, std::function<StepBuilder(std::int64_t)> step_at,
                        const StepOptions& options, std::int64_t memory) {
  return LineTrials(
      [&m, step_at = std::move(step_at), options, memory](std::int64_t batch) {
        return trace_within(m, step_at(batch), options, memory);
      },
      [&m, memory](const Trace& trace) { return trial_of(trace, needed_bytes(m, trace), memory); });
}

// A plan by `solver` with the least recompute that lets a step fit in
// `memory` where `plain`, its trace without checkpointing, does not;
// proven by tracing it. Solvers plan in live bytes, so on CUDA the budget
// shrinks by what the allocator reserved beyond the memory, and below the
// last plan's peak (which would only be found again), a few times at most.
std::optional<Trial> plan_within(const ModelFlags& m, const CheckpointSimulator::TraceUnder& trace_under,
                                 const Trace& plain, const std::string& solver, std::int64_t memory) {
  CheckpointSimulator simulator([&](const CheckpointPolicy& policy) {
    return policy.segments.empty() && policy.keep.empty() ? plain : trace_under(policy);
  });
  std::int64_t budget = memory;
  for (int replan = 0; replan < kReplans; ++replan) {
    std::optional<CheckpointPlan> plan = solve_checkpointing(simulator, solver, budget);
    if (!plan) break;
    const Trace traced = trace_under(plan->policy);
    const std::int64_t bytes = needed_bytes(m, traced);
    if (bytes <= memory) return Trial{trial_of(traced, bytes, memory), std::move(plan)};
    budget = std::min(budget - (bytes - memory), plan->step.peak_bytes - 1);
  }
  return std::nullopt;
}

// One parallel layout of the GPUs and how it recomputes: not at all,
// Megatron's selective (attention cores) or full (every layer) recompute,
// or as a checkpointing solver planned.
struct Layout {
  std::int64_t tp = 1;
  int pp = 1, dp = 1, zero = 0;
  enum class Recompute { None, Selective, Full, Planned } recompute = Recompute::None;
};

constexpr const char* kRecomputeNames[] = {"none", "selective", "full", "planned"};

const char* recompute_name(Layout::Recompute r) { return kRecomputeNames[static_cast<int>(r)]; }

// A layout with its largest micro-batch that fits (a plan's: the one it
// was made for), and what its busiest pipeline stage needs.
struct Row {
  Layout layout;
  std::int64_t micro_batch = 0;
  std::int64_t bytes = 0;
  int stage = 0;
  double recomputed = 0;           // recompute FLOPs, a share of the step's without them
  std::string solver{}, policy{};  // a plan's
};

nlohmann::json to_json(const Row& row) {
  const Layout& l = row.layout;
  nlohmann::json j{{"tp", l.tp}, {"sequence_parallel", l.tp > 1}, {"pp", l.pp}, {"microbatches", l.pp},
                   {"dp", l.dp}, {"zero_stage", l.zero}, {"recompute", recompute_name(l.recompute)},
                   {"recomputed_share", row.recomputed}, {"micro_batch", row.micro_batch},
                   {"predicted_bytes", row.bytes}, {"peak_stage", row.stage}};
  if (l.recompute == Layout::Recompute::Planned) j["plan"] = {{"solver", row.solver}, {"policy_text", row.policy}};
  return j;
}

Row row_from_json(const nlohmann::json& j) {
  const std::string recompute = j.at("recompute");
  const auto named = std::find(std::begin(kRecomputeNames), std::end(kRecomputeNames), recompute);
  Row row{{j.at("tp"), j.at("pp"), j.at("dp"), j.at("zero_stage"),
             static_cast<Layout::Recompute>(named - std::begin(kRecomputeNames))},
            j.at("micro_batch"), j.at("predicted_bytes"), j.at("peak_stage"), j.at("recomputed_share")};
  if (const auto plan = j.find("plan"); plan != j.end()) {
    row.solver = plan->at("solver");
    row.policy = plan->at("policy_text");
  }
  return row;
}

// Searches the layouts of one tensor- and pipeline-parallel split: data
// parallel over the other GPUs with each ZeRO stage the pipeline allows,
// and no, selective or full recompute, or a solver's plan. Batch searches
// start from what a layout with less sharding or recompute fitted, and the
// slope of one with the same recompute.
class SplitSearch {
 public:
  SplitSearch(const ModelFlags& m, const ZooConfig& model, std::int64_t memory, std::int64_t max_batch,
              std::string solver)
      : m_(m), model_(model), memory_(memory), max_batch_(max_batch), solver_(std::move(solver)) {}

  std::vector<Row> rows(std::int64_t tp, int pp, int dp) {
    // The split's ranks hold NCCL buffers for its process groups beside the allocator.
    budget_ = m_.device == "cuda" ? m_.gpu_memory(memory_, tp, pp, dp).allocator_bytes() : memory_;
    std::vector<Row> rows;
    const int top_zero = dp == 1 ? 0 : pp > 1 ? 1 : 3;  // pipelines shard optimizer states at most
    std::vector<std::int64_t> fits_at(top_zero + 1, 1);  // per ZeRO stage
    for (auto recompute : {Layout::Recompute::None, Layout::Recompute::Selective, Layout::Recompute::Full}) {
      if (recompute == Layout::Recompute::Selective && model_.flash_attention) continue;  // nothing to recompute
      BatchHint hint;
      for (int zero = 0; zero <= top_zero; ++zero) {
        hint.fits_at = std::max(hint.fits_at, fits_at[zero]);
        Row row{{tp, pp, dp, zero, recompute}};
        double bytes_per_sample = 0;
        try {
          bytes_per_sample = fit(row, hint);
        } catch (const std::invalid_argument&) {
          continue;  // the model does not split so (its ffn or vocabulary over tp ranks)
        }
        if (bytes_per_sample > 0) hint.bytes_per_sample = bytes_per_sample;
        if (row.micro_batch == 0) continue;
        fits_at[zero] = hint.fits_at = row.micro_batch;
        rows.push_back(row);
      }
    }
    if (solver_ != "none" && pp == 1)  // the solver's simulator follows no pipeline schedule
      for (int zero = 0; zero <= top_zero; ++zero)
        if (std::optional<Row> row = planned(rows, {tp, pp, dp, zero, Layout::Recompute::Planned}))
          rows.push_back(std::move(*row));
    return rows;
  }

  std::int64_t traces() const { return traces_; }
  std::int64_t line_reads() const { return line_reads_; }

 private:
  ZooConfig config_of(const Layout& layout) const {
    ZooConfig config = model_;
    config.tensor_parallel = {layout.tp, layout.tp > 1};
    config.selective_recompute = layout.recompute == Layout::Recompute::Selective;
    if (layout.recompute == Layout::Recompute::Full)
      config.checkpoint = every_unit_policy(static_cast<std::int32_t>(config.layers / layout.pp));
    return config;
  }

  StepOptions options_of(const Layout& layout) const {
    StepOptions options = m_.step_options();
    options.data_parallel = {layout.dp, layout.zero};
    if (layout.pp > 1) {
      options.grad_accum = layout.pp;
      options.schedule = Schedule::OneFOneB;
    }
    return options;
  }

  // Fills in the row's micro-batch, bytes, stage and recompute; returns
  // the first stage's bytes per sample. A pipeline's first stage holds the
  // most micro-batches in flight and its last the head and loss; the
  // stages between hold less than the first. Under 1F1B with as many
  // micro-batches as stages the first holds its most: more add none.
  double fit(Row& row, BatchHint hint) {
    const Layout& layout = row.layout;
    ZooConfig config = config_of(layout);
    const StepOptions options = options_of(layout);
    const std::vector<int> stages = layout.pp > 1 ? std::vector{0, layout.pp - 1} : std::vector{0};
    std::vector<LineTrials> trials;  // per stage
    for (int stage : stages)
      trials.push_back(batch_trials(
          m_,
          [config, stage, pp = layout.pp](std::int64_t batch) mutable {
            config.pipeline = {pp, stage};
            config.batch = batch;
            return zoo_step(config);
          },
          options, budget_));
    std::int64_t most = max_batch_;
    double bytes_per_sample = 0;
    for (std::size_t s = 0; s < stages.size() && most > 0; ++s) {
      const BatchFit found = largest_batch([&](std::int64_t batch) { return trials[s](batch); }, budget_, most,
                                           s == 0 ? hint : BatchHint{most, 0});
      if (s == 0) bytes_per_sample = found.bytes_per_sample;
      most = trials[s].largest_fitting(found.batch, budget_, most);
    }
    // A later stage's answer can be a batch an earlier one does not fit
    // (fragmentation is not monotone in the batch).
    auto fits_every_stage = [&](std::int64_t batch) {
      for (std::size_t s = 0; s < stages.size(); ++s)
        if (!trials[s](batch).fits) return false;
      return true;
    };
    while (most > 0 && !fits_every_stage(most)) --most;
    row.micro_batch = most;
    for (std::size_t s = 0; s < stages.size() && most > 0; ++s)
      if (const BatchTrial trial = trials[s](most); trial.bytes > row.bytes) {
        row.bytes = trial.bytes;
        row.stage = stages[s];
        row.recomputed = recomputed_share(trial);
      }
    for (const LineTrials& t : trials) {
      traces_ += t.traces();
      line_reads_ += t.line_reads();
    }
    return bytes_per_sample;
  }

  // The solver's least recompute at the micro-batch Megatron's selective
  // recompute reaches (with flash attention, one past what fits without
  // recompute), where that needs recompute and fits with full recompute.
  std::optional<Row> planned(const std::vector<Row>& found, const Layout& layout) {
    auto fitted = [&](Layout::Recompute recompute) -> std::int64_t {
      for (const Row& row : found)
        if (row.layout.zero == layout.zero && row.layout.recompute == recompute) return row.micro_batch;
      return 0;
    };
    const std::int64_t plain = fitted(Layout::Recompute::None), selective = fitted(Layout::Recompute::Selective);
    const std::int64_t batch = selective > 0 ? selective : plain + 1;
    if (batch <= plain || batch > fitted(Layout::Recompute::Full)) return std::nullopt;
    ZooConfig config = config_of(layout);
    config.batch = batch;
    const StepOptions options = options_of(layout);
    auto trace_under = [&](const CheckpointPolicy& policy) {
      ++traces_;
      config.checkpoint = policy;
      return trace_step(zoo_step(config), c10::Device(m_.device), options);
    };
    const std::optional<Trial> trial = plan_within(m_, trace_under, trace_under({}), solver_, budget_);
    if (!trial) return std::nullopt;
    return Row{layout, batch, trial->measured.bytes, 0, recomputed_share(trial->measured), trial->plan->solver,
               to_string(trial->plan->policy)};
  }

  const ModelFlags& m_;
  const ZooConfig& model_;
  std::int64_t memory_;      // the GPU's
  std::int64_t budget_ = 0;  // the allocator's, for the split searched
  std::int64_t max_batch_;
  std::string solver_;
  std::int64_t traces_ = 0, line_reads_ = 0;
};

// Every layout of `gpus` (tensor parallel within a node, with sequence
// parallelism; pipeline stages under 1F1B; data parallel over the rest)
// with its largest micro-batch that fits, and with `solver` (not "none")
// its plans, ordered by least recompute, then largest micro-batch. The
// splits are searched apart, `jobs` at a time.
int search_layouts(const ModelFlags& m, std::int64_t gpus, std::int64_t memory, std::int64_t max_batch,
                   const std::string& solver, int jobs, const std::string& format) {
  if (m.zoo.model != "gpt2" && m.zoo.model != "llama")
    throw UsageError("fit --search lays out gpt2 and llama over GPUs");
  if (m.tp != 1 || m.sequence_parallel || m.selective_recompute || m.pp != 1 || m.dp != 1 || m.zero != 0 ||
      m.fsdp != "none" || m.forward_prefetch || m.policy != "none")
    throw UsageError("fit --search chooses --tp, --pp, --dp, --zero and recompute itself: leave them out");
  if (gpus < 1 || gpus > 4096) throw UsageError("--gpus must be between 1 and 4096");
  const auto started = std::chrono::steady_clock::now();
  const ZooConfig model = m.config();
  zoo_step(model);  // the model itself must be valid; layouts it cannot split are skipped
  struct Split {
    std::int64_t tp;
    int pp, dp;
  };
  // The most tensor-parallel splits first: more of their layouts fit, so
  // they cost the most traces, and the processes end together when the
  // cheap ones come last.
  std::int64_t top_tp = 1;
  while (top_tp * 2 <= std::min<std::int64_t>(gpus, 8)) top_tp *= 2;
  std::vector<Split> splits;
  for (std::int64_t tp = top_tp; tp >= 1; tp /= 2)
    for (int pp = 1; tp * pp <= gpus && pp <= model.layers; pp *= 2)
      if (gpus % (tp * pp) == 0 && model.layers % pp == 0) splits.push_back({tp, pp, static_cast<int>(gpus / (tp * pp))});
  if (m.device == "cuda")  // here, not in the workers: a split whose NCCL buffers leave nothing is the user's error
    for (const Split& split : splits) m.gpu_memory(memory, split.tp, split.pp, split.dp);

  Progress progress("fit --search");
  register_meta_kernels();  // before the workers fork, once for them all
  const std::vector<std::string> found = run_in_processes(
      splits.size(), jobs,
      [&](std::size_t i) {
        SplitSearch search(m, model, memory, max_batch, solver);
        nlohmann::json rows = nlohmann::json::array();
        for (const Row& row : search.rows(splits[i].tp, splits[i].pp, splits[i].dp)) rows.push_back(to_json(row));
        return nlohmann::json{{"rows", rows}, {"traces", search.traces()}, {"line_reads", search.line_reads()}}
            .dump();
      },
      [&](std::size_t done) { progress.update(fmt::format("{} of {} tp × pp splits", done, splits.size())); });
  progress.finish();
  std::vector<Row> rows;
  std::int64_t traces = 0, line_reads = 0;
  for (const std::string& text : found) {
    const nlohmann::json split = nlohmann::json::parse(text);
    traces += split.at("traces").get<std::int64_t>();
    line_reads += split.at("line_reads").get<std::int64_t>();
    for (const nlohmann::json& row : split.at("rows")) rows.push_back(row_from_json(row));
  }
  // Recompute is compared as shown, to a tenth of a percent of the step.
  auto tenths = [](const Row& row) { return std::lround(row.recomputed * 1000); };
  std::stable_sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) {
    if (tenths(a) != tenths(b)) return tenths(a) < tenths(b);
    return a.micro_batch > b.micro_batch;
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (format == "json") {
    nlohmann::json layouts = nlohmann::json::array();
    for (const Row& row : rows) layouts.push_back(to_json(row));
    std::cout << nlohmann::json{{"model", m.zoo.model}, {"gpus", gpus}, {"memory_bytes", memory},
                                {"checkpoint", solver}, {"layouts", layouts}, {"traces", traces},
                                {"line_reads", line_reads}, {"seconds", seconds}, {"jobs", jobs}}
                     .dump(2)
              << "\n";
    return 0;
  }
  fmt::print("{} layouts of {} on {} GPUs of {} that fit ({} traces, {} batches read off lines, {:.1f} s, {} "
             "processes); tensor parallel with sequence parallelism, pipelines under 1F1B with as many micro-batches "
             "as stages{}\n",
             rows.size(), m.zoo.model, gpus, human_bytes(memory), traces, line_reads, seconds, jobs,
             m.device == "cuda" ? "; the CUDA allocator has each GPU's memory less the CUDA context and the NCCL "
                                  "buffers of its layout's process groups (docs/gpu-memory.md)"
                                : "");
  fmt::print("{:>4} {:>4} {:>5} {:>5} {:>10} {:>11} {:>12} {:>14} {:>6}\n", "tp", "pp", "dp", "zero", "recompute",
             "recomputed", "micro-batch", m.device == "cuda" ? "reserved" : "peak", "stage");
  for (const Row& r : rows)
    fmt::print("{:>4} {:>4} {:>5} {:>5} {:>10} {:>10.1f}% {:>12} {:>14} {:>6}\n", r.layout.tp, r.layout.pp,
               r.layout.dp, r.layout.zero, recompute_name(r.layout.recompute), 100 * r.recomputed, r.micro_batch,
               human_bytes(r.bytes), r.layout.pp > 1 ? std::to_string(r.stage) : "");
  if (solver == "none") return 0;
  fmt::print("planned by --checkpoint {} without a pipeline, at the micro-batch selective recompute reaches (with "
             "flash attention, one past none's):\n",
             solver);
  for (const Row& r : rows)
    if (r.layout.recompute == Layout::Recompute::Planned)
      fmt::print("  tp {}, dp {}, zero {}, micro-batch {} ({}): units {}\n", r.layout.tp, r.layout.dp, r.layout.zero,
                 r.micro_batch, r.solver, r.policy);
  return 0;
}

}  // namespace

int fit_command(const std::vector<std::string>& args) {
  ModelFlags m;
  std::string memory_text, format = "table", checkpoint = "none";
  std::int64_t max_batch = 1 << 16, gpus = 0, jobs = default_jobs();
  bool search = false;
  Flags flags;
  m.add_to(flags);
  flags.add("--memory", &memory_text);
  flags.add_switch("--search", &search);
  flags.add("--gpus", &gpus);
  flags.add("--jobs", &jobs);
  flags.add("--max-batch", &max_batch);
  flags.add("--format", &format, {"table", "json"});
  flags.add("--checkpoint", &checkpoint, checkpoint_solvers());
  if (const auto extra = flags.parse(args); !extra.empty())
    throw UsageError("unexpected argument '" + extra[0] + "'");
  if (max_batch < 1 || max_batch > kMostBatch)
    throw UsageError(fmt::format("--max-batch must be between 1 and {} (2^40)", kMostBatch));
  if (m.is_script()) throw UsageError("fit varies the batch of a zoo model; a TorchScript model's batch is in its --input");
  const ModelFlags::TracedGpu traced_for = m.gpu_scope();
  if (memory_text.empty() && m.device != "cuda") throw UsageError("fit --device cpu needs --memory");
  // On fake cuda without --memory, the --gpu's: all of it, as the caching allocator may reserve it.
  const std::int64_t memory = memory_text.empty() ? m.gpu_spec().total_memory : parse_memory(memory_text, "--memory");
  if (search != (gpus != 0)) throw UsageError("--search and --gpus N go together");
  if (search) {
    if (jobs < 1 || jobs > 256) throw UsageError("--jobs must be between 1 and 256");
    return search_layouts(m, gpus, memory, max_batch, checkpoint, static_cast<int>(jobs), format);
  }
  // On fake cuda the allocator has what the GPU holds beside it less.
  const std::optional<GpuMemory> gpu = m.device == "cuda" ? std::optional(m.gpu_memory(memory)) : std::nullopt;
  const std::int64_t budget = gpu ? gpu->allocator_bytes() : memory;
  const StepOptions options = m.step_options();
  const c10::Device device(m.device);

  std::int64_t traces = 0;
  auto step_with = [&](std::int64_t batch, const CheckpointPolicy& policy) {
    ZooConfig config = m.config();
    config.batch = batch;
    config.checkpoint = policy;
    ++traces;
    return zoo_step(config);
  };
  auto trace_with = [&](std::int64_t batch, const CheckpointPolicy& policy) {
    return trace_step(step_with(batch, policy), device, options);
  };
  Progress progress("fit");
  LineTrials plain_trials = batch_trials(
      m, [&](std::int64_t batch) { return step_with(batch, {}); }, options, budget);
  auto trial = [&](std::int64_t batch) {
    progress.update(fmt::format("trying batch {}", batch));
    Trial result;
    if (checkpoint == "none") {
      result.measured = plain_trials(batch);
      return result;
    }
    const Trace plain = trace_with(batch, {});
    const std::int64_t plain_bytes = needed_bytes(m, plain);
    result.measured = {plain_bytes <= budget, plain_bytes};
    if (result.measured.fits) return result;
    std::optional<Trial> planned = plan_within(
        m, [&](const CheckpointPolicy& policy) { return trace_with(batch, policy); }, plain, checkpoint, budget);
    return planned ? std::move(*planned) : result;
  };

  std::map<std::int64_t, Trial> trials;
  const BatchFit found = largest_batch(
      [&](std::int64_t batch) {
        const Trial& t = trials[batch] = trial(batch);
        // A plan that fitted says nothing about the batch's own bytes: bisect.
        return checkpoint == "none" ? t.measured : BatchTrial{t.measured.fits};
      },
      budget, max_batch);
  const std::int64_t batch =
      checkpoint == "none" ? plain_trials.largest_fitting(found.batch, budget, max_batch) : found.batch;
  if (batch != found.batch) trials[batch] = {plain_trials(batch)};
  progress.finish();
  const Trial* best = batch > 0 ? &trials.at(batch) : nullptr;

  const std::optional<CheckpointPlan> plan = best ? best->plan : std::nullopt;
  if (format == "json") {
    nlohmann::json out{{"model", m.zoo.model},
                       {"device", m.device},
                       {"memory_bytes", memory},
                       {"alloc_conf", m.alloc_conf},
                       {"batch", batch},
                       {"max_batch", max_batch},
                       {"capped", batch == max_batch},
                       {"predicted_bytes", best ? best->measured.bytes : 0},
                       {"checkpoint", checkpoint},
                       {"traces", traces},
                       {"line_reads", plain_trials.line_reads()}};
    if (gpu) out["gpu_memory"] = gpu_memory_json(*gpu, best ? best->measured.bytes : 0);
    if (plan)
      out["plan"] = {{"solver", plan->solver},
                     {"policy_text", to_string(plan->policy)},
                     {"recompute_flops", best->measured.recompute_flops},
                     {"step_flops", best->measured.flops - best->measured.recompute_flops}};
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  if (gpu) {
    std::string beside;
    for (const GpuMemoryUse& use : gpu->beside_allocator)
      beside += fmt::format("{}{} ({})", beside.empty() ? " " : ", ", use.what, human_bytes(use.bytes));
    fmt::print("{} of {}: {} left to the CUDA allocator beside{} (docs/gpu-memory.md)\n", human_bytes(memory),
               gpu->gpu, human_bytes(budget), beside);
  }
  if (!best) {
    fmt::print("{} does not fit in {} even at batch 1 (fake {}{}).\n", m.zoo.model, human_bytes(memory),
               m.device, checkpoint == "none" ? "" : ", with checkpointing");
  } else {
    fmt::print("largest batch that fits in {}: {} ({} predicted{}; {} traces, {} batches read off their line)\n",
               human_bytes(memory), batch, human_bytes(best->measured.bytes),
               m.device != "cuda"       ? ""
               : m.alloc_conf.empty() ? " reserved by the CUDA allocator"
                                        : " reserved by the CUDA allocator with " + m.alloc_conf,
               traces, plain_trials.line_reads());
    if (batch == max_batch)
      fmt::print("  {} is the --max-batch cap: larger batches were not tried and may fit\n", max_batch);
    if (plan)
      fmt::print("  with checkpointing ({}): units {}, recomputing {} ({:.1f}% of the step)\n", plan->solver,
                 to_string(plan->policy), human_flops(best->measured.recompute_flops),
                 100 * recomputed_share(best->measured));
  }
  return 0;
}

}  // namespace metamem::cli
