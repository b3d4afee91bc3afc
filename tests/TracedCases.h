// Traced training steps shared by the tests of what a trace gives without
// tracing again (batch lines, repeated steps): configurations, and a
// comparison of two traces event for event.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "estimator/Estimate.h"
#include "tests/SmallModels.h"

namespace metamem::testing {

struct TracedCase {
  std::string name;
  ZooConfig config;
  StepOptions options;
  const char* device = "cuda";
};

inline void PrintTo(const TracedCase& c, std::ostream* os) { *os << c.name; }

// The layouts `fit --search` traces, and the zoo's other models on fake cpu
// (whose kernels' scratch the trace records too), at batch 1.
inline std::vector<TracedCase> search_layouts() {
  auto small = [](const char* model) { return small_model(model, 1, 32); };
  std::vector<TracedCase> all;
  StepOptions adam{Optimizer::Adam};
  StepOptions mixed = adam;
  mixed.fp32_master_weights = true;
  {
    TracedCase c{"gpt2", small("gpt2"), adam};
    all.push_back(c);
    c.name = "gpt2_cpu";
    c.device = "cpu";
    all.push_back(c);
  }
  {
    TracedCase c{"llama_tp_sp_selective_zero3", small("llama"), mixed};
    c.config.dtype = c10::kBFloat16;
    c.config.tensor_parallel = {2, true};
    c.config.selective_recompute = true;
    c.options.data_parallel = {4, 3};
    all.push_back(c);
  }
  for (int stage : {0, 3}) {
    TracedCase c{"llama_pp_stage" + std::to_string(stage) + "_full_recompute_zero1", small("llama"), mixed};
    c.config.dtype = c10::kBFloat16;
    c.config.layers = 8;
    c.config.pipeline = {4, stage};
    for (std::int32_t u = 0; u < 2; ++u) c.config.checkpoint.segments.push_back({u, u, {}});
    c.options.grad_accum = 4;
    c.options.data_parallel = {2, 1};
    all.push_back(c);
  }
  {
    TracedCase c{"llama_flash_ddp", small("llama"), mixed};
    c.config.dtype = c10::kBFloat16;
    c.config.flash_attention = true;
    c.options.data_parallel = {2, 0};
    all.push_back(c);
  }
  for (const char* model : {"mlp", "resnet18"}) {
    TracedCase c{std::string(model) + "_cpu", small(model), adam};
    c.config.image = 64;  // batch norm needs more than one value per channel at batch 1
    c.device = "cpu";
    all.push_back(c);
  }
  return all;
}

// Frees in a row come in any order where a container of tensors is cleared
// in hash order (autocast's cache): the trace with each run of consecutive
// frees in the order of their buffers.
inline Trace with_free_runs_sorted(Trace trace) {
  std::vector<Event>& events = trace.events;
  for (std::size_t e = 0; e < events.size();) {
    std::size_t end = e;
    while (end < events.size() && events[end].kind == EventKind::Free) ++end;
    std::sort(events.begin() + e, events.begin() + end,
              [](const Event& x, const Event& y) { return x.index < y.index; });
    for (std::size_t f = e; f < end; ++f) trace.buffers[events[f].index].free_event = f;
    e = std::max(end, e + 1);
  }
  trace.recount_live_bytes();
  return trace;
}

// The same events on the same buffers and ops, with the same bytes, flops
// and live bytes, and the same steps and allocator peaks, up to the order
// of frees in a row. Autograd node ids are left out (sequence numbers go on
// counting from trace to trace); the names of the nodes backward ops ran
// are compared.
inline void expect_same_trace(const Trace& unsorted, const Trace& unsorted_traced) {
  const Trace a = with_free_runs_sorted(unsorted), traced = with_free_runs_sorted(unsorted_traced);
  ASSERT_EQ(a.events.size(), traced.events.size());
  for (std::size_t e = 0; e < a.events.size(); ++e) {
    ASSERT_EQ(a.events[e].kind, traced.events[e].kind) << "event " << e;
    ASSERT_EQ(a.events[e].index, traced.events[e].index) << "event " << e;
    ASSERT_EQ(a.events[e].live_bytes, traced.events[e].live_bytes) << "event " << e;
  }
  ASSERT_EQ(a.buffers.size(), traced.buffers.size());
  for (std::size_t i = 0; i < a.buffers.size(); ++i) {
    const Buffer &x = a.buffers[i], &y = traced.buffers[i];
    ASSERT_EQ(x.bytes, y.bytes) << "buffer " << i;
    ASSERT_EQ(x.free_event, y.free_event) << "buffer " << i;
    ASSERT_EQ(x.producer_op, y.producer_op) << "buffer " << i;
    ASSERT_EQ(x.phase, y.phase) << "buffer " << i;
    ASSERT_EQ(x.category, y.category) << "buffer " << i;
  }
  ASSERT_EQ(a.ops.size(), traced.ops.size());
  auto node_name = [](const Trace& t, const OpEvent& op) {
    const auto named = t.node_names.find(op.node);
    return named == t.node_names.end() ? std::string() : named->second;
  };
  for (std::size_t i = 0; i < a.ops.size(); ++i) {
    const OpEvent &x = a.ops[i], &y = traced.ops[i];
    ASSERT_EQ(a.op_name(x), traced.op_name(y)) << "op " << i;
    ASSERT_EQ(a.scopes[x.scope], traced.scopes[y.scope]) << "op " << i;
    ASSERT_EQ(x.phase, y.phase) << "op " << i;
    ASSERT_EQ(x.flops, y.flops) << "op " << i;
    ASSERT_EQ(a.inputs(x), traced.inputs(y)) << "op " << i;
    ASSERT_EQ(a.outputs(x), traced.outputs(y)) << "op " << i;
    if (x.phase == Phase::Backward) ASSERT_EQ(node_name(a, x), node_name(traced, y)) << "op " << i;
  }
  ASSERT_EQ(a.regions.size(), traced.regions.size());
  for (std::size_t r = 0; r < a.regions.size(); ++r) {
    const Region &x = a.regions[r], &y = traced.regions[r];
    EXPECT_EQ(std::tie(x.kind, x.first, x.last, x.grad, x.begin, x.end, x.input, x.output),
              std::tie(y.kind, y.first, y.last, y.grad, y.begin, y.end, y.input, y.output))
        << "region " << r;
  }
  EXPECT_EQ(a.forward_begins, traced.forward_begins);
  EXPECT_EQ(a.backward_begins, traced.backward_begins);
  EXPECT_EQ(a.backward_ends, traced.backward_ends);
  ASSERT_EQ(a.steps.size(), traced.steps.size());
  for (std::size_t s = 0; s < a.steps.size(); ++s) {
    EXPECT_EQ(a.steps[s].begin, traced.steps[s].begin);
    EXPECT_EQ(a.steps[s].begin_bytes, traced.steps[s].begin_bytes);
    EXPECT_EQ(a.steps[s].peak_bytes, traced.steps[s].peak_bytes);
    EXPECT_EQ(a.steps[s].peak_event, traced.steps[s].peak_event);
  }
  const AllocatorPeaks x = simulate_allocator(a), y = simulate_allocator(traced);
  EXPECT_EQ(x.allocated, y.allocated);
  EXPECT_EQ(x.reserved, y.reserved);
}

}  // namespace metamem::testing
