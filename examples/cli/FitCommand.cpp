// metamem fit: the largest batch size whose predicted peak fits in memory.
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <iostream>

#include "estimator/Estimate.h"
#include "estimator/Units.h"
#include "examples/cli/Commands.h"
#include "examples/cli/Flags.h"
#include "examples/cli/ModelFlags.h"

namespace metamem::cli {

int fit_command(const std::vector<std::string>& args) {
  ModelFlags m;
  std::string memory_text, format = "table";
  std::int64_t max_batch = 1 << 16;
  Flags flags;
  m.add_to(flags);
  flags.add("--memory", &memory_text);
  flags.add("--max-batch", &max_batch);
  flags.add("--format", &format, {"table", "json"});
  if (const auto extra = flags.parse(args); !extra.empty())
    throw UsageError("unexpected argument '" + extra[0] + "'");
  if (memory_text.empty()) throw UsageError("fit needs --memory");
  if (max_batch < 1) throw UsageError("--max-batch must be positive");
  if (m.is_script()) throw UsageError("fit varies the batch of a zoo model; a TorchScript model's batch is in its --input");
  const std::int64_t memory = parse_memory(memory_text, "--memory");
  const StepOptions options = m.step_options();
  const int divisions = m.allocator_divisions();

  // On CUDA the allocator's segments must fit; on CPU the live bytes.
  auto needed = [&](std::int64_t batch) {
    ZooConfig config = m.config();
    config.batch = batch;
    const Trace trace = trace_step(zoo_step(config), c10::Device(m.device), options);
    return m.device == "cuda" ? simulate_allocator(trace, divisions).reserved
                              : trace.measured().peak_bytes;
  };
  // Doubling, then bisection between the last batch that fits and the first that does not.
  std::int64_t fits = 0, fails = 0, fits_bytes = 0, traces = 0;
  for (std::int64_t batch = 1; batch <= max_batch; batch *= 2, ++traces) {
    const std::int64_t bytes = needed(batch);
    if (bytes > memory) {
      fails = batch;
      break;
    }
    fits = batch;
    fits_bytes = bytes;
  }
  if (fails == 0) fails = max_batch + 1;
  while (fails - fits > 1) {
    const std::int64_t batch = fits + (fails - fits) / 2;
    const std::int64_t bytes = needed(batch);
    ++traces;
    if (bytes <= memory) {
      fits = batch;
      fits_bytes = bytes;
    } else {
      fails = batch;
    }
  }

  if (format == "json") {
    std::cout << nlohmann::json{{"model", m.zoo.model},
                                {"device", m.device},
                                {"memory_bytes", memory},
                                {"batch", fits},
                                {"predicted_bytes", fits_bytes},
                                {"traces", traces}}
                     .dump(2)
              << "\n";
  } else if (fits == 0) {
    fmt::print("{} does not fit in {} even at batch 1 (fake {}).\n", m.zoo.model,
               human_bytes(memory), m.device);
  } else {
    fmt::print("largest batch that fits in {}: {} ({} predicted{}; {} traces)\n",
               human_bytes(memory), fits, human_bytes(fits_bytes),
               m.device == "cuda" ? " reserved by the CUDA allocator" : "", traces);
  }
  return 0;
}

}  // namespace metamem::cli
