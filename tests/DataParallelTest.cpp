// Data parallelism as one rank sees it: DDP's buckets, ZeroRedundancyOptimizer's
// partition, and ZeRO's model states per Rajbhandari et al. 2020.
#include <gtest/gtest.h>
#include <torch/types.h>

#include <stdexcept>
#include <string>

#include "profiler/Step.h"
#include "tests/FunctionStep.h"
#include "tests/SmallModels.h"

namespace metamem {
namespace {

using testing::function_step;
using testing::Tensors;

TEST(ZeroPartition, LargestFirstToTheLeastLoadedRank) {
  // 40 -> rank 0; 30 -> 1; 20 -> 1 (30 < 40); 10 -> 0 (40 < 50); 5 -> 0 (50 = 50: the lower rank).
  EXPECT_EQ(zero_partition({10, 40, 30, 20, 5}, 2), (std::vector<int>{0, 0, 1, 1, 0}));
  EXPECT_EQ(zero_partition({7, 7, 7}, 4), (std::vector<int>{0, 1, 2}));
}

TEST(DdpBuckets, FirstBucketClosesAtOneMebibyteTheRestAtTwentyFive) {
  const auto floats = [](std::int64_t bytes) { return torch::empty({bytes / 4}); };
  const std::int64_t mib = 1 << 20;
  // 0.75 MiB stays open; 1.5 MiB closes the first; 25 MiB closes the next at once.
  EXPECT_EQ(ddp_bucket_bytes({floats(3 * mib / 4), floats(3 * mib / 4), floats(25 * mib), floats(mib)}),
            (std::vector<std::int64_t>{3 * mib / 2, 25 * mib, mib}));
  // One open bucket per dtype.
  EXPECT_EQ(ddp_bucket_bytes({floats(1024), torch::empty({1024}, torch::kBFloat16), floats(1024)}),
            (std::vector<std::int64_t>{2048, 2048}));
}

// Mixed-precision Adam over Ψ parameters in 8 equal tensors (bf16 weights,
// fp32 master weights, fp32 moments), on 4 ranks; gradients kept between
// steps (zero_grad zero), so that the model states are what is live when a
// step begins.
constexpr std::int64_t kTensors = 8, kElements = 4096, kPsi = kTensors * kElements, kRanks = 4;

CategoryBytes states_at_step_start(int zero_stage) {
  const StepBuilder build = function_step(
      [] {
        Tensors params;
        for (int i = 0; i < kTensors; ++i) params.push_back(torch::ones({kElements}, torch::kBFloat16).requires_grad_());
        return params;
      },
      [](Tensors& params) {
        at::Tensor loss = (params[0] * params[0]).sum();
        for (int i = 1; i < kTensors; ++i) loss = loss + (params[i] * params[i]).sum();
        return loss;
      });
  StepOptions options{Optimizer::Adam, /*fp32_master_weights=*/true};
  options.zero_grad = ZeroGrad::Zero;
  options.data_parallel = {kRanks, zero_stage};
  const Trace trace = trace_step(build, c10::Device(c10::kCUDA), options);
  return trace.live_by_category(trace.measured().begin - 1);
}

std::int64_t of(const CategoryBytes& bytes, Category c) { return bytes[static_cast<std::size_t>(c)]; }

class ZeroModelStates : public ::testing::TestWithParam<int> {};

// (2 + 2 + 12)·Ψ; 2Ψ + 2Ψ + 12Ψ/N; 2Ψ + (2 + 12)·Ψ/N; (2 + 2 + 12)·Ψ/N.
// DDP's buckets (stages 0 and 1) are a further 2Ψ of communication buffers,
// which the paper leaves out.
TEST_P(ZeroModelStates, AreThePapersFormulas) {
  const int stage = GetParam();
  const CategoryBytes live = states_at_step_start(stage);
  EXPECT_EQ(of(live, Category::Parameter), stage == 3 ? 2 * kPsi / kRanks : 2 * kPsi);
  EXPECT_EQ(of(live, Category::Gradient), stage >= 2 ? 2 * kPsi / kRanks : 2 * kPsi);
  EXPECT_EQ(of(live, Category::OptimizerState), stage >= 1 ? 12 * kPsi / kRanks : 12 * kPsi);
  EXPECT_EQ(of(live, Category::Communication), stage >= 2 ? 0 : 2 * kPsi);
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroModelStates, ::testing::Values(0, 1, 2, 3),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

// The rank's step run for real on CPU (a single process: collectives are
// stand-ins that move nothing, and stage 3 resizes the parameters' storages
// as FSDP does) holds what its trace predicts, to the byte: at stage 3 gpt2
// gathers per block, the MLP per layer, ResNet-18 per residual block; with
// two micro-batches too.
TEST(DataParallel, TracedRankPeakIsTheRealCpuRuns) {
  for (const char* model : {"gpt2", "mlp", "resnet18"})
    for (int stage : {0, 1, 2, 3})
      for (int micro_batches : {1, 2}) {
        const StepBuilder build = zoo_step(testing::small_model(model, 2, 32));
        StepOptions options{Optimizer::AdamW};
        options.grad_accum = micro_batches;
        options.data_parallel = {4, stage};
        EXPECT_EQ(trace_step(build, c10::Device(c10::kCPU), options).measured().peak_bytes,
                  achieved_cpu_step_peaks(build, options).back())
            << model << " stage " << stage << ", " << micro_batches << " micro-batches";
      }
}

// A six-block gpt2 of width 64 at stage 3 over 4 ranks: the bytes of a
// block's parameters, of the root's (embeddings, final norm), and of the
// rank's shards of them all.
struct StageThreeGpt2 {
  static constexpr std::int64_t d = 64, block = 4 * (12 * d * d + 13 * d), root = 4 * (100 * d + 32 * d + 2 * d);
  static constexpr std::int64_t shards = (root + 6 * block) / 4;

  static ZooConfig model() {
    ZooConfig gpt2 = testing::small_model("gpt2", 2, 32);
    gpt2.layers = 6;
    return gpt2;
  }
  static StepOptions options(bool forward_prefetch) {
    StepOptions options{Optimizer::AdamW};
    options.data_parallel = {4, 3};
    options.data_parallel.forward_prefetch = forward_prefetch;
    return options;
  }
  // The most parameter bytes live over the measured step's events [begin, end).
  static std::int64_t most_parameter_bytes(const Trace& trace, std::size_t begin, std::size_t end) {
    std::int64_t most = 0;
    for (std::size_t e = begin; e < end; ++e)
      most = std::max(most, trace.live_by_category(e)[static_cast<std::size_t>(Category::Parameter)]);
    return most;
  }
};

// At stage 3 a block's parameters are whole only around its forward and
// its backward: the step's peak holds the rank's shards of every parameter
// plus, at most, the whole parameters of the root and of two blocks (the
// one running backward and the one prefetched).
TEST(DataParallel, StageThreeGathersABlockAtATime) {
  using G = StageThreeGpt2;
  const Trace trace = trace_step(zoo_step(G::model()), c10::Device(c10::kCPU), G::options(false));
  const std::int64_t most = G::most_parameter_bytes(trace, trace.measured().begin, trace.events.size());
  EXPECT_GE(most, G::shards + G::root + G::block);
  EXPECT_LE(most, G::shards + G::root + 2 * G::block);
}

// With forward prefetch (FSDP's forward_prefetch=True) each block's forward
// holds the next block whole too; backward is as without it. The real CPU
// run, gathering the same way, holds the traced peak to the byte.
TEST(DataParallel, ForwardPrefetchHoldsTheNextBlockInForward) {
  using G = StageThreeGpt2;
  const StepBuilder build = zoo_step(G::model());
  for (const bool prefetch : {false, true}) {
    const Trace trace = trace_step(build, c10::Device(c10::kCPU), G::options(prefetch));
    EXPECT_EQ(G::most_parameter_bytes(trace, trace.forward_begins.back(), trace.backward_begins.back()),
              G::shards + G::root + (prefetch ? 2 : 1) * G::block)
        << "prefetch " << prefetch;
    EXPECT_EQ(trace.measured().peak_bytes, achieved_cpu_step_peaks(build, G::options(prefetch)).back());
  }
  StepOptions stage_two = G::options(true);
  stage_two.data_parallel.zero_stage = 2;
  EXPECT_THROW(validate(stage_two), std::invalid_argument);
}

TEST(DataParallel, RefusesWhatItDoesNotModel) {
  StepOptions options;
  options.data_parallel = {4, 4};
  EXPECT_THROW(validate(options), std::invalid_argument);
  options.data_parallel = {1, 1};
  EXPECT_THROW(validate(options), std::invalid_argument);
  options.data_parallel = {0, 0};
  EXPECT_THROW(validate(options), std::invalid_argument);
}

}  // namespace
}  // namespace metamem
