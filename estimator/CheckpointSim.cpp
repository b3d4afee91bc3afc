#include "estimator/CheckpointSim.h"

#include "profiler/KeptOutputs.h"

#include <algorithm>
#include <array>
#include <optional>
#include <stdexcept>
#include <unordered_map>

namespace metamem {
namespace {

// Who keeps a buffer that passes between units alive. x_u is unit u's input
// and unit u-1's output; the head (the ops before the chain) makes x_0 and
// the tail (after it) reads x_n.
enum class Holder : std::uint8_t {
  Runner,    // the chain runner's (or the tail's) reference
  Producer,  // backward nodes of the unit that made it
  Consumer,  // backward nodes of the unit that reads it
  Input,     // the checkpoint node of the segment it enters
  Output,    // the checkpoint node of the segment it leaves
  Segment,   // the segment function's own reference to its input
};
constexpr std::size_t kHolders = 6;

struct Entry {
  enum Kind : std::uint8_t {
    Alloc,     // a buffer of the span itself
    Free,
    Produce,   // the span makes x_boundary
    Release,   // `holder` lets x_boundary go
  } kind;
  Holder holder = Holder::Runner;
  std::int32_t boundary = -1;
  std::int64_t bytes = 0;
};

void invalid(const std::string& why) {
  throw std::invalid_argument("checkpoint simulation: " + why);
}

}  // namespace

struct CheckpointSimulator::Span {
  std::vector<Entry> entries;
  std::int64_t flops = 0;

  bool releases(std::int32_t boundary, Holder holder) const {
    return std::any_of(entries.begin(), entries.end(), [&](const Entry& e) {
      return e.kind == Entry::Release && e.boundary == boundary && e.holder == holder;
    });
  }
};

// One pass of a trace with every unit checkpointed, per unit.
struct CheckpointSimulator::Calibration {
  std::vector<Span> no_grad;         // its forward without autograd
  std::vector<Span> recompute;       // its recomputation
  std::vector<Span> first_backward;  // its backward as its segment's first unit
};

struct CheckpointSimulator::Pass {
  Span before;  // from the previous pass (or the step's start) to this forward: as traced
  Span head_forward, tail_forward, tail_backward, head_backward;
  std::vector<Span> forward, backward;       // each unit without checkpointing
  std::vector<Calibration> calibrations;     // by keep set, as CheckpointSimulator::keeps_
  std::vector<std::int64_t> boundary_bytes;  // x_0..x_n; x_0 is -1 if made before the pass
  Span after;  // the step's last pass: from its backward's end to the step's end
};

namespace {

using Span = CheckpointSimulator::Span;

// The events of one forward and backward pass.
struct PassBounds {
  std::size_t forward, backward, end;
};

std::vector<PassBounds> measured_passes(const Trace& trace) {
  std::vector<PassBounds> passes;
  if (trace.backward_ends.size() != trace.forward_begins.size())
    invalid("the trace does not mark where each backward pass ends");
  for (std::size_t i = 0; i < trace.forward_begins.size(); ++i)
    if (trace.forward_begins[i] >= trace.measured().begin)
      passes.push_back({trace.forward_begins[i], trace.backward_begins[i], trace.backward_ends[i]});
  if (passes.empty()) invalid("the measured step has no forward pass");
  return passes;
}

std::vector<const Region*> regions_in(const Trace& trace, RegionKind kind, std::size_t begin,
                                      std::size_t end) {
  std::vector<const Region*> found;
  for (const Region& r : trace.regions)
    if (r.kind == kind && r.begin >= begin && r.end <= end) found.push_back(&r);
  return found;
}

// How a span turns the trace's events into entries.
struct SpanRole {
  enum Kind { Forward, Backward, AsTraced } kind = AsTraced;
  std::int32_t unit = 0;  // Backward: the unit (-1 head, n tail)
  bool tail = false;      // Forward: the tail, whose frees of x_n are its runner letting go
};

class SpanBuilder {
 public:
  SpanBuilder(const Trace& trace, std::unordered_map<std::int64_t, std::int32_t> boundary_of)
      : trace_(trace), boundary_of_(std::move(boundary_of)) {}

  // Events [begin, end); frees before the first other event are left out
  // when `skip_leading_frees` (they are the simulator's to place).
  Span build(std::size_t begin, std::size_t end, SpanRole role, bool skip_leading_frees = false) const {
    Span span;
    bool leading = skip_leading_frees;
    for (std::size_t e = begin; e < end; ++e) {
      const Event& event = trace_.events[e];
      if (event.kind == EventKind::Op) {
        span.flops += trace_.ops[event.index].flops;
        leading = false;
        continue;
      }
      const std::int64_t bytes = trace_.buffers[event.index].bytes;
      const auto boundary = boundary_of_.find(event.index);
      if (event.kind == EventKind::Alloc) {
        leading = false;
        if (boundary == boundary_of_.end()) {
          span.entries.push_back({Entry::Alloc, Holder::Runner, -1, bytes});
        } else if (role.kind == SpanRole::Forward) {
          span.entries.push_back({Entry::Produce, Holder::Runner, boundary->second, bytes});
        } else {
          invalid("an activation passed between units is made outside a unit's forward");
        }
        continue;
      }
      if (leading) continue;
      if (boundary == boundary_of_.end()) {
        span.entries.push_back({Entry::Free, Holder::Runner, -1, bytes});
        continue;
      }
      const std::int32_t b = boundary->second;
      if (role.kind == SpanRole::AsTraced)
        invalid("an activation passed between units outlives its forward and backward pass");
      if (role.kind == SpanRole::Backward && b == role.unit + 1)
        span.entries.push_back({Entry::Release, Holder::Producer, b, 0});
      else if (role.kind == SpanRole::Backward && b == role.unit)
        span.entries.push_back({Entry::Release, Holder::Consumer, b, 0});
      else if (role.kind == SpanRole::Forward && role.tail)
        span.entries.push_back({Entry::Release, Holder::Runner, b, 0});
    }
    return span;
  }

 private:
  const Trace& trace_;
  std::unordered_map<std::int64_t, std::int32_t> boundary_of_;
};

// For a plain trace: the unit (-1 head, n tail) whose forward made each
// autograd node, from the first forward op that reports it.
std::unordered_map<std::int64_t, std::int32_t> node_owners(const Trace& trace, const PassBounds& pass,
                                                           const std::vector<const Region*>& units) {
  std::unordered_map<std::int64_t, std::int32_t> owner;
  const auto n = static_cast<std::int32_t>(units.size());
  std::int32_t unit = -1;
  for (std::size_t e = pass.forward; e < pass.backward; ++e) {
    while (unit < n && e >= (unit + 1 < n ? units[static_cast<std::size_t>(unit + 1)]->begin
                                          : units.back()->end))
      ++unit;
    const Event& event = trace.events[e];
    if (event.kind == EventKind::Op && trace.ops[event.index].node >= 0)
      owner.try_emplace(trace.ops[event.index].node, unit);
  }
  return owner;
}

// Splits a plain trace's backward pass into the tail's part, each unit's
// (last unit first) and the head's. An op belongs to the unit whose forward
// made its node; an op of no unit's node (gradient accumulation) to the one
// before it. Between two ops, frees before any allocation follow the
// earlier op (its node let its saved tensors go), the rest the later one.
// After the last op, frees of buffers the last owner made (in its forward
// or its part of the backward) are its own; the rest (the gradients
// backward() was given) end the pass, with the head. Returns n + 3 cuts: the parts of owners n (tail), n-1, ..., 0,
// -1 (head) lie between consecutive cuts.
std::vector<std::size_t> backward_cuts(const Trace& trace, const PassBounds& pass,
                                       const std::unordered_map<std::int64_t, std::int32_t>& owner,
                                       const std::vector<const Region*>& units) {
  const auto n = static_cast<std::int32_t>(units.size());
  std::vector<std::int32_t> owner_of(pass.end - pass.backward, n);
  std::int32_t current = n;
  std::size_t previous_op = pass.backward;  // first event after the previous op
  std::size_t current_begins = pass.backward;  // first event of the current owner's part
  bool first = true;
  for (std::size_t e = pass.backward; e < pass.end; ++e) {
    const Event& event = trace.events[e];
    if (event.kind != EventKind::Op) continue;
    const auto found = owner.find(trace.ops[event.index].node);
    const std::int32_t unit = found == owner.end() ? current : found->second;
    if (unit > current)
      invalid("unit " + std::to_string(unit) + "'s backward runs after unit " +
              std::to_string(current) + "'s: the model is not a chain");
    std::size_t start = previous_op;
    if (!first)
      while (start < e && trace.events[start].kind == EventKind::Free) owner_of[start++ - pass.backward] = current;
    for (std::size_t i = start; i <= e; ++i) owner_of[i - pass.backward] = unit;
    if (unit != current || first) current_begins = start;
    current = unit;
    previous_op = e + 1;
    first = false;
  }
  const auto made_by_current = [&](std::uint32_t buffer) {
    const std::size_t alloc = trace.buffers[buffer].alloc_event;
    if (alloc >= current_begins && alloc < pass.end) return true;
    if (current < 0 || current >= n) return false;
    const Region& r = *units[static_cast<std::size_t>(current)];
    return alloc >= r.begin && alloc < r.end;
  };
  std::size_t i = previous_op;
  for (; i < pass.end && trace.events[i].kind == EventKind::Free &&
         made_by_current(trace.events[i].index);
       ++i)
    owner_of[i - pass.backward] = current;
  for (; i < pass.end; ++i) owner_of[i - pass.backward] = -1;

  std::vector<std::size_t> cut(static_cast<std::size_t>(n) + 3, pass.end);
  for (std::size_t k = 0; k < cut.size() - 1; ++k) {
    const std::int32_t o = n - static_cast<std::int32_t>(k);
    for (std::size_t i = 0; i < owner_of.size(); ++i)
      if (owner_of[i] <= o) {
        cut[k] = pass.backward + i;
        break;
      }
  }
  cut[0] = pass.backward;
  return cut;
}

// The most bytes live during events [begin, end), above those live before them.
std::int64_t peak_above(const Trace& trace, std::size_t begin, std::size_t end) {
  const std::int64_t before = begin == 0 ? 0 : trace.events[begin - 1].live_bytes;
  std::int64_t peak = 0;
  for (std::size_t e = begin; e < end; ++e) peak = std::max(peak, trace.events[e].live_bytes - before);
  return peak;
}

// Bytes of the buffers made during [begin, end) that are still live at its end.
std::int64_t left_behind(const Trace& trace, std::size_t begin, std::size_t end) {
  std::int64_t bytes = 0;
  for (std::size_t e = begin; e < end; ++e) {
    const Event& event = trace.events[e];
    if (event.kind != EventKind::Alloc) continue;
    const Buffer& buffer = trace.buffers[event.index];
    if (buffer.free_event == Buffer::kAlive || buffer.free_event >= end) bytes += buffer.bytes;
  }
  return bytes;
}

// The module path the ops of events [begin, end) share: a unit's own.
std::string common_scope(const Trace& trace, std::size_t begin, std::size_t end) {
  std::optional<std::string> common;
  for (std::size_t e = begin; e < end; ++e) {
    if (trace.events[e].kind != EventKind::Op) continue;
    const std::string& scope = trace.scopes[trace.ops[trace.events[e].index].scope];
    if (!common) {
      common = scope;
      continue;
    }
    std::size_t same = 0;
    while (same < common->size() && same < scope.size() && (*common)[same] == scope[same]) ++same;
    if (same < common->size() && !(same == scope.size() && (*common)[same] == '.'))
      same = common->rfind('.', same) == std::string::npos ? 0 : common->rfind('.', same);
    common->resize(same);
  }
  return common.value_or("");
}

// Runs a policy over one pass's spans: the buffers and holders of x_u
// instances, live bytes, peak, recomputed FLOPs.
class Run {
 public:
  Run(const CheckpointSimulator::Pass& pass, const CheckpointSimulator::Calibration& calibration,
      bool keeps, std::int64_t live)
      : pass_(pass), calibration_(calibration), keeps_(keeps), live_(live), peak_(live) {}

  std::int64_t live() const { return live_; }
  std::int64_t peak() const { return peak_; }
  std::int64_t recompute_flops() const { return recompute_flops_; }

  void as_traced(const Span& span) {
    for (const Entry& e : span.entries) e.kind == Entry::Alloc ? alloc(e.bytes) : free(e.bytes);
  }

  void pass(const CheckpointPolicy& policy) {
    const auto n = static_cast<std::int32_t>(pass_.forward.size());
    Context top{0, n - 1, &policy.segments, false, std::vector<int>(static_cast<std::size_t>(n) + 1, -1), {}, {}};
    index_segments(top);
    emit(pass_.head_forward, top);
    forward(top);
    emit(pass_.tail_forward, top);
    release(top, n, Holder::Runner);
    emit(pass_.tail_backward, top);
    backward(top);
    emit(pass_.head_backward, top);
    for (const Instance& instance : instances_)
      if (instance.holds != 0)
        throw std::logic_error("checkpoint simulation: an activation outlived its backward pass");
  }

 private:
  struct Instance {
    std::int64_t bytes = 0;
    int holds = 0;
    std::array<std::uint8_t, kHolders> by{};
  };

  // The chain [first, last] run by a forward (the step's, or a recomputation).
  struct Context {
    std::int32_t first, last;
    const std::vector<Segment>* segments;
    bool recompute;
    std::vector<int> instance;  // x_first .. x_last+1; -1: none (made before the pass)
    std::vector<const Segment*> starting, ending;  // by unit - first: the segment it starts or ends
  };

  static void index_segments(Context& c) {
    const std::size_t size = static_cast<std::size_t>(c.last - c.first + 1);
    c.starting.assign(size, nullptr);
    c.ending.assign(size, nullptr);
    for (const Segment& s : *c.segments) {
      c.starting[static_cast<std::size_t>(s.first - c.first)] = &s;
      c.ending[static_cast<std::size_t>(s.last - c.first)] = &s;
    }
  }

  // Whether unit u runs with autograd in context c (in no segment of it).
  static bool plain(const Context& c, std::int32_t u) {
    for (const Segment& s : *c.segments)
      if (u >= s.first && u <= s.last) return false;
    return true;
  }

  // A recomputed unit is the calibration's: as its segment's first unit,
  // or (kept outputs are reused) at all. Its backward is the calibration's
  // only as a first unit, whose input is the segment's detached leaf.
  const Span& forward_span(const Context& c, std::int32_t u) const {
    const bool calibrated = c.recompute && (u == c.first || keeps_);
    return (calibrated ? calibration_.recompute : pass_.forward)[static_cast<std::size_t>(u)];
  }
  const Span& backward_span(const Context& c, std::int32_t u) const {
    return (c.recompute && u == c.first ? calibration_.first_backward : pass_.backward)[static_cast<std::size_t>(u)];
  }

  int& slot(Context& c, std::int32_t boundary) {
    return c.instance[static_cast<std::size_t>(boundary - c.first)];
  }

  void alloc(std::int64_t bytes) {
    live_ += bytes;
    peak_ = std::max(peak_, live_);
  }
  void free(std::int64_t bytes) { live_ -= bytes; }

  void hold(Context& c, std::int32_t boundary, Holder holder) {
    const int id = slot(c, boundary);
    if (id < 0) return;
    Instance& instance = instances_[static_cast<std::size_t>(id)];
    ++instance.holds;
    ++instance.by[static_cast<std::size_t>(holder)];
  }

  void release(Context& c, std::int32_t boundary, Holder holder) {
    const int id = slot(c, boundary);
    if (id < 0) return;
    Instance& instance = instances_[static_cast<std::size_t>(id)];
    auto& count = instance.by[static_cast<std::size_t>(holder)];
    if (count == 0) return;
    --count;
    if (--instance.holds == 0) free(instance.bytes);
  }

  // Who holds x_b when context c makes it.
  void produced(Context& c, std::int32_t b) {
    hold(c, b, Holder::Runner);
    const std::int32_t maker = b - 1;
    if (b == 0) {
      if (pass_.head_backward.releases(0, Holder::Producer)) hold(c, b, Holder::Producer);
    } else if (plain(c, maker)) {
      if (backward_span(c, maker).releases(b, Holder::Producer)) hold(c, b, Holder::Producer);
    } else if (c.ending[static_cast<std::size_t>(maker - c.first)] != nullptr) {
      hold(c, b, Holder::Output);
    }
    if (b <= c.last) {
      if (plain(c, b) && backward_span(c, b).releases(b, Holder::Consumer)) hold(c, b, Holder::Consumer);
      if (c.starting[static_cast<std::size_t>(b - c.first)] != nullptr) hold(c, b, Holder::Input);
    } else if (!c.recompute && pass_.tail_backward.releases(b, Holder::Consumer)) {
      hold(c, b, Holder::Consumer);
    }
  }

  void emit(const Span& span, Context& c) {
    for (const Entry& e : span.entries) {
      switch (e.kind) {
        case Entry::Alloc: alloc(e.bytes); break;
        case Entry::Free: free(e.bytes); break;
        case Entry::Produce: {
          if (e.boundary < c.first || e.boundary > c.last + 1)
            throw std::logic_error("checkpoint simulation: a unit made another chain's activation");
          alloc(e.bytes);
          slot(c, e.boundary) = static_cast<int>(instances_.size());
          instances_.push_back({e.bytes, 0, {}});
          produced(c, e.boundary);
          break;
        }
        case Entry::Release:
          if (e.boundary >= c.first && e.boundary <= c.last + 1) release(c, e.boundary, e.holder);
          break;
      }
    }
  }

  void forward(Context& c) {
    for (std::int32_t u = c.first; u <= c.last;) {
      const Segment* s = c.starting[static_cast<std::size_t>(u - c.first)];
      if (s == nullptr) {
        const Span& span = forward_span(c, u);
        emit(span, c);
        if (c.recompute) recompute_flops_ += span.flops;
        release(c, u, Holder::Runner);  // the runner's reference to the unit's input
        ++u;
        continue;
      }
      hold(c, s->first, Holder::Segment);  // the segment function's reference
      for (std::int32_t v = s->first; v <= s->last; ++v) {
        const Span& span = calibration_.no_grad[static_cast<std::size_t>(v)];
        emit(span, c);
        if (c.recompute) recompute_flops_ += span.flops;
        release(c, v, v == s->first ? Holder::Segment : Holder::Runner);
      }
      release(c, s->first, Holder::Runner);  // the runner's, once the segment returns
      u = s->last + 1;
    }
  }

  void backward(Context& c) {
    for (std::int32_t u = c.last; u >= c.first;) {
      const Segment* s = c.ending[static_cast<std::size_t>(u - c.first)];
      if (s == nullptr) {
        emit(backward_span(c, u), c);
        --u;
        continue;
      }
      release(c, s->last + 1, Holder::Output);
      Context inner{s->first, s->last, &s->inner, true,
                    std::vector<int>(static_cast<std::size_t>(s->last - s->first) + 2, -1), {}, {}};
      index_segments(inner);
      slot(inner, s->first) = slot(c, s->first);
      hold(inner, s->first, Holder::Runner);  // the segment function's reference, recomputing
      if (inner.starting[0] != nullptr) hold(inner, s->first, Holder::Input);
      forward(inner);
      release(inner, s->last + 1, Holder::Runner);  // the recomputed outputs, once their edges are taken
      backward(inner);
      release(c, s->first, Holder::Input);
      u = s->first - 1;
    }
  }

  const CheckpointSimulator::Pass& pass_;
  const CheckpointSimulator::Calibration& calibration_;
  bool keeps_;
  std::vector<Instance> instances_;
  std::int64_t live_, peak_;
  std::int64_t recompute_flops_ = 0;
};

}  // namespace

std::int32_t chain_units(const Trace& trace) {
  if (trace.forward_begins.empty() || trace.backward_begins.empty()) return 0;
  return static_cast<std::int32_t>(
      regions_in(trace, RegionKind::Unit, trace.forward_begins.front(), trace.backward_begins.front())
          .size());
}

CheckpointPolicy every_unit_policy(std::int32_t units) {
  CheckpointPolicy policy;
  for (std::int32_t u = 0; u < units; ++u) policy.segments.push_back({u, u, {}});
  return policy;
}

CheckpointSimulator::CheckpointSimulator(TraceUnder trace) : trace_(std::move(trace)) {
  const Trace plain = trace_({});
  const std::vector<PassBounds> plain_passes = measured_passes(plain);
  begin_bytes_ = plain.measured().begin_bytes;
  step_flops_ = plain.measured_flops().total;

  std::size_t previous_end = plain.measured().begin;
  for (std::size_t p = 0; p < plain_passes.size(); ++p) {
    const PassBounds& a = plain_passes[p];
    const auto units = regions_in(plain, RegionKind::Unit, a.forward, a.backward);
    const auto n = static_cast<std::int32_t>(units.size());
    if (n == 0) invalid("the model runs no chain of units");
    Pass pass;

    // Activations between units, and the chain's order.
    std::unordered_map<std::int64_t, std::int32_t> plain_boundary;
    pass.boundary_bytes.assign(static_cast<std::size_t>(n) + 1, 0);
    for (std::int32_t u = 0; u < n; ++u) {
      const Region& r = *units[static_cast<std::size_t>(u)];
      if (r.first != u || r.input < 0 || r.output < 0) invalid("the units do not run in chain order");
      if (u > 0 && units[static_cast<std::size_t>(u - 1)]->output != r.input)
        invalid("unit " + std::to_string(u) + " does not read unit " + std::to_string(u - 1) + "'s output");
      if (u > 0 && units[static_cast<std::size_t>(u - 1)]->end != r.begin)
        invalid("ops run between units " + std::to_string(u - 1) + " and " + std::to_string(u));
      plain_boundary[r.output] = u + 1;
      pass.boundary_bytes[static_cast<std::size_t>(u) + 1] = plain.buffers[static_cast<std::size_t>(r.output)].bytes;
    }
    const Buffer& input = plain.buffers[static_cast<std::size_t>(units[0]->input)];
    if (input.alloc_event >= a.forward) {
      plain_boundary[units[0]->input] = 0;
      pass.boundary_bytes[0] = input.bytes;
    } else {
      pass.boundary_bytes[0] = -1;
    }

    const SpanBuilder plain_spans(plain, plain_boundary);
    pass.before = plain_spans.build(previous_end, a.forward, {});
    pass.head_forward = plain_spans.build(a.forward, units.front()->begin, {SpanRole::Forward, -1});
    pass.tail_forward = plain_spans.build(units.back()->end, a.backward, {SpanRole::Forward, n, true});
    const auto owner = node_owners(plain, a, units);
    const std::vector<std::size_t> cut = backward_cuts(plain, a, owner, units);
    pass.tail_backward = plain_spans.build(cut[0], cut[1], {SpanRole::Backward, n});
    for (std::int32_t u = 0; u < n; ++u) {
      const Region& r = *units[static_cast<std::size_t>(u)];
      const std::size_t k = static_cast<std::size_t>(n - u);
      pass.forward.push_back(plain_spans.build(r.begin, r.end, {SpanRole::Forward, u}));
      pass.backward.push_back(plain_spans.build(cut[k], cut[k + 1], {SpanRole::Backward, u}));
    }
    pass.head_backward = plain_spans.build(cut[static_cast<std::size_t>(n) + 1], a.end, {SpanRole::Backward, -1});
    previous_end = a.end;

    // The chain as solvers model it, from the step's last pass.
    chain_base_ = std::max(chain_base_, plain.events[units.front()->begin - 1].live_bytes);
    if (p + 1 == plain_passes.size()) {
      chain_.clear();
      for (std::int32_t u = 0; u <= n; ++u) {
        const std::size_t k = static_cast<std::size_t>(n - u);
        const bool tail = u == n;
        const std::size_t begin = tail ? units.back()->end : units[static_cast<std::size_t>(u)]->begin;
        const std::size_t end = tail ? a.backward : units[static_cast<std::size_t>(u)]->end;
        ChainStage stage;
        stage.name = tail ? "(tail)" : common_scope(plain, begin, end);
        stage.input = plain.buffers[static_cast<std::size_t>(
            tail ? units.back()->output : units[static_cast<std::size_t>(u)]->input)].bytes;
        stage.kept = left_behind(plain, begin, end);
        stage.forward_peak = stage.no_grad_peak = peak_above(plain, begin, end);
        stage.backward_peak = peak_above(plain, cut[k], cut[k + 1]);
        stage.forward_flops = (tail ? pass.tail_forward : pass.forward[static_cast<std::size_t>(u)]).flops;
        stage.backward_flops = (tail ? pass.tail_backward : pass.backward[static_cast<std::size_t>(u)]).flops;
        chain_.push_back(stage);
      }
    }

    passes_.push_back(std::move(pass));
  }
  passes_.back().after =
      SpanBuilder(plain, {}).build(plain_passes.back().end, plain.events.size(), {});

  // Selective solvers keep the products that cost the most FLOPs per byte.
  std::unordered_map<std::string, std::pair<double, double>> keepable;  // op: FLOPs, output bytes
  for (const std::string& op : keepable_ops()) keepable[op] = {0, 0};
  const auto last_units = regions_in(plain, RegionKind::Unit, plain_passes.back().forward, plain_passes.back().backward);
  for (const Region* r : last_units)
    for (std::size_t e = r->begin; e < r->end; ++e) {
      const Event& event = plain.events[e];
      if (event.kind != EventKind::Op) continue;
      const OpEvent& op = plain.ops[event.index];
      auto found = keepable.find(plain.op_name(op));
      if (found == keepable.end()) continue;
      found->second.first += static_cast<double>(op.flops);
      for (std::uint32_t b : plain.outputs(op)) found->second.second += static_cast<double>(plain.buffers[b].bytes);
    }
  for (const auto& [op, cost] : keepable)
    if (cost.first > 0) keep_candidates_.push_back(op);
  std::sort(keep_candidates_.begin(), keep_candidates_.end(), [&](const std::string& a, const std::string& b) {
    const auto &ca = keepable[a], &cb = keepable[b];
    return ca.first / std::max(ca.second, 1.0) > cb.first / std::max(cb.second, 1.0);
  });
  add_calibration({}, trace_(every_unit_policy(units())));
}

void CheckpointSimulator::calibrate(const std::vector<std::string>& keep) {
  std::vector<std::string> sorted = keep;
  std::sort(sorted.begin(), sorted.end());
  if (std::find(keeps_.begin(), keeps_.end(), sorted) != keeps_.end()) return;
  CheckpointPolicy policy = every_unit_policy(units());
  policy.keep = keep;
  add_calibration(std::move(sorted), trace_(policy));
}

// The same passes with every unit checkpointed: forwards without autograd,
// and each unit's recomputation and backward as its segment's first unit.
void CheckpointSimulator::add_calibration(std::vector<std::string> keep, const Trace& every_unit) {
  const std::vector<PassBounds> ckpt_passes = measured_passes(every_unit);
  if (ckpt_passes.size() != passes_.size())
    invalid("the trace with every unit checkpointed has other passes than the plain one");
  for (std::size_t p = 0; p < passes_.size(); ++p) {
    Pass& pass = passes_[p];
    const PassBounds& b = ckpt_passes[p];
    const std::size_t units = pass.forward.size();
    Calibration calibration;
    const auto no_grad = regions_in(every_unit, RegionKind::Unit, b.forward, b.backward);
    const auto checkpoints = regions_in(every_unit, RegionKind::CheckpointBackward, b.backward, b.end);
    const auto recomputes = regions_in(every_unit, RegionKind::Recompute, b.backward, b.end);
    const auto recomputed = regions_in(every_unit, RegionKind::Unit, b.backward, b.end);
    if (no_grad.size() != units || checkpoints.size() != units ||
        recomputes.size() != units || recomputed.size() != units)
      invalid("the trace with every unit checkpointed does not match the plain one");
    std::unordered_map<std::int64_t, std::int32_t> ckpt_boundary;
    for (const Region* r : no_grad) {
      ckpt_boundary[r->input] = r->first;
      ckpt_boundary[r->output] = r->first + 1;
    }
    for (const Region* r : recomputed) ckpt_boundary[r->output] = r->first + 1;
    if (pass.boundary_bytes[0] < 0) ckpt_boundary.erase(no_grad.front()->input);
    const SpanBuilder ckpt_spans(every_unit, ckpt_boundary);
    calibration.no_grad.resize(units);
    calibration.recompute.resize(units);
    calibration.first_backward.resize(units);
    for (const Region* r : no_grad) {
      calibration.no_grad[static_cast<std::size_t>(r->first)] = ckpt_spans.build(r->begin, r->end, {SpanRole::Forward, r->first});
      if (p + 1 == passes_.size() && keeps_.empty())
        chain_[static_cast<std::size_t>(r->first)].no_grad_peak = peak_above(every_unit, r->begin, r->end);
    }
    for (std::size_t i = 0; i < checkpoints.size(); ++i) {
      const Region &c = *checkpoints[i], &rc = *recomputes[i], &u = *recomputed[i];
      if (c.first != c.last || rc.first != c.first || u.first != c.first || u.begin < rc.begin ||
          u.end > rc.end || rc.begin < c.begin || rc.end > c.end)
        invalid("unexpected checkpoint regions in the trace with every unit checkpointed");
      const auto unit = static_cast<std::size_t>(c.first);
      calibration.recompute[unit] = ckpt_spans.build(u.begin, u.end, {SpanRole::Forward, c.first});
      calibration.first_backward[unit] = ckpt_spans.build(rc.end, c.end, {SpanRole::Backward, c.first}, true);
    }
    pass.calibrations.push_back(std::move(calibration));
  }
  keeps_.push_back(std::move(keep));
}

CheckpointSimulator::~CheckpointSimulator() = default;
CheckpointSimulator::CheckpointSimulator(CheckpointSimulator&&) noexcept = default;
CheckpointSimulator& CheckpointSimulator::operator=(CheckpointSimulator&&) noexcept = default;

SimulatedStep CheckpointSimulator::simulate(const CheckpointPolicy& policy) const {
  validate(policy, units());
  std::vector<std::string> keep = policy.keep;
  std::sort(keep.begin(), keep.end());
  const auto calibrated = std::find(keeps_.begin(), keeps_.end(), keep);
  if (calibrated == keeps_.end())
    throw std::logic_error("checkpoint simulation: " + to_string(policy) + " keeps ops not calibrated");
  const auto calibration = static_cast<std::size_t>(calibrated - keeps_.begin());
  SimulatedStep result;
  std::int64_t live = begin_bytes_;
  result.peak_bytes = live;
  for (const Pass& pass : passes_) {
    Run run(pass, pass.calibrations[calibration], !keep.empty(), live);
    run.as_traced(pass.before);
    run.pass(policy);
    run.as_traced(pass.after);
    live = run.live();
    result.peak_bytes = std::max(result.peak_bytes, run.peak());
    result.recompute_flops += run.recompute_flops();
  }
  return result;
}

}  // namespace metamem
