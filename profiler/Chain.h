// A model's middle as a chain of units (GPT-2's blocks, ResNet's residual
// blocks, an MLP's layers), run under a checkpointing policy.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace metamem {

// Units first..last (indices into the chain) checkpointed as one segment.
// When the segment is recomputed, `inner` names the segments checkpointed
// within it (nested checkpointing, as rotor's schedules use).
struct Segment {
  std::int32_t first = 0, last = 0;
  std::vector<Segment> inner;
};

struct CheckpointPolicy {
  std::vector<Segment> segments;  // disjoint, in chain order; none: nothing is recomputed
  // Selective: ops whose outputs checkpointed segments keep rather than
  // recompute (see KeptOutputs.h); only for segments without inner ones.
  std::vector<std::string> keep;
};

// Throws std::invalid_argument unless every segment lies inside the chain of
// `units`, segments are disjoint and ordered, inner segments are proper
// parts of theirs, and kept ops can be kept (by segments without inner ones).
void validate(const CheckpointPolicy& policy, std::int32_t units);

// "0-3[1-2],5,7-11": segments by unit index, inner segments in brackets;
// "0-3,4-7;keep=aten::mm,aten::addmm" keeps those ops' outputs.
std::string to_string(const CheckpointPolicy& policy);
// The inverse; throws std::invalid_argument for text it cannot read.
CheckpointPolicy parse_policy(const std::string& text);

struct Unit {
  std::vector<std::string> scope;  // module path below the model's, e.g. {"layer2", "0"}
  std::function<at::Tensor(const at::Tensor&)> forward;
};

// Told when a unit of a chain runs, forward or recomputed in backward, on
// whatever thread runs it: ZeRO stage 3 gathers the unit's parameters
// around it.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void before_unit(std::int32_t unit) = 0;
  virtual void after_unit(std::int32_t unit, const at::Tensor& output) = 0;
};

// Installs `hooks` for every chain run while it lives (one at a time).
class UnitHooksScope {
 public:
  explicit UnitHooksScope(UnitHooks* hooks);
  ~UnitHooksScope();
  UnitHooksScope(const UnitHooksScope&) = delete;
  UnitHooksScope& operator=(const UnitHooksScope&) = delete;
};

// Runs `units` in order on `x` under `policy` and returns the last output.
// Each unit runs in a Unit region of the trace, which ends after the
// runner has dropped its reference to the unit's input. Checkpointed
// segments refer to `units` in their backward: it must outlive it.
at::Tensor run_chain(const std::vector<Unit>& units, at::Tensor x, const CheckpointPolicy& policy);

}  // namespace metamem
