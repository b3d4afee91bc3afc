// metamem checkpoint: the checkpointing policy with the least recompute that
// fits a memory budget, predicted by the simulator and checked by a trace.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <iostream>

#include "estimator/CheckpointSolve.h"
#include "estimator/HtmlReport.h"
#include "estimator/Report.h"
#include "estimator/Units.h"
#include "examples/cli/Commands.h"
#include "examples/cli/Flags.h"
#include "examples/cli/ModelFlags.h"
#include "examples/cli/Output.h"

namespace metamem::cli {
namespace {

constexpr int kParetoPoints = 12;

// Budgets from the lowest reachable peak to the peak without checkpointing.
std::vector<CheckpointReport::Point> pareto(CheckpointSimulator& simulator, const std::string& solver,
                                            std::int64_t lowest, std::int64_t highest) {
  std::vector<CheckpointReport::Point> points;
  for (int i = 0; i < kParetoPoints; ++i) {
    const auto budget = static_cast<std::int64_t>(
        static_cast<double>(lowest) +
        static_cast<double>(highest - lowest) * i / static_cast<double>(kParetoPoints - 1));
    if (const auto plan = solve_checkpointing(simulator, solver, budget))
      points.push_back({budget, plan->step.peak_bytes, plan->step.recompute_flops});
  }
  return points;
}

}  // namespace

int checkpoint_command(const std::vector<std::string>& args) {
  ModelFlags m;
  std::string budget_text, solver = "auto", format = "table", html;
  bool with_pareto = false, achieved = false;
  Flags flags;
  m.add_to(flags);
  flags.add("--budget", &budget_text);
  flags.add("--solver", &solver, checkpoint_solvers());
  flags.add("--format", &format, {"table", "json"});
  flags.add_switch("--pareto", &with_pareto);
  flags.add("--html", &html);
  flags.add_switch("--achieved", &achieved);
  if (const auto extra = flags.parse(args); !extra.empty())
    throw UsageError("unexpected argument '" + extra[0] + "'");
  if (budget_text.empty()) throw UsageError("checkpoint needs --budget");
  if (m.selective_recompute)
    throw UsageError("checkpoint chooses what to recompute itself: leave out --selective-recompute");
  if (achieved && (m.device != "cpu" || m.config().dtype != c10::kFloat))
    throw UsageError("--achieved needs --device cpu and --dtype f32 (a real CPU run)");
  const std::int64_t budget = parse_memory(budget_text, "--budget");
  const RunInfo run = m.run_info();
  const ModelFlags::TracedGpu traced_for = m.gpu_scope();
  const c10::Device device(m.device);

  auto trace_with = [&](const CheckpointPolicy& policy) { return trace_step(m.builder(policy), device, *run.options); };
  const Trace plain = trace_with({});
  CheckpointSimulator simulator([&](const CheckpointPolicy& policy) {
    return policy.segments.empty() && policy.keep.empty() ? plain : trace_with(policy);
  });

  const auto start = std::chrono::steady_clock::now();
  const std::optional<CheckpointPlan> plan = solve_checkpointing(simulator, solver, budget);
  const double solver_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!plan) {
    const std::int64_t lowest = lowest_checkpointed_peak(simulator);
    std::cerr << fmt::format(
        "metamem: {} does not fit in {} with the {} solver; {}\n", m.zoo.model, human_bytes(budget), solver,
        budget < lowest ? fmt::format("the least memory any policy reaches is {} ({} B)", human_bytes(lowest), lowest)
                        : fmt::format("--solver auto reaches {}", human_bytes(lowest)));
    return 1;
  }

  CheckpointReport report;
  report.run = run;
  report.budget = budget;
  report.solver = plan->solver;
  report.policy = plan->policy;
  for (std::int32_t u = 0; u < simulator.units(); ++u)
    report.unit_names.push_back(simulator.chain()[static_cast<std::size_t>(u)].name);
  report.peak_bytes = plan->step.peak_bytes;
  report.recompute_flops = plan->step.recompute_flops;
  report.step_flops = simulator.step_flops();
  report.unchecked_peak_bytes = plain.measured().peak_bytes;
  report.solver_ms = solver_ms;
  Trace retraced = trace_with(plan->policy);
  report.retraced_peak_bytes = retraced.measured().peak_bytes;
  // The page draws the memory-recompute curve: --html computes it too.
  if (with_pareto || !html.empty()) {
    Progress progress("checkpoint");
    progress.update("memory-recompute curve");
    report.pareto = pareto(simulator, solver, lowest_checkpointed_peak(simulator), report.unchecked_peak_bytes);
  }
  if (achieved) report.achieved_peak_bytes = achieved_cpu_step_peaks(m.builder(plan->policy), *run.options).back();
  if (!html.empty()) {
    const Estimate est = estimate(std::move(retraced), m.allocator());
    write_file(html, report_html(report_json(run, est, 2), checkpoint_json(report)));
  }
  if (format == "json")
    std::cout << checkpoint_json(report).dump(2) << "\n";
  else
    fmt::print("{}", checkpoint_text(report));
  return 0;
}

}  // namespace metamem::cli
