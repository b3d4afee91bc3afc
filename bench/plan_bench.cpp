// memonger on generated instances and on MiniMalloc's challenging
// benchmark: planned / lower bound and run time per algorithm. Links
// memonger alone.
#include <benchmark/benchmark.h>

#include "memonger/Plan.h"
#include "tests/RangeGenerators.h"

namespace memonger {
namespace {

using Generator = std::vector<LiveRange> (*)(std::size_t n);

std::vector<LiveRange> random_heavy_tailed(std::size_t n) { return testing::random_ranges(n, 1); }
std::vector<LiveRange> chain(std::size_t n) { return testing::chain(n, 1); }
std::vector<LiveRange> perfect(std::size_t n) {
  return testing::perfect_packing(1 << 20, static_cast<std::int64_t>(n), n, 1);
}
std::vector<LiveRange> training(std::size_t n) { return testing::training_step(n / 3, 1); }

void report(benchmark::State& state, const Problem& problem, const Plan& result) {
  const Statistics stats = compute_statistics(problem, result);
  state.counters["ranges"] = static_cast<double>(problem.size());
  state.counters["planned_over_lb"] = stats.ratio();
  state.counters["verified"] = verify(problem, result).empty() ? 1 : 0;
}

void plan(benchmark::State& state, Generator generate, const char* algorithm) {
  const Problem problem(generate(static_cast<std::size_t>(state.range(0))));
  const auto planner = make_planner(algorithm);
  Plan result;
  for (auto _ : state) result = planner->plan(problem);
  report(state, problem, result);
}

// An instance of MiniMalloc's challenging set, decided at its capacity.
void minimalloc(benchmark::State& state, const char* name) {
  const Problem problem(testing::minimalloc_challenging(name).ranges);
  const auto planner = make_planner("exact", {60.0, testing::kMiniMallocCapacity});
  Plan result;
  for (auto _ : state) result = planner->plan(problem);
  report(state, problem, result);
  state.counters["planned_over_capacity"] =
      static_cast<double>(result.planned_bytes) / testing::kMiniMallocCapacity;
}

#define PLAN(generator, algorithm, ...)                                                    \
  BENCHMARK_CAPTURE(plan, generator##_##algorithm, &generator, #algorithm)                 \
      ->Unit(benchmark::kMillisecond)                                                      \
      ->Args({__VA_ARGS__})

PLAN(random_heavy_tailed, greedy, 10'000);
PLAN(random_heavy_tailed, bestfit, 10'000);
PLAN(random_heavy_tailed, bestfit, 100'000);
PLAN(chain, greedy, 100'000);
PLAN(chain, bestfit, 100'000);
PLAN(perfect, bestfit, 1'000);
PLAN(perfect, exact, 1'000);
PLAN(training, greedy, 30'000);
PLAN(training, bestfit, 30'000);
PLAN(training, bestfit, 100'000);
PLAN(random_heavy_tailed, dp, 14);
PLAN(random_heavy_tailed, greedy, 14);

#define MINIMALLOC(name) \
  BENCHMARK_CAPTURE(minimalloc, name, #name)->Unit(benchmark::kMillisecond)->Iterations(1)

MINIMALLOC(A);
MINIMALLOC(B);
MINIMALLOC(C);
MINIMALLOC(D);
MINIMALLOC(E);
MINIMALLOC(F);
MINIMALLOC(G);
MINIMALLOC(H);
MINIMALLOC(I);
MINIMALLOC(J);
MINIMALLOC(K);

}  // namespace
}  // namespace memonger

BENCHMARK_MAIN();
