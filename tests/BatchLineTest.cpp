// BatchLine: two traces at consecutive batches give the trace at any larger
// batch, event for event, as tracing it would.
#include <gtest/gtest.h>
#include <torch/types.h>

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "estimator/BatchLine.h"
#include "estimator/Estimate.h"
#include "tests/FunctionStep.h"
#include "tests/NativeCpuKernels.h"
#include "tests/TracedCases.h"

namespace metamem {
namespace {

using testing::TracedCase;

Trace trace_at(const TracedCase& c, std::int64_t batch) {
  ZooConfig config = c.config;
  config.batch = batch;
  return trace_step(zoo_step(config), c10::Device(c.device), c.options);
}

class BatchLineOf : public ::testing::TestWithParam<TracedCase> {};

// From batches 2 and 3 to 7 and 12; from 1 and 2 (where a dimension of
// size one can change which ops copy) to 5 where the events match. On a
// fake cpu, of torch's native kernels: oneDNN's convolutions choose their
// reorders by batch (ResNet-18's make 4 blocks more at 7 and 12 than at 2
// and 3), which no line through two batches knows; a batch search then
// traces (LineTrials).
TEST_P(BatchLineOf, GivesTheTraceOfALargerBatch) {
  const TracedCase& c = GetParam();
  std::optional<testing::NativeCpuKernels> native;
  if (std::string(c.device) == "cpu") native.emplace();
  const std::optional<BatchLine> line = BatchLine::through(trace_at(c, 2), 2, trace_at(c, 3));
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(line->first_batch(), 2);
  for (std::int64_t batch : {2, 7, 12}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    const Trace traced = trace_at(c, batch);
    testing::expect_same_trace(line->at(batch), traced);
    // The measured step's live peak grows with every sample.
    EXPECT_EQ(line->largest_batch_live_within(traced.measured().peak_bytes), batch);
    EXPECT_EQ(line->largest_batch_live_within(traced.measured().peak_bytes - 1), batch - 1);
  }
  if (const auto from_one = BatchLine::through(trace_at(c, 1), 1, trace_at(c, 2)))
    testing::expect_same_trace(from_one->at(5), trace_at(c, 5));
}

INSTANTIATE_TEST_SUITE_P(Zoo, BatchLineOf, ::testing::ValuesIn(testing::search_layouts()),
                         [](const auto& info) { return info.param.name; });

// Traces that ran different ops make no line.
TEST(BatchLine, NeedsMatchingEvents) {
  TracedCase c{"gpt2", testing::small_model("gpt2", 1, 32), StepOptions{Optimizer::Adam}};
  TracedCase deeper = c;
  deeper.config.layers = 3;
  EXPECT_FALSE(BatchLine::through(trace_at(c, 2), 2, trace_at(deeper, 3)).has_value());
  const auto line = BatchLine::through(trace_at(c, 2), 2, trace_at(c, 3));
  ASSERT_TRUE(line.has_value());
  EXPECT_THROW(line->at(1), std::invalid_argument);
}

// A batch search over LineTrials traces its first two batches and reads
// the rest off their line, and finds the largest batch that fits, even past
// batches that do not (the allocator's segments are not monotone in the
// batch), as tracing every batch would. Its answer and the batch after it
// are traced to confirm it: four traces at most.
TEST(LineTrials, SearchTracesFourBatchesAndFindsTheLargestThatFits) {
  TracedCase c{"gpt2", testing::small_model("gpt2", 1, 128), StepOptions{Optimizer::Adam}};
  auto reserved = [](const Trace& trace) { return simulate_allocator(trace).reserved; };
  constexpr std::int64_t kMaxBatch = 40;
  std::vector<std::int64_t> traced(kMaxBatch + 1);
  for (std::int64_t b = 1; b <= kMaxBatch; ++b) traced[b] = reserved(trace_at(c, b));
  std::vector<std::int64_t> memories = {traced[5]};
  for (std::int64_t b = 2; b <= kMaxBatch; ++b)
    if (traced[b] < traced[b - 1]) memories.push_back(traced[b]);  // batch b fits, b - 1 does not
  ASSERT_GT(memories.size(), 1u) << "no batch here needs less than the one before it";
  for (const std::int64_t memory : memories) {
    std::int64_t largest = 0;
    for (std::int64_t b = 1; b <= kMaxBatch; ++b)
      if (traced[b] <= memory) largest = b;
    auto measure = [&](const Trace& trace) { return BatchTrial{reserved(trace) <= memory, reserved(trace)}; };
    LineTrials trials(
        [&](std::int64_t batch) -> std::optional<LineTrials::Traced> {
          Trace trace = trace_at(c, batch);
          const BatchTrial trial = measure(trace);
          if (!trial.fits) return std::nullopt;
          return LineTrials::Traced{std::move(trace), trial};
        },
        measure);
    const BatchFit found = largest_batch([&](std::int64_t batch) { return trials(batch); }, memory, kMaxBatch, {2});
    EXPECT_EQ(trials.largest_fitting(found.batch, memory, kMaxBatch), largest) << "memory " << memory;
    EXPECT_LE(trials.traces(), 4) << "memory " << memory;
  }
}

// A step whose buffers change past some batch (a larger activation saved
// from batch 13 on, as a CUDA reduction's staging buffer appears past some
// batch): the
// line through batches 2 and 3 says larger batches fit than do. The trace
// of its answer shows it, and the answer is bisected with traces: the
// largest batch that fits, as tracing every batch gives.
TEST(LineTrials, ALineThatStopsHoldingIsCaughtByItsAnswersTrace) {
  using testing::Tensors;
  auto trace_batch = [](std::int64_t batch) {
    return trace_step(testing::function_step(
                          [batch] { return Tensors{torch::randn({64, 64}).requires_grad_(), torch::randn({batch, 64})}; },
                          [batch](Tensors& t) {
                            at::Tensor y = torch::mm(t[1], t[0]);
                            return (batch > 12 ? torch::relu(y.repeat({1, 8})) : y).sum();
                          }),
                      c10::Device(c10::kCPU));
  };
  constexpr std::int64_t kMaxBatch = 40;
  std::vector<std::int64_t> peaks(kMaxBatch + 1);
  for (std::int64_t b = 1; b <= kMaxBatch; ++b) peaks[b] = trace_batch(b).measured().peak_bytes;
  const std::int64_t memory = peaks[20];
  std::int64_t largest = 0;
  for (std::int64_t b = 1; b <= kMaxBatch; ++b)
    if (peaks[b] <= memory) largest = b;
  const auto line = BatchLine::through(trace_batch(2), 2, trace_batch(3));
  ASSERT_TRUE(line.has_value());
  ASSERT_GT(line->largest_batch_live_within(memory), largest) << "the line holds: nothing to catch";

  auto measure = [&](const Trace& trace) {
    return BatchTrial{trace.measured().peak_bytes <= memory, trace.measured().peak_bytes};
  };
  LineTrials trials(
      [&](std::int64_t batch) -> std::optional<LineTrials::Traced> {
        Trace trace = trace_batch(batch);
        const BatchTrial trial = measure(trace);
        if (!trial.fits) return std::nullopt;
        return LineTrials::Traced{std::move(trace), trial};
      },
      measure);
  const BatchFit found = largest_batch([&](std::int64_t batch) { return trials(batch); }, memory, kMaxBatch, {2});
  EXPECT_EQ(trials.largest_fitting(found.batch, memory, kMaxBatch), largest);
  EXPECT_EQ(largest, 20);
  // Read off the line no more: every batch is traced.
  const int traces = trials.traces();
  EXPECT_FALSE(trials(33).fits);
  EXPECT_EQ(trials.traces(), traces + 1);
}

}  // namespace
}  // namespace metamem
