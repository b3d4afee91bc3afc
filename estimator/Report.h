// The report of traced steps: one model, rendered as JSON, text tables and
// CSV for the CLI and the Python module.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "estimator/Estimate.h"
#include "estimator/GpuMemory.h"
#include "profiler/Chain.h"

namespace metamem {

// What was traced, as the report names it.
struct RunInfo {
  std::string model;
  std::string device = "cuda";
  std::string dtype = "f32";
  std::int64_t batch = 0;       // 0: not known (Python code traced as it runs)
  std::string optimizer = "none";
  std::optional<StepOptions> options;  // how metamem ran the steps; none: the traced code ran them
  std::int64_t tensor_parallel = 1;    // the model is one rank's shard of this many
  bool sequence_parallel = false;
  PipelineStage pipeline;  // the model is this stage of a pipeline
  std::string alloc_conf;  // the simulated CUDA allocator's PYTORCH_ALLOC_CONF ("": the default)
  std::optional<GpuMemory> gpu_memory;  // fake cuda: the GPU and what it holds beside the allocator
};

// Peak bytes of each step of a real CPU run; empty when there was none.
using StepPeaks = std::vector<std::int64_t>;

// The whole report: run, predicted peaks, model states, allocator, plan,
// nodes, modules at `depth`, the measured step's timeline, achieved peaks.
nlohmann::json report_json(const RunInfo& run, const Estimate& est, int depth,
                           const StepPeaks& achieved = {});

// The GPU's memory: what it holds beside the allocator, what is left to the
// allocator, and, given the allocator's reserved peak, what that leaves
// ("headroom_bytes"; negative: short).
nlohmann::json gpu_memory_json(const GpuMemory& gpu, std::optional<std::int64_t> reserved_peak = std::nullopt);

// Rows as the CLI prints them: a text table with human units, or CSV with
// raw integers.
std::string rows_table(const std::vector<NodeRow>& rows);
std::string rows_csv(const std::vector<NodeRow>& rows);

// The summary: model states, peaks (first and measured step), what is live
// at the peak by category, allocator, plan, achieved.
std::string summary_text(const RunInfo& run, const Estimate& est, const StepPeaks& achieved = {});

// A checkpointing plan for a budget: the simulator's peak, the re-traced
// one, what it recomputes, and the memory-recompute curve.
struct CheckpointReport {
  RunInfo run;
  std::int64_t budget = 0;
  std::string solver;
  CheckpointPolicy policy;
  std::vector<std::string> unit_names;
  std::int64_t peak_bytes = 0;           // simulated; traced where `traces` found it
  std::int64_t retraced_peak_bytes = 0;  // traced under the policy
  std::int64_t recompute_flops = 0;
  std::int64_t step_flops = 0;           // without checkpointing
  std::int64_t unchecked_peak_bytes = 0;  // without checkpointing
  double solver_ms = 0;
  // 0: the simulator planned it and a trace checked it (the zoo's chains);
  // more: a search of that many traces found it (Python models).
  std::int32_t traces = 0;
  struct Point {
    std::int64_t budget, peak, recompute_flops;
  };
  std::vector<Point> pareto;  // least recompute per budget, with --pareto
  std::int64_t achieved_peak_bytes = -1;  // real CPU run; -1: none
  double overhead() const {
    return step_flops == 0 ? 0.0 : static_cast<double>(recompute_flops) / static_cast<double>(step_flops);
  }
};

nlohmann::json checkpoint_json(const CheckpointReport& report);
std::string checkpoint_text(const CheckpointReport& report);

}  // namespace metamem
