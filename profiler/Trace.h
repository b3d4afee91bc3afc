// Trace: what consecutive training steps did to memory, in order.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "profiler/AllocationObserver.h"

namespace metamem {

// The CUDA streams a trace can name (torch's stream pool has 32 per priority).
inline constexpr int kMaxStreams = 32;
// Throws std::invalid_argument for a stream number a trace cannot name.
void check_stream(std::int64_t stream);

// Recompute: a checkpointed segment's forward run again during backward.
enum class Phase : std::uint8_t { Setup, Forward, Backward, Recompute, Optimizer };
const char* phase_name(Phase phase);

// An autograd node's identity: sequence numbers count per thread, and a
// recomputation runs on the thread backward runs on.
constexpr std::uint64_t kNodeSequenceMask = (std::uint64_t{1} << 40) - 1;
inline std::int64_t node_id(std::uint64_t thread, std::uint64_t sequence_nr) {
  return static_cast<std::int64_t>((thread << 40) | (sequence_nr & kNodeSequenceMask));
}
// The sequence number of a node id (not -1).
inline std::int64_t node_sequence(std::int64_t node) {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(node) & kNodeSequenceMask);
}

// What a buffer holds, for the memory picture (ZeRO's model states, then
// activations and temporaries).
enum class Category : std::uint8_t {
  Parameter,       // the model's parameters
  Input,           // other tensors made at setup: inputs, targets, module buffers
  Gradient,        // parameter gradients, fp32 master and main gradients
  OptimizerState,  // momentum, Adam moments, fp32 master weights
  Communication,   // buffers of collectives kept by the data-parallel wrapper (DDP's gradient buckets)
  Workspace,       // what a library makes at its first call and keeps (cuBLAS's workspace on CUDA)
  Activation,      // made in forward and kept by autograd for backward
  Temporary,       // everything else: freed within the step
};
constexpr std::size_t kCategories = 8;
const char* category_name(Category category);
using CategoryBytes = std::array<std::int64_t, kCategories>;

// One allocation. Views, detach and in-place results share their base's
// buffer, so a buffer is counted once however many tensors or nodes use it.
struct Buffer {
  std::int64_t bytes = 0;
  std::size_t alloc_event = 0;
  std::size_t free_event = kAlive;  // kAlive: still live when the trace ended
  std::int32_t producer_op = -1;    // op that created it; -1 if made outside an op
  Phase phase = Phase::Setup;       // phase it was allocated in
  Category category = Category::Temporary;
  // CUDA streams, numbered from 0 (the default) to kMaxStreams - 1: the one
  // it was allocated on, and the others it was used on (record_stream), a
  // bit each, whose work its free waits for.
  std::uint8_t stream = 0;
  std::uint32_t used_on_streams = 0;
  // The caching allocator's pool that served it: 0, the device's own; else
  // the private pool of a CUDA graph whose capture made it.
  std::uint16_t pool = 0;
  // The allocator refused it (the GPU was out of memory, and the script
  // caught the error): it held nothing and has no events.
  bool refused = false;

  bool saved_for_backward() const { return category == Category::Activation; }
  static constexpr std::size_t kAlive = static_cast<std::size_t>(-1);
};

struct OpEvent {
  std::uint32_t name = 0;     // index into Trace::op_names ("aten::addmm" or "aten::add.Tensor")
  std::uint32_t scope = 0;    // index into Trace::scopes; 0 is the root ""
  Phase phase = Phase::Forward;
  // Autograd node created by the op (forward, recompute) or running it
  // (backward): its creating thread and sequence number, as node_id makes.
  std::int64_t node = -1;
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

// One training step: its micro-batches' forward and backward passes, the
// optimizer step and zero_grad.
struct StepSpan {
  std::size_t begin = 0;         // its first event
  std::int64_t begin_bytes = 0;  // live when it began: model states, inputs
  std::int64_t peak_bytes = 0;   // largest live bytes during it
  std::size_t peak_event = 0;    // the event that reached it
};

// Stretches of the trace that a chain runner and the checkpoint machinery
// mark, for the checkpointing simulator.
enum class RegionKind : std::uint8_t {
  Unit,                // a unit of a chain runs: forward, with or without autograd, or recomputed
  CheckpointBackward,  // a checkpoint node's backward: recomputation, then the segment's backward
  Recompute,           // the recomputation inside it
};

struct Region {
  RegionKind kind = RegionKind::Unit;
  std::int32_t first = -1, last = -1;  // the unit, or the units of the segment
  bool grad = false;                   // autograd was on when it began
  std::size_t begin = 0, end = 0;      // its events: [begin, end)
  std::int64_t input = -1, output = -1;  // Unit: buffers of its input and output tensors
};

// A request the simulated allocator refused with torch.OutOfMemoryError,
// which the traced code caught (a script that tries a smaller batch).
struct RefusedAllocation {
  std::uint32_t buffer = 0;  // into Trace::buffers (0 bytes there)
  std::int64_t bytes = 0;    // what was asked for
  std::size_t event = 0;     // the first event after it
  Phase phase = Phase::Setup;
  std::uint32_t scope = 0;   // into Trace::scopes
};

struct StepFlops {
  std::int64_t total = 0;
  std::int64_t recompute = 0;  // of them, forward FLOPs run again in backward
};

struct Trace {
  std::vector<Event> events;
  std::vector<Buffer> buffers;
  std::vector<OpEvent> ops;
  std::vector<std::uint32_t> op_buffers;  // buffer indices of op inputs and outputs
  std::vector<std::string> op_names;
  std::vector<std::string> scopes;  // module paths, "" first
  std::map<std::int64_t, std::string> node_names;  // autograd nodes that ran backward

  // Every traced step in order. The last is the one reported: from the
  // second step on, what the steps before left (optimizer states, kept
  // gradients) is live, as in training; the steps before it are its setup.
  std::vector<StepSpan> steps;
  std::vector<std::size_t> forward_begins;   // first event of each forward pass
  std::vector<std::size_t> backward_begins;  // first event of each backward pass
  std::vector<std::size_t> backward_ends;    // first event after each backward pass
  std::vector<Region> regions;              // in the order they began
  std::vector<RefusedAllocation> refused;   // out-of-memory errors the code caught
  // What the code asked of the caching allocator itself, in order.
  std::vector<AllocatorCall> allocator_calls;
  std::int64_t parameter_bytes = 0;  // the model's parameters
  std::int64_t parameter_count = 0;

  const StepSpan& measured() const { return steps.back(); }
  const std::string& op_name(const OpEvent& op) const { return op_names[op.name]; }
  std::vector<std::uint32_t> inputs(const OpEvent& op) const;
  std::vector<std::uint32_t> outputs(const OpEvent& op) const;
  StepFlops measured_flops() const;
  // Bytes autograd kept from the measured step's last forward pass for its backward.
  std::int64_t saved_for_backward_bytes() const;
  // Live bytes of each category after `event`.
  CategoryBytes live_by_category(std::size_t event) const;
  // Sets the live bytes after each event, and each step's starting and peak
  // bytes, from the buffers' bytes (as the tracer keeps them).
  void recount_live_bytes();
  // Tells `observer` what the event did to memory, as the tracer told it:
  // an allocation on its stream; a free, after the streams it was used on.
  void tell(const Event& event, AllocationObserver& observer) const;
  // Tells `observer` every event in order, and the allocator calls between
  // them; `before` sees each event's index first (ops included).
  void replay(AllocationObserver& observer, const std::function<void(std::size_t event)>& before = {}) const;
};

}  // namespace metamem
