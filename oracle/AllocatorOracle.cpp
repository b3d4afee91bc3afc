// metamem-allocator-oracle: replays allocator event lists (metamem profile
// --allocator-events, Trace.save_allocator_events) through PyTorch's own CUDA
// caching allocator, run on the fake CUDA runtime, and through metamem's
// simulator, and compares every statistic of torch.cuda.memory_stats() after
// every event. Exit status: 0 when they agree everywhere, 1 where they
// differ (the first difference is printed), 2 on bad input.
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "estimator/AllocatorEvents.h"
#include "estimator/CachingAllocator.h"
#include "estimator/Gpu.h"
#include "oracle/RealCachingAllocator.h"

namespace metamem {
namespace {

constexpr const char* kUsage =
    "usage: metamem-allocator-oracle [--gpu H100-80GB|A100-80GB|...] [--alloc-conf PYTORCH_ALLOC_CONF]\n"
    "                                EVENTS.txt ...\n";

struct Options {
  std::string gpu = "H100-80GB";
  std::string alloc_conf;
  std::vector<std::string> files;
};

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--gpu")
      options.gpu = value();
    else if (arg == "--alloc-conf")
      options.alloc_conf = value();
    else if (arg.starts_with("--"))
      throw std::invalid_argument("unknown flag " + arg);
    else
      options.files.push_back(arg);
  }
  if (options.files.empty()) throw std::invalid_argument("no event list given");
  return options;
}

std::vector<AllocatorEvent> read(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot read " + path);
  return read_allocator_events(in, path);
}

// Events per second of `run` over the whole list.
template <typename Run>
double rate(std::size_t events, Run&& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  return static_cast<double>(events) / std::max(seconds.count(), 1e-9);
}

// How a comparison ended.
struct Comparison {
  bool agree = true;
  std::optional<std::size_t> out_of_memory;  // the event where both ran out of memory
};

// Compares the two after every event, up to the first difference or the
// out-of-memory error both give.
Comparison compare(const std::string& path, const std::vector<AllocatorEvent>& events, RealCachingAllocator& real,
                   CachingAllocatorSim& sim) {
  for (std::size_t e = 0; e < events.size(); ++e) {
    bool real_oom = false, sim_oom = false;
    try {
      real.apply(events[e]);
    } catch (const c10::OutOfMemoryError&) {
      real_oom = true;
    }
    try {
      apply(sim, events[e]);
    } catch (const MemoryExceeded&) {
      sim_oom = true;
    }
    const std::string where = fmt::format("{}: event {} (line {})", path, e, e + 2);
    if (real_oom != sim_oom) {
      fmt::print("{}: the real allocator {}, the simulator {}\n", where,
                 real_oom ? "ran out of memory" : "did not run out of memory", sim_oom ? "did" : "did not");
      return {false, std::nullopt};
    }
    // A pool's restore peaks as high as the order c10 lays out the
    // checkpoint's segments in, that of a hash set of host addresses: the
    // simulator's peak bounds the real one, and both peaks restart.
    if (events[e].kind == AllocatorEvent::Kind::PoolRestore) {
      const std::int64_t real_peak = real.stats().allocated_bytes[0].peak, bound = sim.peak_allocated_bytes();
      if (bound < real_peak) {
        fmt::print("{}: allocated_bytes.all.peak: {} vs {} (real vs simulated): not a bound\n", where, real_peak,
                   bound);
        return {false, std::nullopt};
      }
      AllocatorEvent reset;
      reset.kind = AllocatorEvent::Kind::ResetPeaks;
      real.apply(reset);
      sim.reset_peaks();
    }
    const std::string difference = first_difference(real.stats(), sim.stats());
    if (!difference.empty()) {
      fmt::print("{}: {} (real vs simulated)\n", where, difference);
      return {false, std::nullopt};
    }
    if (real_oom) return {true, e};
  }
  return {true, std::nullopt};
}

int run(const Options& options) {
  const GpuSpec& gpu = find_gpu(options.gpu);
  // PyTorch's parser first: what it refuses is refused as it says.
  RealCachingAllocator real(gpu, options.alloc_conf);
  const AllocatorConfig config = parse_allocator_config(options.alloc_conf);
  bool all_agree = true;
  for (const std::string& path : options.files) {
    const std::vector<AllocatorEvent> events = read(path);
    CachingAllocatorSim sim(config, gpu.total_memory);
    const Comparison comparison = compare(path, events, real, sim);
    const AllocatorStats stats = real.stats();
    real.reset();
    all_agree = all_agree && comparison.agree;
    if (!comparison.agree) continue;
    // Speed: each replays the list (up to where it ran out of memory)
    // without reading statistics.
    const std::size_t n = comparison.out_of_memory ? *comparison.out_of_memory : events.size();
    const double real_rate = rate(n, [&] {
      for (std::size_t e = 0; e < n; ++e) real.apply(events[e]);
    });
    real.reset();
    const double sim_rate = rate(n, [&] {
      CachingAllocatorSim timed(config, gpu.total_memory);
      for (std::size_t e = 0; e < n; ++e) apply(timed, events[e]);
    });
    const std::string ending =
        comparison.out_of_memory
            ? fmt::format("both out of memory at event {} (line {})", *comparison.out_of_memory, n + 2)
            : std::string("done");
    fmt::print("{}: {} events, equal after every one, {}; peaks allocated {} B, reserved {} B; "
               "{:.2f} M events/s real, {:.2f} M simulated\n",
               path, events.size(), ending, stats.allocated_bytes[0].peak, stats.reserved_bytes[0].peak,
               real_rate / 1e6, sim_rate / 1e6);
  }
  return all_agree ? 0 : 1;
}

}  // namespace
}  // namespace metamem

int main(int argc, char** argv) {
  try {
    return metamem::run(metamem::parse(argc, argv));
  } catch (const std::invalid_argument& error) {
    std::cerr << "metamem-allocator-oracle: " << error.what() << "\n" << metamem::kUsage;
    return 2;
  } catch (const c10::Error& error) {
    std::cerr << "metamem-allocator-oracle: PyTorch's allocator refused: " << error.what_without_backtrace() << "\n";
    return 2;
  }
}
