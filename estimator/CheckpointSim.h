// The peak memory and recompute FLOPs of a training step under any
// checkpointing policy, without tracing the step again for each policy.
//
// It reads calibration traces of the same steps: without checkpointing, and
// with every unit of the chain checkpointed on its own (for selective
// policies, also while keeping their ops' outputs). They hold, per
// unit, what its forward allocates with and without autograd and what its
// backward does; the simulator splices them in the order the policy runs
// them (recomputations nested in backward) and follows the buffers that
// pass from unit to unit by who holds them: the chain runner, the units'
// backward nodes and the checkpoint nodes (profiler/Checkpoint.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "profiler/Chain.h"
#include "profiler/Trace.h"

namespace metamem {

// One stage of the chain as a solver models it: a unit, or the tail (the
// loss and what comes after the last unit), which is never checkpointed.
// Peaks are above the bytes live when the stage begins.
struct ChainStage {
  std::string name;                 // module path, e.g. GPT2.h.3
  std::int64_t input = 0;           // the activation it reads; its gradient is as large
  std::int64_t kept = 0;            // what its forward leaves for its backward, its output included
  std::int64_t forward_peak = 0;    // its forward with autograd
  std::int64_t no_grad_peak = 0;    // its forward without autograd, its output included
  std::int64_t backward_peak = 0;   // its backward, from its kept bytes and incoming gradient
  std::int64_t forward_flops = 0, backward_flops = 0;
};

struct SimulatedStep {
  std::int64_t peak_bytes = 0;       // the measured step's peak
  std::int64_t recompute_flops = 0;  // forward FLOPs run again in backward
};

class CheckpointSimulator {
 public:
  // Traces the same steps (model, options, fake device) under a policy.
  using TraceUnder = std::function<Trace(const CheckpointPolicy&)>;

  // Takes the two calibration traces through `trace`. Throws
  // std::invalid_argument when the model is not a chain the simulator can
  // follow (a unit's buffer read or freed by another unit).
  explicit CheckpointSimulator(TraceUnder trace);
  ~CheckpointSimulator();
  CheckpointSimulator(CheckpointSimulator&&) noexcept;
  CheckpointSimulator& operator=(CheckpointSimulator&&) noexcept;

  // Selective policies keeping `keep` need a calibration trace of their
  // own (every unit checkpointed, keeping them): taken once, here.
  void calibrate(const std::vector<std::string>& keep);
  // Keepable ops the units run, the most FLOPs per byte of output first:
  // what selective solvers try to keep.
  const std::vector<std::string>& keep_candidates() const { return keep_candidates_; }

  std::int32_t units() const { return static_cast<std::int32_t>(chain_.size()) - 1; }
  // The units, then the tail, measured on the step's last pass.
  const std::vector<ChainStage>& chain() const { return chain_; }
  // Bytes live when the first unit begins (parameters, states, the head's
  // activations, the first unit's input): the chain's base.
  std::int64_t chain_base() const { return chain_base_; }
  // The measured step's FLOPs without checkpointing.
  std::int64_t step_flops() const { return step_flops_; }
  // The peak and recompute FLOPs of the measured step under `policy`; its
  // kept ops must have been calibrated (std::logic_error otherwise).
  SimulatedStep simulate(const CheckpointPolicy& policy) const;

  struct Span;
  struct Calibration;
  struct Pass;

 private:
  void add_calibration(std::vector<std::string> keep, const Trace& every_unit);

  TraceUnder trace_;
  std::vector<Pass> passes_;
  std::vector<std::vector<std::string>> keeps_;  // calibrated keep sets, sorted; [0] is none
  std::vector<std::string> keep_candidates_;
  std::vector<ChainStage> chain_;
  std::int64_t chain_base_ = 0;
  std::int64_t begin_bytes_ = 0;
  std::int64_t step_flops_ = 0;
};

// The number of units in a trace's chain (its first forward pass's Unit
// regions): what the every-unit policy spans.
std::int32_t chain_units(const Trace& trace);

// Every unit checkpointed on its own: "0,1,...,n-1".
CheckpointPolicy every_unit_policy(std::int32_t units);

}  // namespace metamem
