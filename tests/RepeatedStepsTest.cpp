// Steps after the first repeat its trace: tracing one step and repeating
// it gives the trace of two or three, event for event, as tracing them all
// would; where the first step kept more than its optimizer states, the
// steps are all traced.
#include <gtest/gtest.h>

#include <ATen/ops/zeros.h>

#include <memory>
#include <string>
#include <vector>

#include "estimator/CachingAllocator.h"
#include "profiler/RepeatedSteps.h"
#include "tests/FunctionStep.h"
#include "tests/TracedCases.h"

namespace metamem {
namespace {

using testing::TracedCase;

Trace traced(const TracedCase& c, int steps, bool repeat) {
  StepOptions options = c.options;
  options.steps = steps;
  options.repeat_first_step = repeat;
  return trace_step(zoo_step(c.config), c10::Device(c.device), options);
}

// The search's layouts, and what else the steps keep from one to the next:
// fp32 main gradients, ZeRO-2's hand-off, FSDP's hybrid shards with
// forward prefetch, autocast, two micro-batches, a for-loop AdamW, and SGD.
std::vector<TracedCase> cases() {
  std::vector<TracedCase> all = testing::search_layouts();
  auto llama = [] {
    ZooConfig config = testing::small_model("llama", 2, 32);
    config.dtype = c10::kBFloat16;
    return config;
  };
  StepOptions mixed{Optimizer::Adam};
  mixed.fp32_master_weights = true;
  {
    TracedCase c{"llama_main_grads_ddp", llama(), mixed};
    c.options.fp32_main_grads = true;
    c.options.data_parallel = {2, 0};
    all.push_back(c);
  }
  {
    TracedCase c{"llama_zero2", llama(), mixed};
    c.options.data_parallel = {4, 2};
    all.push_back(c);
  }
  {
    TracedCase c{"llama_hybrid_fsdp_prefetch", llama(), mixed};
    c.options.data_parallel = {4, 3, -1, 2, true};
    all.push_back(c);
  }
  {
    TracedCase c{"gpt2_autocast_two_micro_batches", testing::small_model("gpt2", 2, 32), {Optimizer::AdamW}};
    c.options.autocast = c10::kBFloat16;
    c.options.grad_accum = 2;
    all.push_back(c);
  }
  {
    TracedCase c{"gpt2_for_loop_adamw", testing::small_model("gpt2", 2, 32), {Optimizer::AdamW}};
    c.options.optimizer_impl = OptimizerImpl::ForLoop;
    all.push_back(c);
  }
  all.push_back({"resnet18_sgd_cpu", testing::small_model("resnet18", 2, 32), {Optimizer::Sgd}, "cpu"});
  return all;
}

class RepeatedStepOf : public ::testing::TestWithParam<TracedCase> {};

TEST_P(RepeatedStepOf, IsTheTracedStep) {
  const TracedCase& c = GetParam();
  ASSERT_TRUE(repeat_step(traced(c, 1, false), 2).has_value()) << "the first step kept more than it makes once";
  for (int steps : {2, 3}) {
    SCOPED_TRACE(std::to_string(steps) + " steps");
    testing::expect_same_trace(traced(c, steps, true), traced(c, steps, false));
  }
}

INSTANTIATE_TEST_SUITE_P(Zoo, RepeatedStepOf, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// Gradients kept from one step to the next are accumulated into, not made,
// and SGD's momentum buffers begin as copies of the first gradients: a
// later step differs from the first, and is traced.
TEST(RepeatedStep, NotWhereLaterStepsRunOtherOps) {
  TracedCase keeps_gradients{"gpt2", testing::small_model("gpt2", 2, 32), {Optimizer::Adam}};
  keeps_gradients.options.zero_grad = ZeroGrad::Zero;
  const TracedCase momentum{"resnet18_cpu", testing::small_model("resnet18", 2, 32), {Optimizer::Momentum}, "cpu"};
  for (const TracedCase& c : {keeps_gradients, momentum}) {
    SCOPED_TRACE(c.name);
    EXPECT_FALSE(repeat_step(traced(c, 1, false), 2).has_value());
    testing::expect_same_trace(traced(c, 2, true), traced(c, 2, false));
  }
}

// An observer of the trace sees every allocation and free once, in order,
// whether the later steps were repeated or traced: here a step that keeps
// a tensor from its forward (replaced every step) is traced again.
TEST(RepeatedStep, ObserverSeesEveryStepOnce) {
  struct Recorder final : AllocationObserver {
    std::vector<std::int64_t> live;  // after each allocation, and -1 for each free
    void on_alloc(std::uint32_t, std::int64_t, std::int64_t live_bytes, int, int) override {
      live.push_back(live_bytes);
    }
    void on_free(std::uint32_t) noexcept override { live.push_back(-1); }
  };
  auto expected = [](const Trace& trace) {
    std::vector<std::int64_t> live;
    for (const Event& e : trace.events)
      if (e.kind != EventKind::Op) live.push_back(e.kind == EventKind::Alloc ? e.live_bytes : -1);
    return live;
  };
  auto kept = std::make_shared<at::Tensor>();
  const StepBuilder keeps_forward = testing::function_step(
      [] { return testing::Tensors{at::zeros({64, 64}).requires_grad_()}; },
      [kept](testing::Tensors& t) {
        *kept = t[0].mm(t[0]).detach();
        return t[0].mm(t[0]).sum();
      });
  struct Case {
    const char* name;
    StepBuilder build;
    bool repeatable;
  };
  const c10::Device cuda(c10::kCUDA);
  for (const Case& c : {Case{"gpt2", zoo_step(testing::small_model("gpt2", 2, 32)), true},
                        Case{"keeps_forward", keeps_forward, false}}) {
    SCOPED_TRACE(c.name);
    StepOptions options{Optimizer::Adam};
    options.steps = 1;
    EXPECT_EQ(repeat_step(trace_step(c.build, cuda, options), 2).has_value(), c.repeatable);
    options.steps = 2;
    options.repeat_first_step = false;
    const Trace all_traced = trace_step(c.build, cuda, options);
    options.repeat_first_step = true;
    Recorder recorder;
    testing::expect_same_trace(trace_step(c.build, cuda, options, &recorder), all_traced);
    EXPECT_EQ(recorder.live, expected(all_traced));
  }
}

}  // namespace
}  // namespace metamem
