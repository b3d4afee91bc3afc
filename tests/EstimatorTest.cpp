// Per-node tables, model states, FLOPs, memonger plans and snapshots of
// traced steps: identities that must hold exactly.
#include <gtest/gtest.h>
#include <torch/types.h>

#include <algorithm>
#include <numeric>

#include "estimator/Estimate.h"
#include "estimator/Pickle.h"
#include "tests/FunctionStep.h"
#include "tests/KnownGaps.h"
#include "tests/SmallModels.h"

namespace metamem {
namespace {

const c10::Device kCpu(c10::kCPU);

class EveryZooModel : public ::testing::TestWithParam<std::string> {
 protected:
  Estimate run(const StepOptions& options = {}) {
    return estimate(trace_step(zoo_step(testing::small_model(GetParam(), 2, 32)), kCpu, options));
  }
};

TEST_P(EveryZooModel, NodesAndTimelineAgreeWithThePeak) {
  const Estimate est = run();
  const auto& rows = est.nodes.rows;
  std::int64_t node_peak = 0, saved = 0;
  for (const NodeRow& row : rows) {
    node_peak = std::max(node_peak, row.peak);
    saved += row.fwd_tmp;
    EXPECT_GE(row.peak, row.live_before) << row.name;
  }
  EXPECT_EQ(node_peak, est.trace.measured().peak_bytes);
  EXPECT_EQ(rows.at(est.nodes.peak_row).peak, est.trace.measured().peak_bytes);
  EXPECT_EQ(saved, est.trace.saved_for_backward_bytes());

  std::int64_t timeline_peak = 0;
  for (std::size_t e = est.trace.measured().begin; e < est.trace.events.size(); ++e)
    timeline_peak = std::max(timeline_peak, est.trace.events[e].live_bytes);
  EXPECT_EQ(timeline_peak, est.trace.measured().peak_bytes);

  for (int depth : {1, 2, 3}) {
    const auto modules = module_table(est.nodes, depth);
    auto total = [](const std::vector<NodeRow>& r, std::int64_t NodeRow::*field) {
      return std::accumulate(r.begin(), r.end(), std::int64_t{0},
                             [&](std::int64_t sum, const NodeRow& x) { return sum + x.*field; });
    };
    for (auto field : {&NodeRow::fwd_out, &NodeRow::fwd_tmp, &NodeRow::fwd_in, &NodeRow::bwd_out,
                       &NodeRow::fwd_flops, &NodeRow::bwd_flops})
      EXPECT_EQ(total(modules, field), total(rows, field)) << "depth " << depth;
  }
}

TEST_P(EveryZooModel, MemongerPlanIsVerifiedAndBetweenBounds) {
  const Estimate est = run();
  const memonger::Problem problem(trace_live_ranges(est.trace));
  EXPECT_EQ(memonger::verify(problem, est.plan.plan), std::vector<std::string>{});
  EXPECT_GE(est.plan.stats.planned_bytes, est.plan.stats.lower_bound_bytes);
  EXPECT_LE(est.plan.stats.lower_bound_bytes, est.trace.measured().peak_bytes);
}

TEST_P(EveryZooModel, AllocatorSimulationHoldsAtLeastTheLiveBytes) {
  const Estimate est = run();
  EXPECT_GE(est.allocator.allocated, est.trace.measured().peak_bytes);
  EXPECT_GE(est.allocator.reserved, est.allocator.allocated);
}

TEST_P(EveryZooModel, ParityHoldsWithEveryOptimizerStep) {
  const StepBuilder build = zoo_step(testing::small_model(GetParam(), 2, 32));
  std::vector<std::int64_t> predicted, achieved;  // SGD, momentum, Adam, AdamW
  for (Optimizer optimizer : {Optimizer::Sgd, Optimizer::Momentum, Optimizer::Adam, Optimizer::AdamW}) {
    const StepOptions options{optimizer, false};
    predicted.push_back(trace_step(build, kCpu, options).measured().peak_bytes);
    achieved.push_back(achieved_cpu_step_peaks(build, options).back());
  }
  testing::expect_cpu_parity(predicted, achieved);
}

INSTANTIATE_TEST_SUITE_P(Zoo, EveryZooModel, ::testing::ValuesIn(zoo_models()));

// Korthikanti et al. 2022, Table 2: the bytes of 16-bit activations a
// transformer layer saves for backward, per tensor-parallel rank. The trace
// saves that plus what the formulas leave out: each of the layer's two
// layer norms keeps its fp32 mean and rstd per token (2 · 2 · s·b · 4
// bytes), replicated under tensor parallelism, split under sequence
// parallelism, recomputed under full recompute. FlashAttention keeps none of
// the 5·a·s² terms (scores, probabilities, dropout mask) but its fp32
// log-sum-exp per head and token and its 16-byte RNG state; q, k, v and the
// output it keeps are in the 34.
class Gpt2Layer : public ::testing::Test {
 protected:
  static constexpr std::int64_t s = 1024, b = 4, h = 1024, a = 16, t = 4;
  static constexpr std::int64_t sbh = s * b * h, kNormStatistics = 2 * 2 * s * b * 4;

  struct Setup {
    TensorParallel tp;
    bool flash = false, selective = false, full_recompute = false;
  };

  static std::int64_t saved_per_layer(const Setup& setup) {
    ZooConfig gpt2;
    gpt2.model = "gpt2";
    gpt2.batch = b;
    gpt2.seq = s;
    gpt2.width = h;
    gpt2.heads = a;
    gpt2.vocab = 1024;
    gpt2.dtype = c10::kBFloat16;
    gpt2.flash_attention = setup.flash;
    gpt2.tensor_parallel = setup.tp;
    gpt2.selective_recompute = setup.selective;
    auto saved = [&](std::int64_t layers) {
      gpt2.layers = layers;
      gpt2.checkpoint = parse_policy(!setup.full_recompute ? "none" : layers == 1 ? "0" : "0,1");
      return trace_step(zoo_step(gpt2), c10::Device(c10::kCUDA)).saved_for_backward_bytes();
    };
    return saved(2) - saved(1);
  }
};

TEST_F(Gpt2Layer, NoParallelismSavesKorthikantisBytesPlusNormStatistics) {
  const std::int64_t korthikanti = sbh * (34 + 5 * a * s / h);
  EXPECT_EQ(korthikanti, 478'150'656);
  EXPECT_EQ(saved_per_layer({}), korthikanti + kNormStatistics);
}

// The layer norms' and dropouts' inputs and outputs outside the
// tensor-parallel region (10 of the 34) stay whole on every rank.
TEST_F(Gpt2Layer, TensorParallelSplitsAllButTenOfTheThirtyFour) {
  EXPECT_EQ(saved_per_layer({{t, false}}), sbh * (10 + 24 / t + 5 * a * s / (h * t)) + kNormStatistics);
}

TEST_F(Gpt2Layer, SequenceParallelSplitsEverything) {
  EXPECT_EQ(saved_per_layer({{t, true}}), sbh / t * (34 + 5 * a * s / h) + kNormStatistics / t);
}

// Selective recompute keeps q, k, v and recomputes scores, softmax and dropout.
TEST_F(Gpt2Layer, SelectiveRecomputeDropsTheAttentionScores) {
  EXPECT_EQ(saved_per_layer({{t, false}, false, true}), sbh * (10 + 24 / t) + kNormStatistics);
  EXPECT_EQ(saved_per_layer({{t, true}, false, true}), sbh / t * 34 + kNormStatistics / t);
}

// Full recompute keeps each layer's input only.
TEST_F(Gpt2Layer, FullRecomputeKeepsTheLayerInput) {
  Setup full;
  full.full_recompute = true;
  EXPECT_EQ(saved_per_layer(full), sbh * 2);
  full.tp = {t, true};
  EXPECT_EQ(saved_per_layer(full), sbh * 2 / t);
}

TEST_F(Gpt2Layer, WithFlashAttentionSavesNoScores) {
  const std::int64_t log_sum_exp = a * s * b * 4, rng_state = 16;
  Setup flash;
  flash.flash = true;
  EXPECT_EQ(saved_per_layer(flash), sbh * 34 + log_sum_exp + rng_state + kNormStatistics);
}

// Adam keeps exp_avg and exp_avg_sq: two fp32 tensors per parameter.
TEST(ModelStates, AdamOnGpt2AddsTwoFloatsPerParameter) {
  ZooConfig gpt2;  // GPT-2 124M
  gpt2.model = "gpt2";
  gpt2.batch = 1;
  gpt2.seq = 64;
  const StepBuilder build = zoo_step(gpt2);
  const StepOptions adam{Optimizer::Adam, false};
  const Trace plain = trace_step(build, c10::Device(c10::kCUDA));
  const Trace with_adam = trace_step(build, c10::Device(c10::kCUDA), adam);
  // Embeddings V·d + T·d, per layer 12·d² + 13·d, final norm 2·d (head tied).
  const std::int64_t d = 768, params = 50257 * d + 64 * d + 12 * (12 * d * d + 13 * d) + 2 * d;
  EXPECT_EQ(with_adam.parameter_count, params);
  EXPECT_EQ(with_adam.events.back().live_bytes - plain.events.back().live_bytes, 2 * 4 * params);
  const ModelStates states = model_states(with_adam);
  EXPECT_EQ(states.param_bytes, 4 * params);
  EXPECT_EQ(states.grad_bytes, 4 * params);
  EXPECT_EQ(states.optimizer_bytes, 2 * 4 * params);
}

TEST(ModelStates, MixedPrecisionKeepsFp32MasterWeights) {
  ZooConfig mlp;
  mlp.model = "mlp";
  mlp.dtype = c10::kBFloat16;
  const StepOptions adam_mixed{Optimizer::Adam, true};
  const Trace trace = trace_step(zoo_step(mlp), c10::Device(c10::kCUDA), adam_mixed);
  const std::int64_t params = 1024 * 4096 + 4096 + 4096 * 1024 + 1024;
  EXPECT_EQ(trace.parameter_count, params);
  const ModelStates states = model_states(trace);
  EXPECT_EQ(states.param_bytes, 2 * params);
  EXPECT_EQ(states.optimizer_bytes, (4 + 2 * 4) * params);
}

// FLOPs of `op` in `phase` of the measured step.
std::int64_t flops_of(const Trace& trace, const std::string& op, Phase phase) {
  std::int64_t total = 0;
  for (std::size_t e = trace.measured().begin; e < trace.events.size(); ++e) {
    if (trace.events[e].kind != EventKind::Op) continue;
    const OpEvent& event = trace.ops[trace.events[e].index];
    if (event.phase == phase && trace.op_name(event) == op) total += event.flops;
  }
  return total;
}

// Linear(1024->4096), Linear(4096->1024), batch B: 2·m·n·k per matmul. The
// input needs no gradient, so fc1's backward is one matmul, fc2's two.
TEST(Flops, MlpMatmulsMatchTheHandFormula) {
  ZooConfig mlp;
  mlp.model = "mlp";
  mlp.batch = 16;
  const Trace trace = trace_step(zoo_step(mlp), kCpu);
  const std::int64_t one = 2LL * 16 * 1024 * 4096;
  EXPECT_EQ(flops_of(trace, "aten::addmm", Phase::Forward), 2 * one);
  EXPECT_EQ(flops_of(trace, "aten::mm", Phase::Backward), 3 * one);
}

// 3x3 conv, 16 -> 32 channels on 2x16x8x8 with padding 1: each of the
// 2·32·8·8 outputs takes 16·3·3 multiply-adds; backward does it twice.
TEST(Flops, ConvolutionMatchesTheHandFormula) {
  using testing::Tensors;
  const Trace trace = trace_step(
      testing::function_step(
          [] {
            return Tensors{torch::randn({2, 16, 8, 8}).requires_grad_(),
                           torch::randn({32, 16, 3, 3}).requires_grad_()};
          },
          [](Tensors& t) { return torch::conv2d(t[0], t[1], {}, 1, 1).sum(); }),
      kCpu);
  const std::int64_t forward = 2LL * (2 * 32 * 8 * 8) * (16 * 3 * 3);
  EXPECT_EQ(forward, 1'179'648);
  EXPECT_EQ(flops_of(trace, "aten::convolution", Phase::Forward), forward);
  EXPECT_EQ(flops_of(trace, "aten::convolution_backward", Phase::Backward), 2 * forward);
}

// {"a": [1, 2**40], "b": "x"}, opcode by opcode.
TEST(Pickle, WritesProtocolTwoWithoutGlobals) {
  PickleWriter w;
  w.begin_dict();
  w.string("a");
  w.begin_list();
  w.integer(1);
  w.integer(std::int64_t{1} << 40);
  w.end_list();
  w.string("b");
  w.string("x");
  w.end_dict();
  const unsigned char expected[] = {
      0x80, 2, '}', '(', 'X', 1, 0, 0, 0, 'a', ']', '(', 'J', 1, 0, 0, 0,  // PROTO, dict, "a", list, 1
      0x8a, 8, 0, 0, 0, 0, 0, 1, 0, 0, 'e',                               // LONG1 2**40, APPENDS
      'X', 1, 0, 0, 0, 'b', 'X', 1, 0, 0, 0, 'x', 'u', '.'};              // "b": "x", SETITEMS, STOP
  EXPECT_EQ(w.finish(), std::string(std::begin(expected), std::end(expected)));
}

}  // namespace
}  // namespace metamem
