// Checkpointing on GPT-2 124M (batch 8, seq 1024, fake cuda): the
// simulator's speed, each solver's time and recompute overhead at budgets
// of 25/50/75% of the step's activation memory, a full memory-recompute
// curve, and rotor's dynamic program on a 48-layer GPT-2 (1.5B shape).
#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>

#include "estimator/CheckpointSolve.h"
#include "examples/zoo/Zoo.h"

namespace metamem {
namespace {

struct Model {
  std::unique_ptr<CheckpointSimulator> simulator;
  std::int64_t step_begin = 0;  // bytes live when the step starts
  std::int64_t peak = 0;        // without checkpointing
  double calibration_ms = 0;

  // Step begin plus `share` of what the step adds (its activations).
  std::int64_t budget(double share) const {
    return step_begin + static_cast<std::int64_t>(share * static_cast<double>(peak - step_begin));
  }
};

Model build(const ZooConfig& config) {
  Model model;
  const auto start = std::chrono::steady_clock::now();
  model.simulator = std::make_unique<CheckpointSimulator>([config](const CheckpointPolicy& policy) {
    ZooConfig traced = config;
    traced.checkpoint = policy;
    Trace trace = trace_step(zoo_step(traced), c10::Device(c10::kCUDA));
    return trace;
  });
  model.calibration_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const Trace trace = trace_step(zoo_step(config), c10::Device(c10::kCUDA));
  model.step_begin = trace.measured().begin_bytes;
  model.peak = trace.measured().peak_bytes;
  return model;
}

Model& gpt2_124m() {
  static Model model = [] {
    ZooConfig config;  // GPT-2 124M
    config.model = "gpt2";
    config.batch = 8;
    return build(config);
  }();
  return model;
}

Model& gpt2_48_layers() {
  static Model model = [] {
    ZooConfig config;  // GPT-2 1.5B shape
    config.model = "gpt2";
    config.batch = 1;
    config.layers = 48;
    config.width = 1600;
    config.heads = 25;
    return build(config);
  }();
  return model;
}

void BM_Calibrate(benchmark::State& state) {
  Model& model = gpt2_124m();
  for (auto _ : state) benchmark::DoNotOptimize(model.calibration_ms);
  state.counters["calibration_ms"] = model.calibration_ms;
  state.counters["units"] = model.simulator->units();
  state.counters["peak_GiB"] = static_cast<double>(model.peak) / (1 << 30);
  state.counters["lowest_GiB"] =
      static_cast<double>(lowest_checkpointed_peak(*model.simulator)) / (1 << 30);
}
BENCHMARK(BM_Calibrate)->Iterations(1)->Unit(benchmark::kMillisecond);

void BM_Simulate(benchmark::State& state) {
  Model& model = gpt2_124m();
  const CheckpointPolicy policy = parse_policy("0-3[1-2],4-7,9");
  for (auto _ : state) benchmark::DoNotOptimize(model.simulator->simulate(policy));
}
BENCHMARK(BM_Simulate)->Unit(benchmark::kMicrosecond);

// Budget as a percentage of the activation memory in state.range(0).
void solve(benchmark::State& state, const char* solver) {
  Model& model = gpt2_124m();
  const std::int64_t budget = model.budget(static_cast<double>(state.range(0)) / 100.0);
  std::optional<CheckpointPlan> plan;
  for (auto _ : state) plan = solve_checkpointing(*model.simulator, solver, budget);
  state.counters["budget_GiB"] = static_cast<double>(budget) / (1 << 30);
  state.counters["fits"] = plan ? 1 : 0;
  if (!plan) return;
  state.counters["peak_GiB"] = static_cast<double>(plan->step.peak_bytes) / (1 << 30);
  state.counters["overhead_pct"] = 100.0 * static_cast<double>(plan->step.recompute_flops) /
                                   static_cast<double>(model.simulator->step_flops());
}
BENCHMARK_CAPTURE(solve, uniform, "uniform")->Arg(25)->Arg(50)->Arg(75)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(solve, chen, "chen")->Arg(25)->Arg(50)->Arg(75)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(solve, rotor, "rotor")->Arg(25)->Arg(50)->Arg(75)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(solve, selective, "selective")->Arg(25)->Arg(50)->Arg(75)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(solve, auto, "auto")->Arg(25)->Arg(50)->Arg(75)->Unit(benchmark::kMillisecond);

// The memory-recompute curve: 12 budgets from the lowest reachable peak to
// the peak without checkpointing, each solved by `auto`.
void BM_ParetoCurve(benchmark::State& state) {
  Model& model = gpt2_124m();
  const std::int64_t lowest = lowest_checkpointed_peak(*model.simulator);
  int fitted = 0;
  for (auto _ : state) {
    fitted = 0;
    for (int i = 0; i < 12; ++i) {
      const std::int64_t budget = lowest + (model.peak - lowest) * i / 11;
      fitted += solve_checkpointing(*model.simulator, "auto", budget).has_value();
    }
  }
  state.counters["points"] = fitted;
}
BENCHMARK(BM_ParetoCurve)->Unit(benchmark::kMillisecond);

// Rotor's table over 48 layers and the tail, 500 memory slots: its cost
// alone, then a whole rotor solve (table, reading back, exact checks).
void BM_RotorTable48(benchmark::State& state) {
  Model& model = gpt2_48_layers();
  const auto& chain = model.simulator->chain();
  for (auto _ : state) benchmark::DoNotOptimize(RotorTable(chain, model.peak - model.simulator->chain_base()));
  state.counters["stages"] = static_cast<double>(chain.size());
}
BENCHMARK(BM_RotorTable48)->Unit(benchmark::kMillisecond);

void BM_Rotor48(benchmark::State& state) {
  Model& model = gpt2_48_layers();
  const std::int64_t budget = model.budget(0.5);
  std::optional<CheckpointPlan> plan;
  for (auto _ : state) plan = solve_checkpointing(*model.simulator, "rotor", budget);
  state.counters["fits"] = plan ? 1 : 0;
  if (plan)
    state.counters["overhead_pct"] = 100.0 * static_cast<double>(plan->step.recompute_flops) /
                                     static_cast<double>(model.simulator->step_flops());
}
BENCHMARK(BM_Rotor48)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace metamem

BENCHMARK_MAIN();
