// Activation checkpointing: the recomputed step is exact on CPU, its
// gradients are those of the step without it, and the simulator predicts
// any policy's peak as a trace under that policy measures it.
#include <gtest/gtest.h>
#include <torch/types.h>

#include <random>

#include "estimator/CheckpointSolve.h"
#include "estimator/Estimate.h"
#include "tests/SmallModels.h"

namespace metamem {
namespace {

const c10::Device kCpu(c10::kCPU), kCuda(c10::kCUDA);

// Small configs whose activations outweigh their parameters, so that
// checkpointing moves the peak.
ZooConfig activation_heavy(const std::string& model) {
  ZooConfig config = testing::small_model(model, model == "mlp" ? 64 : 4, model == "gpt2" ? 64 : 32);
  config.layers = 5;
  return config;
}

ZooConfig with_policy(ZooConfig config, const std::string& policy) {
  config.checkpoint = parse_policy(policy);
  return config;
}

std::int64_t traced_peak(const ZooConfig& config, c10::Device device, const StepOptions& options = {}) {
  return trace_step(zoo_step(config), device, options).measured().peak_bytes;
}

// Segments, nested segments and a recomputed first unit, for every model.
class CheckpointedModel : public ::testing::TestWithParam<std::string> {};

TEST_P(CheckpointedModel, CheckpointedStepMatchesRealCpuRun) {
  for (const char* policy : {"0-1,3", "0-3[1-2]", "1-3[1,3]", "0-2;keep=aten::addmm,aten::bmm",
                             "1,2;keep=aten::convolution,aten::mm"}) {
    const StepBuilder build = zoo_step(with_policy(activation_heavy(GetParam()), policy));
    EXPECT_EQ(trace_step(build, kCpu).measured().peak_bytes, achieved_cpu_step_peaks(build).back())
        << policy;
  }
}

TEST_P(CheckpointedModel, CheckpointingLowersThePeakWhenActivationsDominate) {
  if (GetParam() == "mlp") GTEST_SKIP() << "the mlp's peak is its weights' gradients";
  ZooConfig config = activation_heavy(GetParam());
  config.image = 128;  // resnets: activations well above their 44 or 98 MB of gradients
  config.batch = 16;
  const std::int32_t units = chain_units(trace_step(zoo_step(config), kCuda));
  EXPECT_LT(traced_peak(with_policy(config, to_string(every_unit_policy(units))), kCuda),
            traced_peak(config, kCuda));
}

// Random policies over the chain, nested up to three levels.
std::vector<Segment> random_segments(std::mt19937& random, std::int32_t first, std::int32_t last,
                                     int depth) {
  std::vector<Segment> segments;
  for (std::int32_t u = first; u <= last;) {
    if (random() % 3 == 0) {
      ++u;
      continue;
    }
    Segment s{u, u + static_cast<std::int32_t>(random() % static_cast<unsigned>(last - u + 1)), {}};
    if (depth < 2 && s.last > s.first && random() % 2 == 0) {
      s.inner = random_segments(random, s.first, s.last, depth + 1);
      if (s.inner.size() == 1 && s.inner[0].first == s.first && s.inner[0].last == s.last) s.inner.clear();
    }
    segments.push_back(std::move(s));
    u = segments.back().last + 1;
  }
  return segments;
}

struct SimulatorCase {
  c10::Device device;
  StepOptions options;
  const char* name;
};

void PrintTo(const SimulatorCase& c, std::ostream* os) { *os << c.name; }

class SimulatorMatchesRetrace
    : public ::testing::TestWithParam<std::tuple<std::string, SimulatorCase>> {};

TEST_P(SimulatorMatchesRetrace, ForRandomPolicies) {
  const auto& [model, c] = GetParam();
  const ZooConfig config = activation_heavy(model);
  const CheckpointSimulator simulator([&](const CheckpointPolicy& policy) {
    ZooConfig traced = config;
    traced.checkpoint = policy;
    return trace_step(zoo_step(traced), c.device, c.options);
  });
  const std::int32_t units = simulator.units();

  std::mt19937 random(7);
  std::vector<CheckpointPolicy> policies = {{}, every_unit_policy(units)};
  for (int i = 0; i < 12; ++i) policies.push_back({random_segments(random, 0, units - 1, 0)});
  for (const CheckpointPolicy& policy : policies) {
    ZooConfig retraced = config;
    retraced.checkpoint = policy;
    const Trace trace = trace_step(zoo_step(retraced), c.device, c.options);
    const SimulatedStep simulated = simulator.simulate(policy);
    const StepFlops flops = trace.measured_flops();
    EXPECT_EQ(simulated.peak_bytes, trace.measured().peak_bytes) << to_string(policy);
    EXPECT_EQ(simulated.recompute_flops, flops.recompute) << to_string(policy);
    EXPECT_EQ(simulator.step_flops(), flops.total - flops.recompute) << to_string(policy);
  }
}

StepOptions options(Optimizer optimizer, int grad_accum, ZeroGrad zero_grad) {
  StepOptions o;
  o.optimizer = optimizer;
  o.grad_accum = grad_accum;
  o.zero_grad = zero_grad;
  return o;
}

INSTANTIATE_TEST_SUITE_P(
    Zoo, SimulatorMatchesRetrace,
    ::testing::Combine(
        ::testing::ValuesIn(zoo_models()),
        ::testing::Values(
            SimulatorCase{kCuda, options(Optimizer::Adam, 1, ZeroGrad::SetToNone), "cuda_adam"},
            SimulatorCase{kCpu, options(Optimizer::None, 1, ZeroGrad::SetToNone), "cpu_no_optimizer"},
            SimulatorCase{kCpu, options(Optimizer::Momentum, 2, ZeroGrad::Zero), "cpu_two_microbatches_zero"})),
    [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param).name; });

INSTANTIATE_TEST_SUITE_P(Zoo, CheckpointedModel, ::testing::ValuesIn(zoo_models()));

// A simulator over `config`'s steps, tracing on `device`.
CheckpointSimulator simulator_of(const ZooConfig& config, c10::Device device, const StepOptions& options = {}) {
  return CheckpointSimulator([config, device, options](const CheckpointPolicy& policy) {
    ZooConfig traced = config;
    traced.checkpoint = policy;
    return trace_step(zoo_step(traced), device, options);
  });
}

// Each solver at a tight, a middle and a loose budget: its plan fits, and
// a trace under it peaks where the simulator said.
TEST_P(CheckpointedModel, EverySolversPlanIsExactWhenRetraced) {
  ZooConfig config = activation_heavy(GetParam());
  CheckpointSimulator simulator = simulator_of(config, kCuda);
  const std::int64_t lowest = lowest_checkpointed_peak(simulator);
  const std::int64_t highest = simulator.simulate({}).peak_bytes;
  for (double at : {0.0, 0.5, 0.9}) {
    const auto budget = static_cast<std::int64_t>(static_cast<double>(lowest) + at * static_cast<double>(highest - lowest));
    for (const std::string& solver : checkpoint_solvers()) {
      const std::optional<CheckpointPlan> plan = solve_checkpointing(simulator, solver, budget);
      if (!plan) continue;
      SCOPED_TRACE(solver + " at " + std::to_string(budget) + ": " + to_string(plan->policy));
      EXPECT_LE(plan->step.peak_bytes, budget);
      config.checkpoint = plan->policy;
      EXPECT_EQ(traced_peak(config, kCuda), plan->step.peak_bytes);
    }
    ASSERT_TRUE(solve_checkpointing(simulator, "auto", budget)) << "auto fits nothing at " << budget;
  }
}

// Keeping products' outputs saves recomputation; selective starts from
// rotor's plan, so it never recomputes more.
TEST_P(CheckpointedModel, SelectiveNeverRecomputesMoreThanRotor) {
  CheckpointSimulator simulator = simulator_of(activation_heavy(GetParam()), kCuda);
  const std::int64_t lowest = lowest_checkpointed_peak(simulator);
  const std::int64_t highest = simulator.simulate({}).peak_bytes;
  for (double at : {0.25, 0.5, 0.75}) {
    const auto budget = static_cast<std::int64_t>(static_cast<double>(lowest) + at * static_cast<double>(highest - lowest));
    const auto rotor = solve_checkpointing(simulator, "rotor", budget);
    const auto selective = solve_checkpointing(simulator, "selective", budget);
    ASSERT_TRUE(selective.has_value());
    if (rotor) EXPECT_LE(selective->step.recompute_flops, rotor->step.recompute_flops) << budget;
  }
}

// Recomputation with the forward's random state: the same dropout masks,
// so the same gradients, bit for bit.
TEST(Checkpoint, GradientsEqualThoseWithoutIt) {
  auto gradients = [](const ZooConfig& config) {
    torch::manual_seed(0);
    std::unique_ptr<TrainingStep> step = zoo_step(config)();
    torch::manual_seed(1);
    step->forward_loss().backward();
    std::vector<at::Tensor> grads;
    for (const at::Tensor& p : step->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  const ZooConfig gpt2 = activation_heavy("gpt2");  // dropout in every block
  const auto expected = gradients(gpt2);
  for (const char* policy : {"0-4[1-2]", "0-2,3;keep=aten::addmm,aten::bmm"}) {
    const auto actual = gradients(with_policy(gpt2, policy));
    ASSERT_EQ(actual.size(), expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) EXPECT_TRUE(actual[i].equal(expected[i])) << policy << " " << i;
  }
}

// A checkpointed unit's module row holds its recomputation and the backward
// of the nodes the recomputation made; a plain unit's has none.
TEST(Checkpoint, ModuleTableShowsRecomputationWhereItRuns) {
  ZooConfig config = with_policy(activation_heavy("gpt2"), "1");
  const Estimate est = estimate(trace_step(zoo_step(config), kCuda));
  const std::vector<NodeRow> modules = module_table(est.nodes, 3);
  auto row = [&](const std::string& name) {
    for (const NodeRow& r : modules)
      if (r.name == name) return r;
    ADD_FAILURE() << "no row " << name;
    return NodeRow{};
  };
  const NodeRow plain = row("GPT2.h.0"), checkpointed = row("GPT2.h.1");
  EXPECT_EQ(plain.recompute_flops, 0);
  EXPECT_EQ(checkpointed.recompute_flops, checkpointed.fwd_flops);
  EXPECT_EQ(checkpointed.bwd_flops, plain.bwd_flops);
  EXPECT_LT(checkpointed.fwd_tmp, plain.fwd_tmp);  // only its input stays for backward
}

// Kept products are not run again: the recomputation's FLOPs shrink by theirs.
TEST(Checkpoint, KeptOutputsAreNotRecomputed) {
  CheckpointSimulator simulator = simulator_of(activation_heavy("gpt2"), kCuda);
  CheckpointPolicy all = every_unit_policy(simulator.units()), keeping = all;
  keeping.keep = {"aten::addmm", "aten::bmm"};
  simulator.calibrate(keeping.keep);
  const std::int64_t full = simulator.simulate(all).recompute_flops;
  std::int64_t products = 0;
  for (std::int32_t u = 0; u < simulator.units(); ++u)
    products += simulator.chain()[static_cast<std::size_t>(u)].forward_flops;
  EXPECT_EQ(full, products);  // everything runs again
  EXPECT_LT(simulator.simulate(keeping).recompute_flops, full / 10);  // the products are most of it
  ZooConfig config = activation_heavy("gpt2");
  config.checkpoint = keeping;
  EXPECT_EQ(traced_peak(config, kCuda), simulator.simulate(keeping).peak_bytes);
  EXPECT_EQ(simulator.keep_candidates().front(), "aten::addmm");  // most FLOPs per byte
}

// Every policy rotor's dynamic program can express: a stage runs with
// autograd, or a segment [s, s'-1] is recomputed under its own policy.
void every_policy(std::int32_t s, std::int32_t t, std::vector<std::vector<Segment>>& out) {
  if (s == t) {
    out.push_back({});
    return;
  }
  every_policy(s + 1, t, out);
  for (std::int32_t next = s + 1; next <= t; ++next) {
    std::vector<std::vector<Segment>> inner, rest;
    every_policy(s, next - 1, inner);
    every_policy(next, t, rest);
    for (const auto& in : inner)
      for (const auto& r : rest) {
        std::vector<Segment> policy{{s, next - 1, in}};
        policy.insert(policy.end(), r.begin(), r.end());
        out.push_back(std::move(policy));
      }
  }
}

// On random chains of up to 12 stages, the program's FLOPs at every memory
// level equal the fewest any policy reaches there, and its policy does so.
TEST(Rotor, EqualsBruteForceOnSmallChains) {
  std::mt19937 random(3);
  for (int trial = 0; trial < 12; ++trial) {
    const std::size_t n = 2 + static_cast<std::size_t>(trial) % 11;
    std::vector<ChainStage> chain(n);
    for (ChainStage& c : chain) {
      c.input = 1 + random() % 6;
      c.kept = c.input + random() % 10;
      c.forward_peak = c.kept + random() % 5;
      c.no_grad_peak = 1 + random() % 8;
      c.backward_peak = random() % 10;
      c.forward_flops = 1 + random() % 20;
    }
    std::vector<std::vector<Segment>> policies;
    every_policy(0, static_cast<std::int32_t>(n) - 1, policies);
    std::vector<ModelStep> steps;
    std::int64_t most = 0;
    for (const auto& segments : policies) {
      steps.push_back(model_step(chain, {segments, {}}));
      most = std::max(most, steps.back().peak);
    }
    const RotorTable table(chain, most, static_cast<int>(most));  // one byte per slot: exact
    for (std::int64_t memory = 0; memory <= most; ++memory) {
      std::optional<std::int64_t> fewest;
      for (const ModelStep& step : steps)
        if (step.peak <= memory && (!fewest || step.flops < *fewest)) fewest = step.flops;
      ASSERT_EQ(table.flops(memory), fewest) << n << " stages, memory " << memory;
      if (!fewest) continue;
      const ModelStep chosen = model_step(chain, *table.policy(memory));
      EXPECT_LE(chosen.peak, memory);
      EXPECT_EQ(chosen.flops, *fewest);
    }
  }
}

TEST(Rotor, RefusesATableItCannotHold) {
  const std::vector<ChainStage> chain(4);
  EXPECT_THROW(RotorTable(chain, 1 << 20, 0), std::invalid_argument);
  EXPECT_THROW(RotorTable(chain, 1 << 20, 1 << 24), std::length_error);  // 16 × 2^24 entries
  EXPECT_NO_THROW(RotorTable(chain, 1 << 20, 1 << 20));
}

TEST(Checkpoint, PoliciesRoundTripAndBadOnesAreNamed) {
  EXPECT_EQ(to_string(parse_policy("0-3[1-2],5,7-11")), "0-3[1-2],5,7-11");
  EXPECT_EQ(to_string(parse_policy("none")), "none");
  EXPECT_THROW(parse_policy("0-"), std::invalid_argument);
  EXPECT_THROW(parse_policy("a"), std::invalid_argument);
  EXPECT_THROW(parse_policy("0[1"), std::invalid_argument);
  EXPECT_THROW(validate(parse_policy("3-1"), 5), std::invalid_argument);
  EXPECT_THROW(validate(parse_policy("2,1"), 5), std::invalid_argument);
  EXPECT_THROW(validate(parse_policy("4-5"), 5), std::invalid_argument);
  EXPECT_THROW(validate(parse_policy("1-2[1-2]"), 5), std::invalid_argument);
  EXPECT_NO_THROW(validate(parse_policy("0-4[0-3[1]]"), 5));
  EXPECT_EQ(to_string(parse_policy("0-3,5;keep=aten::mm,aten::bmm")), "0-3,5;keep=aten::mm,aten::bmm");
  EXPECT_THROW(validate(parse_policy("0-3;keep=aten::relu"), 5), std::invalid_argument);
  EXPECT_THROW(validate(parse_policy("0-3[1];keep=aten::mm"), 5), std::invalid_argument);
  EXPECT_THROW(parse_policy("0;keep="), std::invalid_argument);
}

}  // namespace
}  // namespace metamem
