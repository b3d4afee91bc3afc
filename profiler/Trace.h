// Trace: what one training step did to memory, in order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace metamem {

enum class Phase : std::uint8_t { Setup, Forward, Backward, Optimizer };
const char* phase_name(Phase phase);

// One allocation. Views, detach and in-place results share their base's
// buffer, so a buffer is counted once however many tensors or nodes use it.
struct Buffer {
  std::int64_t bytes = 0;
  std::size_t alloc_event = 0;
  std::size_t free_event = kAlive;  // kAlive: still live when the trace ended
  std::int32_t producer_op = -1;    // op that created it; -1 if made outside an op
  Phase phase = Phase::Setup;       // phase it was allocated in
  bool saved_for_backward = false;  // made in forward, kept by autograd for backward

  static constexpr std::size_t kAlive = static_cast<std::size_t>(-1);
};

struct OpEvent {
  std::uint32_t name = 0;     // index into Trace::op_names ("aten::addmm" or "aten::add.Tensor")
  std::uint32_t scope = 0;    // index into Trace::scopes; 0 is the root ""
  Phase phase = Phase::Forward;
  std::int64_t node = -1;     // autograd node: created by (forward) or running (backward)
  std::int64_t flops = 0;
  std::uint32_t first_input = 0, n_inputs = 0;    // into Trace::op_buffers
  std::uint32_t first_output = 0, n_outputs = 0;  // into Trace::op_buffers
};

enum class EventKind : std::uint8_t { Alloc, Free, Op };

struct Event {
  EventKind kind;
  std::uint32_t index;      // into buffers (Alloc, Free) or ops (Op)
  std::int64_t live_bytes;  // after the event
};

struct Trace {
  std::vector<Event> events;
  std::vector<Buffer> buffers;
  std::vector<OpEvent> ops;
  std::vector<std::uint32_t> op_buffers;  // buffer indices of op inputs and outputs
  std::vector<std::string> op_names;
  std::vector<std::string> scopes;  // module paths, "" first
  std::map<std::int64_t, std::string> node_names;  // autograd nodes that ran backward

  std::size_t step_begin = 0;      // first event of the step
  std::int64_t step_begin_bytes = 0;  // live when the step began: parameters, buffers, inputs
  std::int64_t peak_bytes = 0;     // largest live bytes during the step
  std::size_t peak_event = 0;      // the event that reached it
  std::int64_t parameter_bytes = 0;  // the model's parameters (model states)
  std::int64_t parameter_count = 0;

  const std::string& op_name(const OpEvent& op) const { return op_names[op.name]; }
  std::vector<std::uint32_t> inputs(const OpEvent& op) const;
  std::vector<std::uint32_t> outputs(const OpEvent& op) const;
  std::int64_t saved_for_backward_bytes() const;
};

}  // namespace metamem
