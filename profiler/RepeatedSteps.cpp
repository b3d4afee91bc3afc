#include "profiler/RepeatedSteps.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace metamem {
namespace {

// The first step's buffers that a later step finds made: those it left
// alive, each an optimizer state or a parallel wrapper's communication
// buffer (kept by design, as DDP's buckets are) made by an op of its own
// from nothing the step made, or a library's workspace (made by the step's
// first call into it, whose op stays). One made from the step's results
// (SGD's momentum, a copy of the first gradient) is updated by other ops
// later.
// `repeatable` is false when a later step would differ.
struct MadeOnce {
  std::vector<bool> buffers, ops;  // by index in the trace
  bool repeatable = true;
};

MadeOnce made_once(const Trace& trace) {
  const std::size_t begin = trace.steps.front().begin;
  MadeOnce once{std::vector<bool>(trace.buffers.size()), std::vector<bool>(trace.ops.size())};
  for (std::size_t i = 0; i < trace.buffers.size(); ++i) {
    const Buffer& b = trace.buffers[i];
    const bool alive = b.free_event == Buffer::kAlive;
    const bool kept = b.category == Category::OptimizerState || b.category == Category::Communication;
    if (b.alloc_event < begin) {
      once.repeatable &= alive || b.free_event < begin;
    } else if (alive) {
      once.repeatable &= b.category == Category::Workspace || (kept && b.producer_op >= 0);
      once.buffers[i] = true;
    } else {
      once.repeatable &= !kept;  // one replaced within the step: a later step may keep the last
    }
  }
  for (std::size_t i = 0; i < trace.buffers.size() && once.repeatable; ++i) {
    if (!once.buffers[i] || trace.buffers[i].category == Category::Workspace) continue;
    const OpEvent& op = trace.ops[static_cast<std::size_t>(trace.buffers[i].producer_op)];
    for (std::uint32_t output : trace.outputs(op)) once.repeatable &= once.buffers[output];
    for (std::uint32_t input : trace.inputs(op)) once.repeatable &= trace.buffers[input].alloc_event < begin;
    once.ops[static_cast<std::size_t>(trace.buffers[i].producer_op)] = true;
  }
  for (const Region& r : trace.regions) once.repeatable &= r.begin >= begin || r.end <= begin;
  // A CUDA graph tree's checkpoints are of its own steps, not a repeatable one.
  for (const AllocatorCall& call : trace.allocator_calls) once.repeatable &= call.kind == AllocatorCall::Kind::EmptyCache;
  return once;
}

// Appends the first step of `first` again to `trace`, less what `once` made
// once; node ids move on by `node_shift`.
void append_step(const Trace& first, const MadeOnce& once, std::int64_t node_shift, Trace& trace) {
  const std::size_t begin = first.steps.front().begin, end = first.events.size();
  std::vector<std::uint32_t> buffer_at(first.buffers.size());  // the new index of the step's buffers
  std::vector<std::int32_t> op_at(first.ops.size(), -1);
  std::vector<std::size_t> event_at(end - begin + 1);  // the new index of each event, or of the next one kept
  auto renamed = [&](std::uint32_t b) {
    return first.buffers[b].alloc_event >= begin && !once.buffers[b] ? buffer_at[b] : b;
  };
  trace.steps.push_back({trace.events.size(), 0, 0, trace.events.size()});
  for (std::size_t e = begin; e < end; ++e) {
    event_at[e - begin] = trace.events.size();
    const Event& event = first.events[e];
    std::uint32_t index = event.index;
    if (event.kind == EventKind::Alloc) {
      if (once.buffers[index]) continue;
      Buffer buffer = first.buffers[index];
      buffer.alloc_event = trace.events.size();
      const auto added = static_cast<std::uint32_t>(trace.buffers.size());
      buffer_at[index] = added;
      index = added;
      trace.buffers.push_back(buffer);
    } else if (event.kind == EventKind::Free) {
      index = buffer_at[index];
      trace.buffers[index].free_event = trace.events.size();
    } else {
      if (once.ops[index]) continue;
      OpEvent op = first.ops[index];
      if (op.node >= 0) {
        op.node += node_shift;
        if (const auto named = first.node_names.find(first.ops[index].node); named != first.node_names.end())
          trace.node_names.emplace(op.node, named->second);
      }
      auto copy_buffers = [&](std::uint32_t from, std::uint32_t n) {
        const auto at = static_cast<std::uint32_t>(trace.op_buffers.size());
        for (std::uint32_t i = from; i < from + n; ++i) trace.op_buffers.push_back(renamed(first.op_buffers[i]));
        return at;
      };
      op.first_input = copy_buffers(op.first_input, op.n_inputs);
      op.first_output = copy_buffers(op.first_output, op.n_outputs);
      op_at[index] = static_cast<std::int32_t>(trace.ops.size());
      index = static_cast<std::uint32_t>(trace.ops.size());
      trace.ops.push_back(op);
    }
    trace.events.push_back({event.kind, index, 0});
  }
  event_at[end - begin] = trace.events.size();
  for (std::size_t i = 0; i < first.buffers.size(); ++i)
    if (const std::int32_t producer = first.buffers[i].producer_op;
        first.buffers[i].alloc_event >= begin && !once.buffers[i] && producer >= 0)
      trace.buffers[buffer_at[i]].producer_op = op_at[static_cast<std::size_t>(producer)];
  auto moved = [&](std::size_t e) { return event_at[e - begin]; };
  for (const Region& r : first.regions) {
    if (r.begin < begin) continue;
    Region copy = r;
    copy.begin = moved(r.begin);
    copy.end = moved(r.end);
    if (r.input >= 0) copy.input = renamed(static_cast<std::uint32_t>(r.input));
    if (r.output >= 0) copy.output = renamed(static_cast<std::uint32_t>(r.output));
    trace.regions.push_back(copy);
  }
  auto copy_marks = [&](const std::vector<std::size_t>& from, std::vector<std::size_t>& to) {
    for (std::size_t e : from)
      if (e >= begin) to.push_back(moved(e));
  };
  copy_marks(first.forward_begins, trace.forward_begins);
  copy_marks(first.backward_begins, trace.backward_begins);
  copy_marks(first.backward_ends, trace.backward_ends);
  for (AllocatorCall call : first.allocator_calls) {
    if (call.event < begin) continue;
    call.event = moved(call.event);
    trace.allocator_calls.push_back(call);
  }
}

}  // namespace

std::optional<Trace> repeat_step(const Trace& first, int steps) {
  if (first.steps.size() != 1 || steps < 1) return std::nullopt;
  const MadeOnce once = made_once(first);
  if (!once.repeatable) return std::nullopt;
  std::int64_t last_sequence = 0;
  for (const OpEvent& op : first.ops)
    if (op.node >= 0) last_sequence = std::max(last_sequence, node_sequence(op.node));
  Trace trace = first;
  for (int s = 1; s < steps; ++s) append_step(first, once, s * (last_sequence + 1), trace);
  trace.recount_live_bytes();
  return trace;
}

}  // namespace metamem
