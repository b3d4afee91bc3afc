// Tracing speed (gpt2 124M, batch 8, seq 1024, one and two steps with
// Adam; one rank of Llama-2-70B's shape, the trace fit --search runs most,
// and the same step read off a batch line) and tracer memory on a
// 7B-parameter gpt2-shaped config: its weights must never be allocated.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <chrono>
#include <optional>

#include "estimator/BatchLine.h"
#include "estimator/Estimate.h"
#include "examples/zoo/Zoo.h"

namespace metamem {
namespace {

const c10::Device kCuda(c10::kCUDA);

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB
}

// Wall time: fake-CUDA backward runs on the autograd engine's device thread,
// which the main thread's CPU time does not see.
void trace(benchmark::State& state, const ZooConfig& config, const StepOptions& options = {}) {
  const StepBuilder build = zoo_step(config);
  std::size_t ops = 0;
  std::int64_t peak = 0;
  double seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    const Trace trace = trace_step(build, kCuda, options);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ops = trace.ops.size();
    peak = trace.measured().peak_bytes;
  }
  const double steps = static_cast<double>(state.iterations());
  state.counters["ops"] = static_cast<double>(ops);
  state.counters["step_ms"] = 1e3 * seconds / steps;
  state.counters["us_per_op"] = 1e6 * seconds / (steps * static_cast<double>(ops));
  state.counters["ops_per_s"] = steps * static_cast<double>(ops) / seconds;
  state.counters["predicted_peak_GiB"] = static_cast<double>(peak) / (1 << 30);
  state.counters["peak_rss_MiB"] = peak_rss_mib();
}

// A transformer of the zoo with a 32,000-token vocabulary, as Llama's.
ZooConfig transformer(const char* model, std::int64_t layers, std::int64_t width, std::int64_t heads,
                      std::int64_t seq, std::int64_t batch) {
  ZooConfig config;
  config.model = model;
  config.batch = batch;
  config.seq = seq;
  config.layers = layers;
  config.width = width;
  config.heads = heads;
  config.vocab = 32000;
  return config;
}

// Runs first, so the process's peak RSS is the 7B trace's own.
void BM_Trace7B(benchmark::State& state) { trace(state, transformer("gpt2", 32, 4096, 32, 2048, 1)); }
BENCHMARK(BM_Trace7B)->Unit(benchmark::kMillisecond)->Iterations(1)->UseRealTime();

// Steps traced (1 or 2, the steady state): with Adam, the second step's
// optimizer has its states already.
void BM_TraceGpt2_124M(benchmark::State& state) {
  ZooConfig config;  // defaults: GPT-2 124M, seq 1024
  config.model = "gpt2";
  config.batch = 8;
  StepOptions options;
  options.optimizer = Optimizer::Adam;
  options.steps = static_cast<int>(state.range(0));
  trace(state, config, options);
}
BENCHMARK(BM_TraceGpt2_124M)->ArgName("steps")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

// One rank of Llama-2-70B's shape at tensor parallel 8 with sequence
// parallelism, selective recompute, data parallel 8 under ZeRO-3, bf16 with
// fp32 master weights and Adam: the trace `fit --search` runs most.
ZooConfig llama_70b_rank(std::int64_t batch) {
  ZooConfig config = transformer("llama", 80, 8192, 64, 4096, batch);
  config.dtype = c10::kBFloat16;
  config.kv_heads = 8;
  config.ffn = 28672;
  config.tensor_parallel = {8, true};
  config.selective_recompute = true;
  return config;
}

StepOptions llama_70b_rank_options(int steps) {
  StepOptions options;
  options.optimizer = Optimizer::Adam;
  options.fp32_master_weights = true;
  options.data_parallel = {8, 3};
  options.steps = steps;
  return options;
}

void BM_TraceLlama70BRank(benchmark::State& state) {
  trace(state, llama_70b_rank(2), llama_70b_rank_options(static_cast<int>(state.range(0))));
}
BENCHMARK(BM_TraceLlama70BRank)->ArgName("steps")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

// That rank's steady-state step at batch 9 read off the batch line through
// batches 2 and 3 (what a batch search pays per batch once it has the line),
// with the allocator replayed on it, against tracing it.
void BM_BatchLineLlama70BRank(benchmark::State& state) {
  const StepOptions options = llama_70b_rank_options(2);
  auto traced = [&](std::int64_t batch) { return trace_step(zoo_step(llama_70b_rank(batch)), kCuda, options); };
  const std::optional<BatchLine> line = BatchLine::through(traced(2), 2, traced(3));
  if (!line) {
    state.SkipWithError("batches 2 and 3 ran different ops");
    return;
  }
  std::int64_t reserved = 0;
  for (auto _ : state) reserved = simulate_allocator(line->at(9)).reserved;
  state.counters["reserved_GiB"] = static_cast<double>(reserved) / (1 << 30);
  state.counters["traced_reserved_GiB"] = static_cast<double>(simulate_allocator(traced(9)).reserved) / (1 << 30);
}
BENCHMARK(BM_BatchLineLlama70BRank)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace metamem

BENCHMARK_MAIN();
