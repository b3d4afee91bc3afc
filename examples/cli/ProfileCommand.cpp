// metamem profile: trace one training step of a model (zoo or TorchScript) on a
// fake device and report where its memory goes.
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>

#include "estimator/Estimate.h"
#include "estimator/Snapshot.h"
#include "examples/cli/Commands.h"
#include "examples/cli/Flags.h"
#include "examples/cli/ModelFlags.h"
#include "examples/cli/Units.h"

namespace metamem::cli {
namespace {

nlohmann::json row_json(const NodeRow& row) {
  return {{"name", row.name},           {"op", row.op},
          {"module", row.module},       {"phase", phase_name(row.phase)},
          {"fwd_flops", row.fwd_flops}, {"bwd_flops", row.bwd_flops},
          {"fwd_in", row.fwd_in},       {"fwd_tmp", row.fwd_tmp},
          {"fwd_out", row.fwd_out},     {"bwd_tmp", row.bwd_tmp},
          {"bwd_out", row.bwd_out},     {"accumulated", row.accumulated},
          {"peak", row.peak}};
}

nlohmann::json report_json(const ModelFlags& m, const Estimate& est, int depth,
                           std::int64_t achieved) {
  const NodeRow& peak_row = est.nodes.rows.at(est.nodes.peak_row);
  nlohmann::json nodes = nlohmann::json::array(), modules = nlohmann::json::array();
  for (const NodeRow& row : est.nodes.rows) nodes.push_back(row_json(row));
  for (const NodeRow& row : module_table(est.nodes, depth)) modules.push_back(row_json(row));
  std::vector<std::int64_t> timeline;
  for (std::size_t e = est.trace.step_begin; e < est.trace.events.size(); ++e)
    timeline.push_back(est.trace.events[e].live_bytes);
  nlohmann::json out = {
      {"model", m.zoo.model},
      {"device", m.device},
      {"batch", m.batch()},
      {"dtype", m.dtype},
      {"optimizer", m.optimizer},
      {"predicted",
       {{"peak_bytes", est.trace.peak_bytes},
        {"peak_phase", phase_name(est.nodes.peak_phase)},
        {"peak_node", peak_row.name},
        {"step_begin_bytes", est.trace.step_begin_bytes},
        {"saved_for_backward_bytes", est.trace.saved_for_backward_bytes()},
        {"allocator_allocated_peak_bytes", est.allocator.allocated},
        {"allocator_reserved_peak_bytes", est.allocator.reserved},
        {"ops", est.trace.ops.size()}}},
      {"model_states",
       {{"param_bytes", est.states.param_bytes},
        {"grad_bytes", est.states.grad_bytes},
        {"optimizer_bytes", est.states.optimizer_bytes}}},
      {"memonger",
       {{"algorithm", est.plan.plan.algorithm},
        {"planned_bytes", est.plan.stats.planned_bytes},
        {"lower_bound_bytes", est.plan.stats.lower_bound_bytes},
        {"baseline_bytes", est.plan.stats.baseline_bytes}}},
      {"nodes", nodes},
      {"modules", modules},
      {"timeline", timeline}};
  if (achieved >= 0) out["achieved"] = {{"peak_bytes", achieved}};
  return out;
}

void print_rows_table(const std::vector<NodeRow>& rows) {
  fmt::print("{:<36} {:<30} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n", "node",
             "module", "phase", "fwd_flops", "fwd_in", "fwd_tmp", "fwd_out", "bwd_tmp", "bwd_out",
             "accum");
  for (const NodeRow& r : rows)
    fmt::print("{:<36} {:<30} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n", r.name,
               r.module, phase_name(r.phase), r.fwd_flops, human_bytes(r.fwd_in),
               human_bytes(r.fwd_tmp), human_bytes(r.fwd_out), human_bytes(r.bwd_tmp),
               human_bytes(r.bwd_out), human_bytes(r.accumulated));
}

void print_rows_csv(const std::vector<NodeRow>& rows) {
  fmt::print("name,op,module,phase,fwd_flops,bwd_flops,fwd_in,fwd_tmp,fwd_out,bwd_tmp,bwd_out,accumulated,peak\n");
  for (const NodeRow& r : rows)
    fmt::print("{},{},{},{},{},{},{},{},{},{},{},{},{}\n", r.name, r.op, r.module,
               phase_name(r.phase), r.fwd_flops, r.bwd_flops, r.fwd_in, r.fwd_tmp, r.fwd_out,
               r.bwd_tmp, r.bwd_out, r.accumulated, r.peak);
}

void print_summary(const ModelFlags& m, const Estimate& est, std::int64_t achieved) {
  const NodeRow& peak_row = est.nodes.rows.at(est.nodes.peak_row);
  auto line = [](const char* what, std::int64_t bytes, const std::string& note = "") {
    fmt::print("  {:<34}{:>14}{}{}\n", what, human_bytes(bytes), note.empty() ? "" : "   ", note);
  };
  fmt::print("model {} · batch {} · {} · optimizer {} · fake device {} · {} ops traced\n",
             m.zoo.model, m.batch(), m.dtype, m.optimizer, m.device, est.trace.ops.size());
  line("parameters", est.states.param_bytes);
  line("gradients", est.states.grad_bytes);
  line("optimizer states", est.states.optimizer_bytes);
  line("live at step start", est.trace.step_begin_bytes);
  line("saved for backward", est.trace.saved_for_backward_bytes());
  line("predicted peak", est.trace.peak_bytes,
       fmt::format("at {} ({}, module {})", peak_row.name, phase_name(est.nodes.peak_phase),
                   peak_row.module.empty() ? "-" : peak_row.module));
  line("CUDA allocator: max allocated", est.allocator.allocated);
  line("CUDA allocator: max reserved", est.allocator.reserved);
  line("memonger plan", est.plan.stats.planned_bytes,
       fmt::format("{} · lower bound {} · planned/lower bound {:.4f}", est.plan.plan.algorithm,
                   human_bytes(est.plan.stats.lower_bound_bytes), est.plan.stats.ratio()));
  if (achieved >= 0) {
    const double error = 100.0 * static_cast<double>(est.trace.peak_bytes - achieved) /
                         static_cast<double>(achieved);
    line("achieved peak (real CPU)", achieved,
         fmt::format("error {:+.4f}% ({:+} B)", error, est.trace.peak_bytes - achieved));
  }
}

}  // namespace

int profile_command(const std::vector<std::string>& args) {
  ModelFlags m;
  std::string format = "table", table = "summary", snapshot;
  std::int64_t depth = 2;
  bool achieved = false;
  Flags flags;
  m.add_to(flags);
  flags.add("--format", &format, {"table", "csv", "json"});
  flags.add("--table", &table, {"summary", "nodes", "modules"});
  flags.add("--depth", &depth);
  flags.add("--snapshot", &snapshot);
  flags.add_switch("--achieved", &achieved);
  if (const auto extra = flags.parse(args); !extra.empty())
    throw UsageError("unexpected argument '" + extra[0] + "'");
  if (depth < 1) throw UsageError("--depth must be at least 1");
  const StepOptions options = m.step_options();
  const ZooConfig config = m.config();
  if (achieved && (m.device != "cpu" || config.dtype != c10::kFloat))
    throw UsageError("--achieved needs --device cpu and --dtype f32 (a real CPU run)");

  const StepBuilder build = m.builder();
  const int divisions = m.allocator_divisions();
  const Estimate est = estimate(trace_step(build, c10::Device(m.device), options), options, divisions);
  const std::int64_t achieved_peak = achieved ? achieved_cpu_peak(build, options) : -1;
  if (!snapshot.empty()) {
    std::ofstream out(snapshot, std::ios::binary);
    out << memory_snapshot_pickle(est.trace, divisions);
    if (!out) throw std::runtime_error("cannot write '" + snapshot + "'");
  }

  const std::vector<NodeRow> rows =
      table == "modules" ? module_table(est.nodes, static_cast<int>(depth)) : est.nodes.rows;
  if (format == "json") {
    std::cout << report_json(m, est, static_cast<int>(depth), achieved_peak).dump(2) << "\n";
  } else if (format == "csv") {
    print_rows_csv(rows);
  } else {
    if (table != "summary") print_rows_table(rows);
    print_summary(m, est, achieved_peak);
  }
  return 0;
}

}  // namespace metamem::cli
