// Several training steps: what the first step leaves (optimizer states,
// kept gradients) is live in the next, gradients accumulate over
// micro-batches, and mixed-precision recipes keep their model states.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <tuple>

#include <ATen/ops/allclose.h>
#include <ATen/ops/randn.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include "estimator/CachingAllocator.h"
#include "estimator/Estimate.h"
#include "meta/CublasWorkspace.h"
#include "profiler/CpuMemoryCounter.h"
#include "profiler/ForLoopAdam.h"
#include "profiler/Tracer.h"
#include "tests/CiSubset.h"
#include "tests/KnownGaps.h"
#include "tests/SmallModels.h"

namespace metamem {

void PrintTo(Optimizer optimizer, std::ostream* os) { *os << optimizer_name(optimizer); }
void PrintTo(ZeroGrad mode, std::ostream* os) { *os << zero_grad_name(mode); }

namespace {

const c10::Device kCpu(c10::kCPU), kCuda(c10::kCUDA);

// Each traced step's peak on fake cpu, to compare with achieved_cpu_step_peaks.
std::vector<std::int64_t> traced_step_peaks(const StepBuilder& build, const StepOptions& options) {
  std::vector<std::int64_t> peaks;
  for (const StepSpan& step : trace_step(build, kCpu, options).steps) peaks.push_back(step.peak_bytes);
  return peaks;
}

using ParityCase = std::tuple<std::string, Optimizer, ZeroGrad>;

class SteadyStateParity : public ::testing::TestWithParam<ParityCase> {};

// Whether a case is in CI's pairwise cover of the sweep: 20 of its 60 cases,
// which hold every pair of model, optimizer and zero_grad mode at least once.
bool in_pairwise_cover(const ParityCase& parity) {
  const auto& [model, optimizer, zero_grad] = parity;
  const auto& models = zoo_models();
  const auto model_index = std::find(models.begin(), models.end(), model) - models.begin();
  const int optimizer_index = static_cast<int>(optimizer) - static_cast<int>(Optimizer::Sgd);
  return (model_index + optimizer_index + static_cast<int>(zero_grad)) % 3 == 0;
}

// Every step's peak, traced on fake cpu, equals the real CPU run's, over
// two and three steps and with two micro-batches per step.
TEST_P(SteadyStateParity, EveryStepMatchesRealCpuRun) {
  METAMEM_SKIP_OUTSIDE_CI_SUBSET(in_pairwise_cover(GetParam()));
  const auto& [model, optimizer, zero_grad] = GetParam();
  const StepBuilder build = zoo_step(testing::small_model(model, 2, 32));
  // Over two and three steps, then two steps of two micro-batches.
  std::vector<std::vector<std::int64_t>> predicted, achieved;
  for (auto [steps, grad_accum] : {std::pair{2, 1}, {3, 1}, {2, 2}}) {
    StepOptions options;
    options.optimizer = optimizer;
    options.zero_grad = zero_grad;
    options.steps = steps;
    options.grad_accum = grad_accum;
    predicted.push_back(traced_step_peaks(build, options));
    achieved.push_back(achieved_cpu_step_peaks(build, options));
  }
  testing::expect_cpu_parity(predicted, achieved);
}

INSTANTIATE_TEST_SUITE_P(
    Zoo, SteadyStateParity,
    ::testing::Combine(::testing::ValuesIn(zoo_models()),
                       ::testing::Values(Optimizer::Sgd, Optimizer::Momentum, Optimizer::Adam,
                                         Optimizer::AdamW),
                       ::testing::Values(ZeroGrad::SetToNone, ZeroGrad::Zero, ZeroGrad::None)),
    [](const auto& info) {
      return std::get<0>(info.param) + "_" + optimizer_name(std::get<1>(info.param)) + "_" +
             zero_grad_name(std::get<2>(info.param));
    });

// torch.optim's for-loop Adam and AdamW update as libtorch's classes do.
TEST(ForLoopAdam, UpdatesAsLibtorch) {
  for (const bool adamw : {false, true}) {
    std::vector<at::Tensor> ours, theirs;
    for (std::int64_t size : {7, 3, 11}) {
      ours.push_back(at::randn({size}).requires_grad_());
      theirs.push_back(ours.back().detach().clone().requires_grad_());
    }
    ForLoopAdam for_loop(ours, torch::optim::AdamWOptions(1e-3).weight_decay(adamw ? 1e-2 : 0.0), adamw);
    std::unique_ptr<torch::optim::Optimizer> libtorch;
    if (adamw)
      libtorch = std::make_unique<torch::optim::AdamW>(theirs, torch::optim::AdamWOptions(1e-3));
    else
      libtorch = std::make_unique<torch::optim::Adam>(theirs, torch::optim::AdamOptions(1e-3));
    for (int step = 0; step < 3; ++step) {
      for (std::size_t i = 0; i < ours.size(); ++i) {
        ours[i].mutable_grad() = at::randn(ours[i].sizes());
        theirs[i].mutable_grad() = ours[i].grad().clone();
      }
      for_loop.step();
      libtorch->step();
    }
    for (std::size_t i = 0; i < ours.size(); ++i)
      EXPECT_TRUE(at::allclose(ours[i], theirs[i], 1e-6, 1e-7)) << (adamw ? "adamw " : "adam ") << i;
  }
}

// Its loop keeps the previous parameter's denominator while it makes the
// next one's square root and quotient: once the moments exist, a step over
// 1,000, 10 and 5,000 floats peaks at the last one's two temporaries, as
// libtorch's does, and the 10 floats before them.
TEST(ForLoopAdam, KeepsThePreviousDenominatorAlive) {
  std::vector<at::Tensor> params;
  for (std::int64_t size : {1000, 10, 5000}) {
    params.push_back(at::randn({size}).requires_grad_());
    params.back().mutable_grad() = at::randn({size});
  }
  auto step_peak = [&](torch::optim::Optimizer& optimizer) {
    optimizer.step();  // makes the moments
    CpuMemoryCounter counter;
    optimizer.step();
    return counter.peak_bytes() - CpuMemoryCounter::live_bytes();
  };
  ForLoopAdam for_loop(params, torch::optim::AdamWOptions(1e-3).weight_decay(0), false);
  torch::optim::Adam libtorch(params, torch::optim::AdamOptions(1e-3));
  const std::int64_t libtorch_peak = step_peak(libtorch);
  EXPECT_GE(libtorch_peak, 4 * 2 * 5000);
  EXPECT_EQ(step_peak(for_loop) - libtorch_peak, 4 * 10);
}

// The for-loop code traced on fake cpu peaks, step by step, as it does in
// the real CPU run.
TEST(ForLoopAdam, TracedStepsMatchTheRealCpuRun) {
  for (const char* model : {"mlp", "gpt2"})
    for (const Optimizer optimizer : {Optimizer::Adam, Optimizer::AdamW}) {
      const StepBuilder build = zoo_step(testing::small_model(model, 2, 32));
      StepOptions options;
      options.optimizer = optimizer;
      options.optimizer_impl = OptimizerImpl::ForLoop;
      options.steps = 3;
      EXPECT_EQ(traced_step_peaks(build, options), achieved_cpu_step_peaks(build, options))
          << model << " " << optimizer_name(optimizer);
    }
}

// gpt2 small enough to test, with activations (batch 8, sequence 128) far
// larger than its 0.1M parameters: the first step peaks in backward.
ZooConfig activation_heavy_gpt2() { return testing::small_model("gpt2", 8, 128); }

StepOptions adam(ZeroGrad zero_grad) {
  StepOptions options;
  options.optimizer = Optimizer::Adam;
  options.zero_grad = zero_grad;
  return options;
}

// Between steps Adam keeps two fp32 moments per parameter; zero and none
// keep the gradients too, set_to_none frees them. cuBLAS's workspaces (an
// H100's), made by forward's first product and backward's, stay too.
TEST(SteadyState, WhatPersistsBetweenStepsDependsOnZeroGrad) {
  for (ZeroGrad mode : {ZeroGrad::SetToNone, ZeroGrad::Zero, ZeroGrad::None}) {
    const Trace trace = trace_step(zoo_step(activation_heavy_gpt2()), kCuda, adam(mode));
    const std::int64_t params = trace.parameter_count;
    const std::int64_t kept =
        (mode == ZeroGrad::SetToNone ? 2 * 4 * params : 3 * 4 * params) + 2 * cublas_workspace_bytes(9, 0);
    EXPECT_EQ(trace.measured().begin_bytes - trace.steps.front().begin_bytes, kept)
        << zero_grad_name(mode);
  }
}

// The first step's backward peak, again in the second step with Adam's
// states live: exactly their bytes higher. Without cuBLAS's workspaces
// (":0:1", which torch reads as none): backward's, made at the first
// step's first backward product, would move where that step's peak falls.
TEST(SteadyState, SecondStepPeakAddsAdamStates) {
  setenv("CUBLAS_WORKSPACE_CONFIG", ":0:1", 1);
  const Trace trace = trace_step(zoo_step(activation_heavy_gpt2()), kCuda, adam(ZeroGrad::SetToNone));
  unsetenv("CUBLAS_WORKSPACE_CONFIG");
  ASSERT_EQ(trace.steps.size(), 2u);
  EXPECT_EQ(trace.measured().peak_bytes - trace.steps.front().peak_bytes,
            2 * 4 * trace.parameter_count);
  const Estimate est = estimate(trace);
  EXPECT_EQ(est.nodes.peak_phase, Phase::Backward);
  EXPECT_EQ(est.live_at_peak[static_cast<std::size_t>(Category::OptimizerState)],
            2 * 4 * trace.parameter_count);
}

// A trace told to stop above some live bytes stops once past them (in the
// fake-cuda backward too, which runs on autograd's device thread) and
// otherwise records the same steps.
TEST(SteadyState, ATraceStopsAboveTheLiveBytesItIsGiven) {
  for (const c10::Device device : {kCpu, kCuda}) {
    const auto build = zoo_step(activation_heavy_gpt2());
    auto trace_within = [&](std::int64_t bytes) {
      LiveBytesLimit limit(bytes);
      return trace_step(build, device, adam(ZeroGrad::SetToNone), &limit);
    };
    const Trace whole = trace_step(build, device, adam(ZeroGrad::SetToNone));
    const std::int64_t peak = whole.measured().peak_bytes;
    const Trace within = trace_within(peak);
    EXPECT_EQ(within.events.size(), whole.events.size());
    EXPECT_EQ(within.measured().peak_bytes, peak);
    EXPECT_THROW(trace_within(peak - 1), MemoryExceeded) << device;
    EXPECT_THROW(trace_within(whole.steps.front().begin_bytes - 1), MemoryExceeded) << device;
  }
}

// The same with the CUDA allocator run alongside, on a device of given
// memory: it runs in the memory the allocator replayed over the whole trace
// reserves, and a byte less leaves it out of memory, its cache freed.
TEST(SteadyState, ATraceStopsWhereTheAllocatorRunsOutOfMemory) {
  const auto build = zoo_step(activation_heavy_gpt2());
  for (const char* conf : {"", "roundup_power2_divisions:4", "expandable_segments:True"}) {
    const AllocatorConfig config = parse_allocator_config(conf);
    const Trace whole = trace_step(build, kCuda, adam(ZeroGrad::SetToNone));
    const std::int64_t reserved = simulate_allocator(whole, {config}).reserved;
    ASSERT_GT(reserved, whole.measured().peak_bytes);
    ReservedBytesLimit enough({config, reserved});
    EXPECT_EQ(trace_step(build, kCuda, adam(ZeroGrad::SetToNone), &enough).events.size(), whole.events.size());
    EXPECT_EQ(enough.reserved_bytes(), reserved) << conf;
    ReservedBytesLimit short_by_one({config, reserved - 1});
    EXPECT_THROW(trace_step(build, kCuda, adam(ZeroGrad::SetToNone), &short_by_one), MemoryExceeded) << conf;
  }
}

// The second micro-batch starts with the first one's gradients live.
TEST(SteadyState, GradientsAccumulateOverMicroBatches) {
  StepOptions options;
  options.grad_accum = 2;
  const Trace trace = trace_step(zoo_step(activation_heavy_gpt2()), kCuda, options);
  ASSERT_EQ(trace.forward_begins.size(), 4u);
  const std::size_t second = trace.forward_begins.back();
  EXPECT_EQ(trace.events[second - 1].live_bytes - trace.measured().begin_bytes,
            trace.parameter_bytes);
}

// Model states of the recipes, per parameter Ψ: fp32 Adam 4 + 4 + 8; fp32
// master weights over bf16 parameters (ZeRO's 2 + 2 + 12, plus the fp32
// copies of the gradients the optimizer step reads); Megatron-LM's
// persistent fp32 main gradients, 2 + 4 + 12.
TEST(SteadyState, MixedPrecisionRecipesKeepTheirModelStates) {
  struct Recipe {
    c10::ScalarType dtype;
    bool masters, main_grads;
    std::int64_t param, grad, optimizer;  // bytes per parameter
  };
  for (const Recipe& r : {Recipe{c10::kFloat, false, false, 4, 4, 8},
                          Recipe{c10::kBFloat16, true, false, 2, 2 + 4, 12},
                          Recipe{c10::kBFloat16, true, true, 2, 4, 12}}) {
    ZooConfig mlp = testing::small_model("mlp", 8, 0);
    mlp.dtype = r.dtype;
    StepOptions options = adam(ZeroGrad::SetToNone);
    options.fp32_master_weights = r.masters;
    options.fp32_main_grads = r.main_grads;
    const Trace trace = trace_step(zoo_step(mlp), kCuda, options);
    const std::int64_t params = 1024 * 4096 + 4096 + 4096 * 1024 + 1024;
    ASSERT_EQ(trace.parameter_count, params);
    const ModelStates states = model_states(trace);
    SCOPED_TRACE(std::string(c10::toString(r.dtype)) + (r.main_grads ? " main grads" : ""));
    EXPECT_EQ(states.param_bytes, r.param * params);
    EXPECT_EQ(states.grad_bytes, r.grad * params);
    EXPECT_EQ(states.optimizer_bytes, r.optimizer * params);
  }
}

TEST(SteadyState, BadOptionsAreRejected) {
  const StepBuilder build = zoo_step(testing::small_model("mlp", 2, 0));
  StepOptions options;
  options.steps = 0;
  EXPECT_THROW(trace_step(build, kCpu, options), std::invalid_argument);
  options = {};
  options.grad_accum = 0;
  EXPECT_THROW(trace_step(build, kCpu, options), std::invalid_argument);
  options = {};
  options.fp32_main_grads = true;  // without master weights
  EXPECT_THROW(trace_step(build, kCpu, options), std::invalid_argument);
  EXPECT_THROW(parse_zero_grad("sometimes"), std::invalid_argument);
}

}  // namespace
}  // namespace metamem
