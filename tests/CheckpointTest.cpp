// Activation checkpointing: the recomputed step is exact on CPU, its
// gradients are those of the step without it, and the simulator predicts
// any policy's peak as a trace under that policy measures it.
#include <gtest/gtest.h>
#include <torch/types.h>

#include <random>

#include "estimator/CheckpointSim.h"
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
  for (const char* policy : {"0-1,3", "0-3[1-2]", "1-3[1,3]"}) {
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
  const Trace plain = trace_step(zoo_step(config), c.device, c.options);
  const std::int32_t units = chain_units(plain);
  const Trace every = trace_step(
      zoo_step(with_policy(config, to_string(every_unit_policy(units)))), c.device, c.options);
  const CheckpointSimulator simulator(plain, every);
  ASSERT_EQ(simulator.units(), units);

  std::mt19937 random(7);
  std::vector<CheckpointPolicy> policies = {{}, every_unit_policy(units)};
  for (int i = 0; i < 12; ++i) policies.push_back({random_segments(random, 0, units - 1, 0)});
  for (const CheckpointPolicy& policy : policies) {
    ZooConfig retraced = config;
    retraced.checkpoint = policy;
    EXPECT_EQ(simulator.simulate(policy).peak_bytes, traced_peak(retraced, c.device, c.options))
        << to_string(policy);
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
  const auto actual = gradients(with_policy(gpt2, "0-4[1-2]"));
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) EXPECT_TRUE(actual[i].equal(expected[i])) << i;
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
}

}  // namespace
}  // namespace metamem
