// metamem plan: plan live ranges from a CSV file with memonger.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "examples/cli/Commands.h"
#include "examples/cli/Flags.h"
#include "examples/cli/Output.h"
#include "estimator/Units.h"
#include "memonger/Plan.h"
#include "memonger/RangeCsv.h"

namespace metamem::cli {

int plan_command(const std::vector<std::string>& args) {
  std::string algorithm = "auto", format = "table", capacity, time_limit, output;
  std::int64_t alignment = 1;
  Flags flags;
  flags.add("--algo", &algorithm, {"greedy", "dp", "bestfit", "exact", "auto"});
  flags.add("--format", &format, {"table", "json"});
  flags.add("--alignment", &alignment);
  flags.add("--capacity", &capacity);
  flags.add("--time-limit", &time_limit);
  flags.add("--output", &output);
  const auto files = flags.parse(args);
  if (files.size() != 1) throw UsageError("plan needs exactly one FILE.csv");
  memonger::PlanLimits limits;
  if (!capacity.empty()) limits.capacity = parse_memory(capacity, "--capacity");
  if (!time_limit.empty()) limits.seconds = parse_seconds(time_limit, "--time-limit");

  if (std::filesystem::is_directory(files[0])) throw memonger::InputError("'" + files[0] + "' is a directory");
  std::ifstream in(files[0]);
  if (!in) throw memonger::InputError("cannot open '" + files[0] + "'");
  const memonger::RangeTable table = memonger::read_ranges_csv(in);
  if (table.ranges.empty()) throw memonger::InputError("'" + files[0] + "' has no ranges");
  const memonger::Problem problem(table.ranges, alignment);
  const auto start = std::chrono::steady_clock::now();
  const memonger::Plan plan = memonger::make_planner(algorithm, limits)->plan(problem);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (const auto errors = memonger::verify(problem, plan); !errors.empty())
    throw std::logic_error("plan failed verification: " + errors.front());
  const memonger::Statistics stats = memonger::compute_statistics(problem, plan);
  if (!output.empty()) {
    std::ostringstream csv;
    memonger::write_ranges_csv(csv, table, plan.offsets);
    write_file(output, csv.str());
  }
  const bool fits = !limits.capacity || stats.planned_bytes <= *limits.capacity;

  if (format == "json") {
    nlohmann::json json{{"algorithm", plan.algorithm},
                        {"ranges", problem.size()},
                        {"baseline_bytes", stats.baseline_bytes},
                        {"planned_bytes", stats.planned_bytes},
                        {"lower_bound_bytes", stats.lower_bound_bytes},
                        {"proven_bound_bytes", stats.proven_bound_bytes},
                        {"optimal", stats.optimal()},
                        {"buffers", stats.buffers},
                        {"planned_over_lower_bound", stats.ratio()},
                        {"seconds", seconds}};
    if (limits.capacity) json["capacity_bytes"] = *limits.capacity, json["fits"] = fits;
    std::cout << json.dump(2) << "\n";
  } else {
    fmt::print("{} ranges · algorithm {} · {:.3f} s\n", problem.size(), plan.algorithm, seconds);
    fmt::print("  {:<22}{:>14}\n", "baseline (no sharing)", human_bytes(stats.baseline_bytes));
    fmt::print("  {:<22}{:>14}   {} buffers\n", "planned", human_bytes(stats.planned_bytes), stats.buffers);
    fmt::print("  {:<22}{:>14}   planned / lower bound = {:.4f}\n", "lower bound",
               human_bytes(stats.lower_bound_bytes), stats.ratio());
    if (stats.optimal())
      fmt::print("  optimal: no plan is smaller\n");
    else if (stats.proven_bound_bytes > stats.lower_bound_bytes)
      fmt::print("  {:<22}{:>14}   (gap {:.2f}%)\n", "proven bound", human_bytes(stats.proven_bound_bytes),
                 100.0 * static_cast<double>(stats.planned_bytes - stats.proven_bound_bytes) /
                     static_cast<double>(stats.proven_bound_bytes));
    if (limits.capacity)
      fmt::print("  capacity {} ({} B): {}\n", human_bytes(*limits.capacity), *limits.capacity,
                 fits                                            ? "fits"
                 : stats.proven_bound_bytes > *limits.capacity ? "does not fit (proven)"
                                                                 : "no plan found that fits");
  }
  return fits ? 0 : 1;
}

}  // namespace metamem::cli
