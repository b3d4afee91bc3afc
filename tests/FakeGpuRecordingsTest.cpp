// A recording of real torch on the fake GPU as the plan a trace follows.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "estimator/FakeGpuRecordings.h"

namespace metamem {
namespace {

using Kind = ScratchPlan::Step::Kind;

// One call's answer: its allocations and frees (the allocator's addresses)
// and its returns' addresses.
const std::string kEvents =
    R"([["alloc", 256, 64], ["alloc", 512, 4096], ["free_requested", 512, 4096], ["alloc", 512, 512],)"
    R"( ["alloc", 768, 32], ["alloc", 1024, 33554432], ["free_requested", 512, 512], ["free_requested", 768, 32],)"
    R"( ["alloc", 1280, 16]])";

TEST(FakeGpuRecordings, ARecordingIsTheKernelsStepsInTheirOrder) {
  // An address freed and made again is a new piece; a block kept that no
  // return holds is the workspace of a first cuBLAS call.
  const ScratchPlan plan = recorded_plan(R"({"events": )" + kEvents +
                                         R"(, "returns": [1280, 0, 256], "sizes": [[4], [], [16]],)"
                                         R"( "strides": [[1], [], [1]]})");
  const std::vector<std::pair<Kind, std::int64_t>> expected{
      {Kind::Output, 2}, {Kind::Make, 4096}, {Kind::Free, 0}, {Kind::Make, 512}, {Kind::Make, 32},
      {Kind::CublasCall, 0}, {Kind::Free, 1}, {Kind::Free, 2}, {Kind::Output, 0}};
  ASSERT_EQ(plan.steps.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const auto& step = plan.steps[i];
    EXPECT_EQ(step.kind, expected[i].first) << "step " << i;
    EXPECT_EQ(step.kind == Kind::Make ? step.bytes : static_cast<std::int64_t>(step.index), expected[i].second)
        << "step " << i;
  }
  EXPECT_TRUE(plan.recorded);
  EXPECT_EQ(plan.return_sizes, (std::vector<std::vector<std::int64_t>>{{4}, {}, {16}}));
  EXPECT_EQ(plan.return_strides, (std::vector<std::vector<std::int64_t>>{{1}, {}, {1}}));
}

TEST(FakeGpuRecordings, TheCacheIsEmptiedWhereTheCallEmptiedIt) {
  // cuDNN's benchmark: its search's workspace, the cache emptied, then the
  // engine found run with its own.
  const ScratchPlan plan = recorded_plan(
      R"({"events": [["alloc", 256, 64], ["alloc", 4096, 165871616], ["free_requested", 4096, 165871616],)"
      R"( ["empty_cache", 0, 0], ["alloc", 8192, 18464527], ["free_requested", 8192, 18464527]],)"
      R"( "returns": [256], "sizes": [[16]], "strides": [[1]]})");
  const std::vector<Kind> expected{Kind::Output, Kind::Make, Kind::Free, Kind::EmptyCache, Kind::Make, Kind::Free};
  ASSERT_EQ(plan.steps.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(plan.steps[i].kind, expected[i]) << "step " << i;
  EXPECT_EQ(plan.steps[4].bytes, 18464527);
  EXPECT_EQ(plan.steps[5].index, 1u);  // the second piece made
}

TEST(FakeGpuRecordings, AListOfReturnsIsMadeWhereItsFirstBufferIs) {
  // cuDNN's RNN weight gradients: one return, a list of buffers.
  const ScratchPlan plan = recorded_plan(
      R"({"events": [["alloc", 256, 64], ["alloc", 512, 64]], "returns": [[256, 512]], "sizes": [[]],)"
      R"( "strides": [[]]})");
  ASSERT_EQ(plan.steps.size(), 1u);
  EXPECT_EQ(plan.steps[0].kind, Kind::Output);
}

TEST(FakeGpuRecordings, WhatATraceCannotFollowIsRefused) {
  // A second block kept that no return holds, beside cuBLAS's workspace.
  EXPECT_THROW(
      {
        try {
          recorded_plan(R"({"events": [["alloc", 256, 64], ["alloc", 512, 64]], "returns": [0], "sizes": [[]],)"
                        R"( "strides": [[]]})");
        } catch (const std::runtime_error& e) {
          EXPECT_NE(std::string(e.what()).find("more than a cuBLAS workspace"), std::string::npos);
          throw;
        }
      },
      std::runtime_error);
  // A free of a block the call did not make.
  EXPECT_THROW(recorded_plan(R"({"events": [["free_requested", 256, 64]], "returns": [], "sizes": [], "strides": []})"),
               std::runtime_error);
  // Real torch's own error, raised where the traced code calls the op.
  try {
    recorded_plan(R"({"error": "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED"})");
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED");
  }
}

TEST(FakeGpuRecordings, AFolderWithoutTheFakeGpuIsAClearError) {
  try {
    FakeGpuRecordings({"/nonexistent", "python3", "server.py"}, find_gpu("T4"));
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("holds no fake GPU"), std::string::npos);
  }
}

TEST(FakeGpuRecordings, TheChildsEnvironmentPreloadsTheFakeGpu) {
  const std::vector<std::string> env = fake_gpu_environment("/oracle");
  EXPECT_NE(std::find(env.begin(), env.end(),
                      "LD_PRELOAD=/oracle/libmetamem_fake_cuda_preload.so /oracle/libmetamem_fake_cublas.so"),
            env.end());
  EXPECT_NE(std::find_if(env.begin(), env.end(),
                         [](const std::string& v) { return v.starts_with("LD_LIBRARY_PATH=/oracle/driver"); }),
            env.end());
}

}  // namespace
}  // namespace metamem
