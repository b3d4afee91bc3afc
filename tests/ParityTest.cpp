// Predicted peak (trace on fake cpu) against achieved peak (real CPU run).
#include <gtest/gtest.h>

#include "tests/SmallModels.h"

namespace metamem {

void PrintTo(const ZooConfig& config, std::ostream* os) {
  *os << config.model << " batch " << config.batch;
}

namespace {

using testing::small_model;

class ZooParity : public ::testing::TestWithParam<ZooConfig> {};

TEST_P(ZooParity, PredictedPeakMatchesRealCpuRun) {
  const StepBuilder build = zoo_step(GetParam());
  const std::int64_t predicted = trace_step(build, c10::Device(c10::kCPU)).measured().peak_bytes;
  const std::int64_t achieved = achieved_cpu_step_peaks(build).back();
  RecordProperty("predicted", std::to_string(predicted));
  RecordProperty("achieved", std::to_string(achieved));
  EXPECT_EQ(predicted, achieved);  // byte-exact
}

INSTANTIATE_TEST_SUITE_P(
    Zoo, ZooParity,
    ::testing::Values(small_model("mlp", 8, 0), small_model("mlp", 64, 0),
                      small_model("resnet18", 2, 32), small_model("resnet18", 4, 64),
                      small_model("resnet50", 2, 32), small_model("resnet50", 2, 64),
                      small_model("gpt2", 2, 16), small_model("gpt2", 4, 32)),
    [](const auto& info) {
      return info.param.model + "_b" + std::to_string(info.param.batch) + "_s" +
             std::to_string(info.param.model == "gpt2" ? info.param.seq : info.param.image);
    });

}  // namespace
}  // namespace metamem
