// BatchLine: two traces at consecutive batches give the trace at any larger
// batch, event for event, as tracing it would.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "estimator/BatchLine.h"
#include "estimator/Estimate.h"
#include "tests/SmallModels.h"

namespace metamem {
namespace {

struct Case {
  std::string name;
  ZooConfig config;
  StepOptions options;
  const char* device = "cuda";
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

ZooConfig small(const char* model) { return testing::small_model(model, 1, 32); }

// The layouts `fit --search` traces, and the zoo's other models on fake cpu
// (whose kernels' scratch the trace records too).
std::vector<Case> cases() {
  std::vector<Case> all;
  StepOptions adam{Optimizer::Adam};
  StepOptions mixed = adam;
  mixed.fp32_master_weights = true;
  {
    Case c{"gpt2", small("gpt2"), adam};
    all.push_back(c);
    c.name = "gpt2_cpu";
    c.device = "cpu";
    all.push_back(c);
  }
  {
    Case c{"llama_tp_sp_selective_zero3", small("llama"), mixed};
    c.config.dtype = c10::kBFloat16;
    c.config.tensor_parallel = {2, true};
    c.config.selective_recompute = true;
    c.options.data_parallel = {4, 3};
    all.push_back(c);
  }
  for (int stage : {0, 3}) {
    Case c{"llama_pp_stage" + std::to_string(stage) + "_full_recompute_zero1", small("llama"), mixed};
    c.config.dtype = c10::kBFloat16;
    c.config.layers = 8;
    c.config.pipeline = {4, stage};
    for (std::int32_t u = 0; u < 2; ++u) c.config.checkpoint.segments.push_back({u, u, {}});
    c.options.grad_accum = 4;
    c.options.data_parallel = {2, 1};
    all.push_back(c);
  }
  {
    Case c{"llama_flash_ddp", small("llama"), mixed};
    c.config.dtype = c10::kBFloat16;
    c.config.flash_attention = true;
    c.options.data_parallel = {2, 0};
    all.push_back(c);
  }
  for (const char* model : {"mlp", "resnet18"}) {
    Case c{std::string(model) + "_cpu", small(model), adam};
    c.config.image = 64;  // batch norm needs more than one value per channel at batch 1
    c.device = "cpu";
    all.push_back(c);
  }
  return all;
}

Trace trace_at(const Case& c, std::int64_t batch) {
  ZooConfig config = c.config;
  config.batch = batch;
  return trace_step(zoo_step(config), c10::Device(c.device), c.options);
}

void expect_same_trace(const Trace& line, const Trace& traced) {
  ASSERT_EQ(line.events.size(), traced.events.size());
  for (std::size_t e = 0; e < line.events.size(); ++e)
    ASSERT_EQ(line.events[e].live_bytes, traced.events[e].live_bytes) << "event " << e;
  ASSERT_EQ(line.buffers.size(), traced.buffers.size());
  for (std::size_t i = 0; i < line.buffers.size(); ++i)
    ASSERT_EQ(line.buffers[i].bytes, traced.buffers[i].bytes) << "buffer " << i;
  ASSERT_EQ(line.ops.size(), traced.ops.size());
  for (std::size_t i = 0; i < line.ops.size(); ++i) ASSERT_EQ(line.ops[i].flops, traced.ops[i].flops) << "op " << i;
  ASSERT_EQ(line.steps.size(), traced.steps.size());
  for (std::size_t s = 0; s < line.steps.size(); ++s) {
    EXPECT_EQ(line.steps[s].begin_bytes, traced.steps[s].begin_bytes);
    EXPECT_EQ(line.steps[s].peak_bytes, traced.steps[s].peak_bytes);
    EXPECT_EQ(line.steps[s].peak_event, traced.steps[s].peak_event);
  }
  const AllocatorPeaks a = simulate_allocator(line), b = simulate_allocator(traced);
  EXPECT_EQ(a.allocated, b.allocated);
  EXPECT_EQ(a.reserved, b.reserved);
}

class BatchLineOf : public ::testing::TestWithParam<Case> {};

// From batches 2 and 3 to 7 and 12; from 1 and 2 (where a dimension of
// size one can change which ops copy) to 5 where the events match.
TEST_P(BatchLineOf, GivesTheTraceOfALargerBatch) {
  const Case& c = GetParam();
  const std::optional<BatchLine> line = BatchLine::through(trace_at(c, 2), 2, trace_at(c, 3));
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(line->first_batch(), 2);
  for (std::int64_t batch : {2, 7, 12}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    const Trace traced = trace_at(c, batch);
    expect_same_trace(line->at(batch), traced);
    // The measured step's live peak grows with every sample.
    EXPECT_EQ(line->largest_batch_live_within(traced.measured().peak_bytes), batch);
    EXPECT_EQ(line->largest_batch_live_within(traced.measured().peak_bytes - 1), batch - 1);
  }
  if (const auto from_one = BatchLine::through(trace_at(c, 1), 1, trace_at(c, 2)))
    expect_same_trace(from_one->at(5), trace_at(c, 5));
}

INSTANTIATE_TEST_SUITE_P(Zoo, BatchLineOf, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// Traces that ran different ops make no line.
TEST(BatchLine, NeedsMatchingEvents) {
  Case c{"gpt2", small("gpt2"), StepOptions{Optimizer::Adam}};
  Case deeper = c;
  deeper.config.layers = 3;
  EXPECT_FALSE(BatchLine::through(trace_at(c, 2), 2, trace_at(deeper, 3)).has_value());
  const auto line = BatchLine::through(trace_at(c, 2), 2, trace_at(c, 3));
  ASSERT_TRUE(line.has_value());
  EXPECT_THROW(line->at(1), std::invalid_argument);
}

// A batch search over LineTrials traces its first two batches and reads
// the rest off their line, and finds the largest batch that fits, even past
// batches that do not (the allocator's segments are not monotone in the
// batch), as tracing every batch would.
TEST(LineTrials, SearchTracesTwoBatchesAndFindsTheLargestThatFits) {
  Case c{"gpt2", small("gpt2"), StepOptions{Optimizer::Adam}};
  c.config.seq = 128;
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
    EXPECT_EQ(trials.traces(), 2) << "memory " << memory;
  }
}

}  // namespace
}  // namespace metamem
