// metamem profile: trace one training step of a zoo model on a fake device.
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <iostream>

#include "examples/cli/Flags.h"
#include "examples/cli/Units.h"
#include "examples/zoo/Zoo.h"
#include "profiler/Step.h"

namespace metamem::cli {
namespace {

// The op running when the peak was reached: the first op event at or after
// the peak's allocation.
std::string peak_op(const Trace& trace) {
  for (std::size_t e = trace.peak_event; e < trace.events.size(); ++e) {
    const Event& event = trace.events[e];
    if (event.kind != EventKind::Op) continue;
    const OpEvent& op = trace.ops[event.index];
    const std::string& scope = trace.scopes[op.scope];
    return fmt::format("{} ({}{}{})", trace.op_name(op), phase_name(op.phase),
                       scope.empty() ? "" : ", ", scope);
  }
  return "end of step";
}

}  // namespace

int profile_command(const std::vector<std::string>& args) {
  ZooConfig zoo;
  std::string device = "cuda", format = "table";
  bool achieved = false;
  Flags flags;
  flags.add("--model", &zoo.model);
  for (auto [name, value] : {std::pair{"--batch", &zoo.batch}, {"--seq", &zoo.seq},
                             {"--image", &zoo.image}, {"--layers", &zoo.layers},
                             {"--width", &zoo.width}, {"--heads", &zoo.heads},
                             {"--vocab", &zoo.vocab}})
    flags.add(name, value);
  flags.add("--device", &device, {"cpu", "cuda"});
  flags.add("--format", &format, {"table", "json"});
  flags.add_switch("--achieved", &achieved);
  if (const auto extra = flags.parse(args); !extra.empty())
    throw UsageError("unexpected argument '" + extra[0] + "'");
  if (achieved && device != "cpu") throw UsageError("--achieved needs --device cpu (no GPU run here)");

  const StepBuilder build = zoo_step(zoo);
  const Trace trace = trace_step(build, c10::Device(device));
  const std::int64_t achieved_peak = achieved ? achieved_cpu_peak(build) : 0;

  if (format == "json") {
    nlohmann::json out = {{"model", zoo.model},
                          {"device", device},
                          {"batch", zoo.batch},
                          {"predicted",
                           {{"peak_bytes", trace.peak_bytes},
                            {"step_begin_bytes", trace.step_begin_bytes},
                            {"saved_for_backward_bytes", trace.saved_for_backward_bytes()},
                            {"peak_op", peak_op(trace)},
                            {"ops", trace.ops.size()}}}};
    if (achieved) out["achieved"] = {{"peak_bytes", achieved_peak}};
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  fmt::print("model {} · batch {} · fake device {} · {} ops traced\n", zoo.model, zoo.batch,
             device, trace.ops.size());
  fmt::print("  {:<28}{:>14}\n", "live at step start", human_bytes(trace.step_begin_bytes));
  fmt::print("  {:<28}{:>14}\n", "saved for backward", human_bytes(trace.saved_for_backward_bytes()));
  fmt::print("  {:<28}{:>14}   at {}\n", "predicted peak", human_bytes(trace.peak_bytes),
             peak_op(trace));
  if (achieved) {
    const double error = 100.0 * static_cast<double>(trace.peak_bytes - achieved_peak) /
                         static_cast<double>(achieved_peak);
    fmt::print("  {:<28}{:>14}   error {:+.4f}% ({:+} B)\n", "achieved peak (real CPU)",
               human_bytes(achieved_peak), error, trace.peak_bytes - achieved_peak);
  }
  return 0;
}

}  // namespace metamem::cli
