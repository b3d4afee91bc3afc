// Pipeline parallelism as one stage runs it: the micro-batches a schedule
// keeps in flight, and the stage's step run for real on CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>

#include "tests/SmallModels.h"

namespace metamem {
namespace {

constexpr int kStages = 4;

ZooConfig stage_of(std::string model, int stage) {
  ZooConfig config = testing::small_model(std::move(model), 2, 32);
  config.layers = 2 * kStages;
  config.pipeline = {kStages, stage};
  return config;
}

StepOptions schedule(Schedule schedule, int micro_batches) {
  StepOptions options{Optimizer::Adam};
  options.schedule = schedule;
  options.grad_accum = micro_batches;
  return options;
}

// Activations live when the measured step's first backward begins.
std::int64_t in_flight_activations(const Trace& trace) {
  const auto first = std::find_if(trace.backward_begins.begin(), trace.backward_begins.end(),
                                  [&](std::size_t e) { return e >= trace.measured().begin; });
  return trace.live_by_category(*first - 1)[static_cast<std::size_t>(Category::Activation)];
}

// 1F1B runs stages − stage − 1 forwards before its first backward, so stage
// k holds min(stages − k, micro-batches) micro-batches' activations then;
// GPipe holds all of them. Each is one micro-batch's saved bytes; for each
// micro-batch in flight but the one about to run backward, the stage also
// keeps one f32 element: its loss on the last stage, elsewhere the tensor its
// sent output's data was swapped for (Megatron's deallocate_output_tensor).
TEST(Pipeline, SchedulesKeepTheirMicroBatchesInFlight) {
  const c10::Device cuda(c10::kCUDA);
  for (int stage = 0; stage < kStages; ++stage) {
    const StepBuilder build = zoo_step(stage_of("gpt2", stage));
    const std::int64_t one = trace_step(build, cuda, schedule(Schedule::OneFOneB, 1)).saved_for_backward_bytes();
    auto expected = [&](std::int64_t in_flight) { return in_flight * one + (in_flight - 1) * 4; };
    EXPECT_EQ(in_flight_activations(trace_step(build, cuda, schedule(Schedule::OneFOneB, 8))),
              expected(kStages - stage))
        << "stage " << stage;
    EXPECT_EQ(in_flight_activations(trace_step(build, cuda, schedule(Schedule::OneFOneB, 2))),
              expected(std::min(kStages - stage, 2)))
        << "stage " << stage;
    EXPECT_EQ(in_flight_activations(trace_step(build, cuda, schedule(Schedule::GPipe, 5))), expected(5))
        << "stage " << stage;
  }
}

// A stage's parameters: the first holds the embeddings, the last the final
// norm and the head (gpt2: its own copy of the tied embedding), each its blocks.
TEST(Pipeline, StagesHoldTheirLayers) {
  auto parameters = [](int stage) {
    return trace_step(zoo_step(stage_of("gpt2", stage)), c10::Device(c10::kCUDA)).parameter_count;
  };
  const std::int64_t d = 64, block = 12 * d * d + 13 * d, wte = 100 * d, wpe = 32 * d;
  EXPECT_EQ(parameters(0), wte + wpe + 2 * block);
  EXPECT_EQ(parameters(1), 2 * block);
  EXPECT_EQ(parameters(kStages - 1), wte + 2 * block + 2 * d);
}

// The stage's step for real on CPU (activations received into new buffers,
// outputs freed once sent, gradients received into new buffers) holds what
// its trace predicts, to the byte.
TEST(Pipeline, TracedStagePeakIsTheRealCpuRuns) {
  for (const char* model : {"gpt2", "llama"})
    for (int stage : {0, 1, kStages - 1})
      for (Schedule s : {Schedule::OneFOneB, Schedule::GPipe}) {
        ZooConfig config = stage_of(model, stage);
        if (stage == 1) config.tensor_parallel = {2, true};
        const StepBuilder build = zoo_step(config);
        const StepOptions options = schedule(s, 3);
        EXPECT_EQ(trace_step(build, c10::Device(c10::kCPU), options).measured().peak_bytes,
                  achieved_cpu_step_peaks(build, options).back())
            << model << " stage " << stage << " " << schedule_name(s);
      }
}

TEST(Pipeline, RefusesWhatDoesNotSplit) {
  ZooConfig odd = stage_of("gpt2", 0);
  odd.layers = 6;
  EXPECT_THROW(zoo_step(odd), std::invalid_argument);
  EXPECT_THROW(zoo_step(stage_of("gpt2", kStages)), std::invalid_argument);
  ZooConfig mlp = testing::small_model("mlp", 2, 0);
  mlp.pipeline = {2, 0};
  EXPECT_THROW(zoo_step(mlp), std::invalid_argument);
  StepOptions zero2 = schedule(Schedule::OneFOneB, 2);
  zero2.data_parallel = {2, 2};
  EXPECT_THROW(trace_step(zoo_step(stage_of("gpt2", 0)), c10::Device(c10::kCUDA), zero2), std::invalid_argument);
}

}  // namespace
}  // namespace metamem
