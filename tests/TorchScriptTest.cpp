// Models written in Python, scripted at test time (tests/script_models.py,
// run by CTest as a fixture): parity on CPU, tracing on fake CUDA, errors.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <utility>

#include "estimator/CheckpointSim.h"
#include "examples/zoo/ScriptModel.h"
#include "tests/KnownGaps.h"

namespace metamem {
namespace {

std::string models_dir() {
  const char* dir = std::getenv("METAMEM_SCRIPT_MODELS");
  return dir == nullptr ? "" : dir;
}

struct ScriptCase {
  std::string name, input, loss;
};

void PrintTo(const ScriptCase& c, std::ostream* os) { *os << c.name; }

StepBuilder build(const ScriptCase& c, std::optional<CheckpointPolicy> checkpoint = std::nullopt) {
  ScriptConfig config;
  config.path = models_dir() + "/" + c.name + ".pt";
  config.inputs.push_back(parse_input_spec(c.input));
  config.loss = parse_loss_spec(c.loss);
  config.checkpoint = std::move(checkpoint);
  return script_step(config);
}

std::int64_t traced_peak(const StepBuilder& step) {
  return trace_step(step, c10::Device(c10::kCPU)).measured().peak_bytes;
}

class ScriptedModel : public ::testing::TestWithParam<ScriptCase> {
 protected:
  void SetUp() override { ASSERT_FALSE(models_dir().empty()) << "METAMEM_SCRIPT_MODELS is not set"; }
};

TEST_P(ScriptedModel, PredictedPeakMatchesRealCpuRun) {
  const StepBuilder step = build(GetParam());
  std::int64_t predicted = 0;
  if (!testing::traces_past_known_gaps([&] { predicted = trace_step(step, c10::Device(c10::kCPU)).measured().peak_bytes; }))
    return;
  testing::expect_cpu_parity(predicted, achieved_cpu_step_peaks(step).back());  // byte-exact
}

TEST_P(ScriptedModel, TracesOnFakeCudaWithModuleScopes) {
  Trace trace;
  if (!testing::traces_past_known_gaps([&] { trace = trace_step(build(GetParam()), c10::Device(c10::kCUDA)); }))
    return;
  bool backward = false, scoped_backward = false;
  for (const OpEvent& op : trace.ops) {
    backward = backward || op.phase == Phase::Backward;
    scoped_backward = scoped_backward || (op.phase == Phase::Backward && op.scope != 0);
  }
  EXPECT_TRUE(backward);
  EXPECT_TRUE(scoped_backward);
  EXPECT_GT(trace.scopes.size(), 3u);
}

INSTANTIATE_TEST_SUITE_P(
    Torchvision, ScriptedModel,
    ::testing::Values(ScriptCase{"resnet18", "2x3x64x64", "cross_entropy:1000"},
                      ScriptCase{"resnet18_traced", "2x3x64x64", "cross_entropy:1000"},
                      ScriptCase{"constants_traced", "2x3x8x8", "sum"},
                      ScriptCase{"bert_traced", "2x16:i64", "sum"},
                      ScriptCase{"mobilenet_v2", "2x3x64x64", "cross_entropy:1000"},
                      ScriptCase{"vgg11", "2x3x32x32", "cross_entropy:10"},
                      ScriptCase{"transformer", "4x16x64", "cross_entropy:10"},
                      ScriptCase{"lstm", "20x4x32", "sum"}),
    [](const auto& info) { return info.param.name; });

TEST(ScriptModel, ScopesFollowTheModuleHierarchy) {
  const Trace trace = trace_step(build({"resnet18", "2x3x64x64", "sum"}), c10::Device(c10::kCPU));
  for (const char* scope : {"ResNet.conv1", "ResNet.layer1.0.conv1", "ResNet.layer4.1.bn2", "ResNet.fc"})
    EXPECT_NE(std::find(trace.scopes.begin(), trace.scopes.end(), scope), trace.scopes.end()) << scope;
}

// A policy checkpoints the chain of submodules forward calls one after the
// other, through Sequentials: ResNet's stem and residual blocks (10 units),
// VGG's convolutions with their activations and poolings, MobileNet's
// inverted residuals. The real CPU run of each policy allocates what its
// trace predicts; checkpointing lowers MobileNet's peak.
TEST(ScriptModel, CheckpointedChainMatchesRealCpuRun) {
  const std::pair<ScriptCase, const char*> cases[] = {
      {{"resnet18", "4x3x64x64", "cross_entropy:1000"}, "0-9[2-7]"},
      {{"resnet18", "4x3x64x64", "cross_entropy:1000"}, "0-9[2-7]"},
      {{"resnet18", "4x3x64x64", "cross_entropy:1000"}, "2,4-5,8"},
      {{"vgg11", "2x3x32x32", "cross_entropy:10"}, "0-3,5"},
      {{"mobilenet_v2", "8x3x64x64", "cross_entropy:1000"}, "2-8,10-16[12-14]"},
  };
  for (const auto& [model, policy] : cases) {
    const StepBuilder step = build(model, parse_policy(policy));
    EXPECT_EQ(traced_peak(step), achieved_cpu_step_peaks(step).back()) << model.name << " " << policy;
  }
  const ScriptCase mobilenet{"mobilenet_v2", "8x3x64x64", "cross_entropy:1000"};
  EXPECT_LT(traced_peak(build(mobilenet, parse_policy("2-8,10-16"))), traced_peak(build(mobilenet)));
  const Trace resnet = trace_step(build({"resnet18", "2x3x64x64", "sum"}, CheckpointPolicy{}), c10::Device(c10::kCPU));
  std::int32_t units = 0;
  for (const Region& region : resnet.regions) units = std::max(units, region.last + 1);
  EXPECT_EQ(units, 10);
}

// The chain's units, traced once each checkpointed, are what the
// checkpoint solvers simulate: each simulated policy equals its re-trace.
TEST(ScriptModel, CheckpointSimulationEqualsRetraces) {
  const ScriptCase model{"mobilenet_v2", "4x3x64x64", "cross_entropy:1000"};
  const CheckpointSimulator simulator(
      [&](const CheckpointPolicy& policy) { return trace_step(build(model, policy), c10::Device(c10::kCPU)); });
  EXPECT_EQ(simulator.units(), 21);
  for (const char* policy : {"0-4", "2,5-8,12", "1-18[3-6,9]"})
    EXPECT_EQ(simulator.simulate(parse_policy(policy)).peak_bytes, traced_peak(build(model, parse_policy(policy))))
        << policy;
}

TEST(ScriptModel, PolicyOutsideTheChainIsAnInputError) {
  try {
    trace_step(build({"resnet18", "2x3x64x64", "sum"}, parse_policy("0-12")), c10::Device(c10::kCPU));
    FAIL() << "expected an error naming the chain";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("the model's chain: 0 conv1, 1 bn1+relu+maxpool, 2 layer1.0"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(trace_step(build({"unsupported_op", "16", "sum"}, parse_policy("0")), c10::Device(c10::kCPU)),
               std::invalid_argument);
}

TEST(ScriptModel, OpWithoutMetaKernelIsNamed) {
  try {
    trace_step(build({"unsupported_op", "16", "sum"}), c10::Device(c10::kCPU));
    FAIL() << "expected an error naming aten::_unique2";
  } catch (const c10::NotImplementedError& e) {
    EXPECT_NE(std::string(e.what()).find("no meta kernel for aten::_unique2"), std::string::npos);
  }
}

TEST(ScriptModel, BadFilesAndInputsAreInputErrors) {
  const std::string dir = ::testing::TempDir();
  std::ofstream(dir + "/not_script.pt") << "not a zip archive";
  {
    std::ifstream full(models_dir() + "/resnet18.pt", std::ios::binary);
    std::string head(100'000, '\0');
    full.read(head.data(), static_cast<std::streamsize>(head.size()));
    std::ofstream(dir + "/truncated.pt", std::ios::binary) << head;
  }
  for (const char* file : {"not_script.pt", "truncated.pt", "missing.pt"}) {
    ScriptConfig config{dir + "/" + file, {parse_input_spec("2x3x64x64")}, {}};
    EXPECT_THROW(script_step(config), std::invalid_argument) << file;
  }
  for (const char* input : {"2x1x64x64", "2x3x64x64:i64"})
    EXPECT_THROW(trace_step(build({"resnet18", input, "sum"}), c10::Device(c10::kCPU)),
                 std::invalid_argument)
        << input;
  EXPECT_THROW(trace_step(build({"resnet18", "2x3x64x64", "cross_entropy:10"}), c10::Device(c10::kCPU)),
               std::invalid_argument);
  EXPECT_THROW(parse_input_spec("2x3x0"), std::invalid_argument);
  EXPECT_THROW(parse_input_spec("2x3:f64"), std::invalid_argument);
  EXPECT_THROW(parse_loss_spec("hinge"), std::invalid_argument);
}

}  // namespace
}  // namespace metamem
