// The peak memory and recompute FLOPs of a training step under any
// checkpointing policy, without tracing the step again for each policy.
//
// It reads two calibration traces of the same steps: without checkpointing,
// and with every unit of the chain checkpointed on its own. They hold, per
// unit, what its forward allocates with and without autograd and what its
// backward does; the simulator splices them in the order the policy runs
// them (recomputations nested in backward) and follows the buffers that
// pass from unit to unit by who holds them: the chain runner, the units'
// backward nodes and the checkpoint nodes (profiler/Checkpoint.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "profiler/Chain.h"
#include "profiler/Trace.h"

namespace metamem {

// One unit of the chain, measured on the trace without checkpointing.
struct UnitCost {
  std::string name;                 // module path, e.g. GPT2.h.3
  std::int64_t input_bytes = 0;     // the activation it reads
  std::int64_t saved_bytes = 0;     // what its forward leaves for its backward, input excluded
  std::int64_t forward_flops = 0, backward_flops = 0;
  std::int64_t forward_peak = 0;    // its forward's peak above the bytes live when it began
  std::int64_t backward_peak = 0;   // its backward's peak above the bytes live when it began
  bool keeps_input = false;         // its backward reads its input
};

struct SimulatedStep {
  std::int64_t peak_bytes = 0;       // the measured step's peak
  std::int64_t recompute_flops = 0;  // forward FLOPs run again in backward
};

class CheckpointSimulator {
 public:
  // Both traces are of the same model, options and fake device. Throws
  // std::invalid_argument when the model is not a chain the simulator can
  // follow (a unit's buffer read or freed by another unit).
  CheckpointSimulator(const Trace& plain, const Trace& every_unit);
  ~CheckpointSimulator();
  CheckpointSimulator(CheckpointSimulator&&) noexcept;
  CheckpointSimulator& operator=(CheckpointSimulator&&) noexcept;

  std::int32_t units() const { return static_cast<std::int32_t>(costs_.size()); }
  const std::vector<UnitCost>& costs() const { return costs_; }
  // The measured step's FLOPs without checkpointing.
  std::int64_t step_flops() const { return step_flops_; }
  // The peak and recompute FLOPs of the measured step under `policy`.
  SimulatedStep simulate(const CheckpointPolicy& policy) const;

  struct Span;
  struct Pass;

 private:
  std::vector<Pass> passes_;
  std::vector<UnitCost> costs_;
  std::int64_t begin_bytes_ = 0;
  std::int64_t step_flops_ = 0;
};

// The number of units in a trace's chain (its first forward pass's Unit
// regions): what the every-unit policy spans.
std::int32_t chain_units(const Trace& trace);

// Every unit checkpointed on its own: "0,1,...,n-1".
CheckpointPolicy every_unit_policy(std::int32_t units);

}  // namespace metamem
