// The report of traced steps: one model, rendered as JSON, text tables and
// CSV for the CLI and the Python module.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "estimator/Estimate.h"

namespace metamem {

// What was traced, as the report names it.
struct RunInfo {
  std::string model;
  std::string device = "cuda";
  std::string dtype = "f32";
  std::int64_t batch = 0;
  StepOptions options;
};

// Peak bytes of each step of a real CPU run; empty when there was none.
using StepPeaks = std::vector<std::int64_t>;

// The whole report: run, predicted peaks, model states, allocator, plan,
// nodes, modules at `depth`, the measured step's timeline, achieved peaks.
nlohmann::json report_json(const RunInfo& run, const Estimate& est, int depth,
                           const StepPeaks& achieved = {});

// Rows as the CLI prints them: a text table with human units, or CSV with
// raw integers.
std::string rows_table(const std::vector<NodeRow>& rows);
std::string rows_csv(const std::vector<NodeRow>& rows);

// The summary: model states, peaks (first and measured step), what is live
// at the peak by category, allocator, plan, achieved.
std::string summary_text(const RunInfo& run, const Estimate& est, const StepPeaks& achieved = {});

}  // namespace metamem
