// metamem plan: plan live ranges from a CSV file with memonger.
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>

#include "examples/cli/Commands.h"
#include "estimator/Units.h"
#include "examples/cli/Flags.h"
#include "memonger/Plan.h"
#include "memonger/RangeCsv.h"

namespace metamem::cli {

int plan_command(const std::vector<std::string>& args) {
  std::string algorithm = "auto", format = "table";
  std::int64_t alignment = 1;
  Flags flags;
  flags.add("--algo", &algorithm, {"greedy", "dp", "bestfit", "auto"});
  flags.add("--format", &format, {"table", "json"});
  flags.add("--alignment", &alignment);
  const auto files = flags.parse(args);
  if (files.size() != 1) throw UsageError("plan needs exactly one FILE.csv");

  std::ifstream in(files[0]);
  if (!in) throw memonger::InputError("cannot open '" + files[0] + "'");
  const memonger::Problem problem(memonger::read_ranges_csv(in), alignment);
  const memonger::Plan plan = memonger::make_planner(algorithm)->plan(problem);
  if (const auto errors = memonger::verify(problem, plan); !errors.empty())
    throw std::logic_error("plan failed verification: " + errors.front());
  const memonger::Statistics stats = memonger::compute_statistics(problem, plan);

  if (format == "json") {
    std::cout << nlohmann::json{{"algorithm", plan.algorithm},
                                {"ranges", problem.size()},
                                {"baseline_bytes", stats.baseline_bytes},
                                {"planned_bytes", stats.planned_bytes},
                                {"lower_bound_bytes", stats.lower_bound_bytes},
                                {"buffers", stats.buffers},
                                {"planned_over_lower_bound", stats.ratio()}}
                     .dump(2)
              << "\n";
    return 0;
  }
  fmt::print("{} ranges · algorithm {}\n", problem.size(), plan.algorithm);
  fmt::print("  {:<22}{:>14}\n", "baseline (no sharing)", human_bytes(stats.baseline_bytes));
  fmt::print("  {:<22}{:>14}   {} buffers\n", "planned", human_bytes(stats.planned_bytes), stats.buffers);
  fmt::print("  {:<22}{:>14}   planned / lower bound = {:.4f}\n", "lower bound",
             human_bytes(stats.lower_bound_bytes), stats.ratio());
  return 0;
}

}  // namespace metamem::cli
