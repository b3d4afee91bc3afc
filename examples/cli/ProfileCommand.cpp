// metamem profile: trace training steps of a model (zoo or TorchScript) on a
// fake device and report where the memory of the measured step goes.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>
#include <sstream>

#include "estimator/AllocatorEvents.h"
#include "estimator/CachingAllocator.h"
#include "estimator/HtmlReport.h"
#include "estimator/Report.h"
#include "estimator/Snapshot.h"
#include "examples/cli/Commands.h"
#include "examples/cli/Flags.h"
#include "examples/cli/ModelFlags.h"
#include "examples/cli/Output.h"

namespace metamem::cli {

int profile_command(const std::vector<std::string>& args) {
  ModelFlags m;
  std::string format = "table", table = "summary", snapshot, html, allocator_events;
  std::int64_t depth = 2;
  bool achieved = false;
  Flags flags;
  m.add_to(flags);
  flags.add("--format", &format, {"table", "csv", "json"});
  flags.add("--table", &table, {"summary", "nodes", "modules"});
  flags.add("--depth", &depth);
  flags.add("--snapshot", &snapshot);
  flags.add("--html", &html);
  flags.add("--allocator-events", &allocator_events);
  flags.add_switch("--achieved", &achieved);
  if (const auto extra = flags.parse(args); !extra.empty())
    throw UsageError("unexpected argument '" + extra[0] + "'");
  if (depth < 1) throw UsageError("--depth must be at least 1");
  depth = std::min<std::int64_t>(depth, 1000);  // deeper than any module tree: all of it
  const RunInfo run = m.run_info();
  const ModelFlags::TracedGpu traced_for = m.gpu_scope();
  if (achieved && (m.device != "cpu" || m.config().dtype != c10::kFloat))
    throw UsageError("--achieved needs --device cpu and --dtype f32 (a real CPU run)");

  const StepBuilder build = m.builder();
  const AllocatorSetup allocator = m.allocator();
  // Following the fake GPU's recordings, cuDNN's workspaces fall back
  // where the GPU cannot hold them, as in a Python trace.
  AllocatorAlongTrace along(allocator, m.gpu_memory(0).allocator_bytes());
  const Estimate est = estimate(
      trace_step(build, c10::Device(m.device), *run.options, traced_for.recordings ? &along : nullptr), allocator);
  const StepPeaks achieved_peaks = achieved ? achieved_cpu_step_peaks(build, *run.options) : StepPeaks{};
  if (!snapshot.empty()) write_file(snapshot, memory_snapshot_pickle(est.trace, allocator));
  if (!allocator_events.empty()) {
    std::ostringstream events;
    write_allocator_events(events, metamem::allocator_events(est.trace));
    write_file(allocator_events, events.str());
  }
  const nlohmann::json report = format == "json" || !html.empty()
                                    ? report_json(run, est, static_cast<int>(depth), achieved_peaks)
                                    : nlohmann::json();
  if (!html.empty()) write_file(html, report_html(report));

  const std::vector<NodeRow> rows =
      table == "modules" ? module_table(est.nodes, static_cast<int>(depth)) : est.nodes.rows;
  if (format == "json") {
    std::cout << report.dump(2) << "\n";
  } else if (format == "csv") {
    fmt::print("{}", rows_csv(rows));
  } else {
    if (table != "summary") fmt::print("{}", rows_table(rows));
    fmt::print("{}", summary_text(run, est, achieved_peaks));
  }
  return 0;
}

}  // namespace metamem::cli
