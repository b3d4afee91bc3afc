// metamem: will one training step fit? Traces it on a fake device.
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "examples/zoo/Zoo.h"
#include "meta/MetaMode.h"
#include "profiler/Step.h"

namespace {

using metamem::Trace;

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr const char* kUsage =
    "usage: metamem profile --model NAME --batch N --device cpu|cuda [--seq L] [--image S]\n"
    "                       [--layers N] [--width N] [--heads N] [--vocab N]\n"
    "                       [--achieved] [--format table|json]\n";

struct Options {
  metamem::ZooConfig zoo;
  std::string device = "cuda";
  std::string format = "table";
  bool achieved = false;
};

std::int64_t parse_int(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  std::int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size())
    throw UsageError(fmt::format("{} expects an integer, got '{}'", flag, text));
  return value;
}

Options parse(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) != "profile")
    throw UsageError(argc < 2 ? "missing command" : fmt::format("unknown command '{}'", argv[1]));
  Options options;
  std::map<std::string, std::int64_t*> ints = {
      {"--batch", &options.zoo.batch},   {"--seq", &options.zoo.seq},
      {"--image", &options.zoo.image},   {"--layers", &options.zoo.layers},
      {"--width", &options.zoo.width},   {"--heads", &options.zoo.heads},
      {"--vocab", &options.zoo.vocab}};
  std::map<std::string, std::string*> strings = {{"--model", &options.zoo.model},
                                                 {"--device", &options.device},
                                                 {"--format", &options.format}};
  for (int i = 2; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--achieved") {
      options.achieved = true;
      continue;
    }
    const bool known = ints.count(flag) || strings.count(flag);
    if (!known) throw UsageError(fmt::format("unknown flag '{}'", flag));
    if (i + 1 >= argc) throw UsageError(fmt::format("{} needs a value", flag));
    const std::string value = argv[++i];
    if (ints.count(flag))
      *ints[flag] = parse_int(flag, value);
    else
      *strings[flag] = value;
  }
  if (options.device != "cpu" && options.device != "cuda")
    throw UsageError(fmt::format("--device must be cpu or cuda, got '{}'", options.device));
  if (options.format != "table" && options.format != "json")
    throw UsageError(fmt::format("--format must be table or json, got '{}'", options.format));
  if (options.achieved && options.device != "cpu")
    throw UsageError("--achieved needs --device cpu (no GPU run here)");
  return options;
}

std::string human(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) value /= 1024, ++unit;
  return unit == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.2f} {}", value, units[unit]);
}

// The op that was running when the peak was reached: the first op event at
// or after the peak's allocation.
std::string peak_op(const Trace& trace) {
  for (std::size_t e = trace.peak_event; e < trace.events.size(); ++e) {
    const auto& event = trace.events[e];
    if (event.kind != metamem::EventKind::Op) continue;
    const auto& op = trace.ops[event.index];
    const std::string& scope = trace.scopes[op.scope];
    return fmt::format("{} ({}{}{})", trace.op_name(op), metamem::phase_name(op.phase),
                       scope.empty() ? "" : ", ", scope);
  }
  return "end of step";
}

int profile(const Options& options) {
  const metamem::StepBuilder build = metamem::zoo_step(options.zoo);
  const Trace trace = metamem::trace_step(build, c10::Device(options.device));
  std::int64_t achieved = options.achieved ? metamem::achieved_cpu_peak(build) : 0;

  if (options.format == "json") {
    nlohmann::json out = {
        {"model", options.zoo.model},
        {"device", options.device},
        {"batch", options.zoo.batch},
        {"predicted",
         {{"peak_bytes", trace.peak_bytes},
          {"step_begin_bytes", trace.step_begin_bytes},
          {"saved_for_backward_bytes", trace.saved_for_backward_bytes()},
          {"peak_op", peak_op(trace)},
          {"ops", trace.ops.size()}}}};
    if (options.achieved) out["achieved"] = {{"peak_bytes", achieved}};
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  fmt::print("model {} · batch {} · fake device {} · {} ops traced\n", options.zoo.model,
             options.zoo.batch, options.device, trace.ops.size());
  fmt::print("  {:<28}{:>14}\n", "live at step start", human(trace.step_begin_bytes));
  fmt::print("  {:<28}{:>14}\n", "saved for backward", human(trace.saved_for_backward_bytes()));
  fmt::print("  {:<28}{:>14}   at {}\n", "predicted peak", human(trace.peak_bytes), peak_op(trace));
  if (options.achieved) {
    const double error = 100.0 * static_cast<double>(trace.peak_bytes - achieved) /
                         static_cast<double>(achieved);
    fmt::print("  {:<28}{:>14}   error {:+.4f}% ({:+} B)\n", "achieved peak (real CPU)",
               human(achieved), error, trace.peak_bytes - achieved);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return profile(parse(argc, argv));
  } catch (const UsageError& e) {
    std::cerr << "metamem: " << e.what() << "\n" << kUsage;
    return 2;
  } catch (const std::invalid_argument& e) {
    std::cerr << "metamem: " << e.what() << "\n";
    return 2;
  } catch (const metamem::UnsupportedOpError& e) {
    std::cerr << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "metamem: " << e.what() << "\n";
    return 1;
  }
}
