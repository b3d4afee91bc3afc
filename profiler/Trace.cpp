#include "profiler/Trace.h"

#include <bit>
#include <stdexcept>
#include <string>

namespace metamem {

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::Setup: return "setup";
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::Recompute: return "recompute";
    case Phase::Optimizer: return "optimizer";
  }
  return "?";
}

const char* category_name(Category category) {
  switch (category) {
    case Category::Parameter: return "parameters";
    case Category::Input: return "inputs and buffers";
    case Category::Gradient: return "gradients";
    case Category::OptimizerState: return "optimizer states";
    case Category::Communication: return "communication buffers";
    case Category::Workspace: return "library workspaces";
    case Category::Activation: return "saved for backward";
    case Category::Temporary: return "temporaries";
  }
  return "?";
}

std::vector<std::uint32_t> Trace::inputs(const OpEvent& op) const {
  return {op_buffers.begin() + op.first_input, op_buffers.begin() + op.first_input + op.n_inputs};
}

std::vector<std::uint32_t> Trace::outputs(const OpEvent& op) const {
  return {op_buffers.begin() + op.first_output,
          op_buffers.begin() + op.first_output + op.n_outputs};
}

std::int64_t Trace::saved_for_backward_bytes() const {
  if (forward_begins.empty()) return 0;
  const std::size_t last_forward = forward_begins.back();
  std::int64_t total = 0;
  for (const Buffer& b : buffers)
    if (b.saved_for_backward() && b.alloc_event >= last_forward) total += b.bytes;
  return total;
}

CategoryBytes Trace::live_by_category(std::size_t event) const {
  CategoryBytes live{};
  for (const Buffer& b : buffers)
    if (b.alloc_event <= event && (b.free_event == Buffer::kAlive || b.free_event > event))
      live[static_cast<std::size_t>(b.category)] += b.bytes;
  return live;
}

StepFlops Trace::measured_flops() const {
  StepFlops flops;
  for (std::size_t e = measured().begin; e < events.size(); ++e)
    if (events[e].kind == EventKind::Op) {
      const OpEvent& op = ops[events[e].index];
      flops.total += op.flops;
      if (op.phase == Phase::Recompute) flops.recompute += op.flops;
    }
  return flops;
}

void check_stream(std::int64_t stream) {
  if (stream < 0 || stream >= kMaxStreams)
    throw std::invalid_argument("metamem traces streams 0 to " + std::to_string(kMaxStreams - 1) + ", got " +
                                std::to_string(stream));
}

void Trace::tell(const Event& event, AllocationObserver& observer) const {
  if (event.kind == EventKind::Alloc) {
    const Buffer& buffer = buffers[event.index];
    observer.on_alloc(event.index, buffer.bytes, event.live_bytes, buffer.stream, buffer.pool);
  } else if (event.kind == EventKind::Free) {
    for (std::uint32_t uses = buffers[event.index].used_on_streams; uses != 0; uses &= uses - 1)
      observer.on_record_stream(event.index, std::countr_zero(uses));
    observer.on_free(event.index);
  }
}

void Trace::replay(AllocationObserver& observer, const std::function<void(std::size_t)>& before) const {
  auto call = allocator_calls.begin();
  auto calls_before = [&](std::size_t e) {
    for (; call != allocator_calls.end() && call->event == e; ++call) observer.on_allocator_call(*call);
  };
  for (std::size_t e = 0; e < events.size(); ++e) {
    if (before) before(e);
    calls_before(e);
    tell(events[e], observer);
  }
  calls_before(events.size());
}

void Trace::recount_live_bytes() {
  std::int64_t live = 0;
  std::size_t opened = 0;  // steps begun so far
  auto open_steps_at = [&](std::size_t e) {
    for (; opened < steps.size() && steps[opened].begin == e; ++opened) steps[opened] = {e, live, live, e};
  };
  for (std::size_t e = 0; e < events.size(); ++e) {
    open_steps_at(e);
    Event& event = events[e];
    if (event.kind == EventKind::Alloc) live += buffers[event.index].bytes;
    if (event.kind == EventKind::Free) live -= buffers[event.index].bytes;
    event.live_bytes = live;
    if (opened == 0) continue;
    StepSpan& current = steps[opened - 1];
    if (live > current.peak_bytes) {
      current.peak_bytes = live;
      current.peak_event = e;
    }
  }
  open_steps_at(events.size());
}

}  // namespace metamem
