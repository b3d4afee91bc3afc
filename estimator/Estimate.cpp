#include "estimator/Estimate.h"

#include "estimator/CachingAllocator.h"

namespace metamem {

ModelStates model_states(const Trace& trace, const StepOptions& options) {
  ModelStates states;
  states.param_bytes = trace.parameter_bytes;
  states.grad_bytes = trace.parameter_bytes;
  if (trace.parameter_count == 0 || options.optimizer == Optimizer::None) return states;
  const bool mixed = options.fp32_master_weights;
  const std::int64_t state_element = mixed ? 4 : trace.parameter_bytes / trace.parameter_count;
  states.optimizer_bytes = optimizer_states_per_parameter(options.optimizer) *
                               trace.parameter_count * state_element +
                           (mixed ? 4 * trace.parameter_count : 0);
  return states;
}

AllocatorPeaks simulate_allocator(const Trace& trace, int roundup_power2_divisions) {
  CachingAllocatorSim sim(roundup_power2_divisions);
  replay_trace(trace, sim, [&](std::size_t e) {
    if (e == trace.step_begin) sim.reset_peaks();
  });
  if (trace.step_begin >= trace.events.size()) sim.reset_peaks();
  return {sim.peak_allocated_bytes(), sim.peak_reserved_bytes()};
}

Estimate estimate(Trace trace, const StepOptions& options, int roundup_power2_divisions) {
  Estimate result;
  result.nodes = node_table(trace);
  result.states = model_states(trace, options);
  result.allocator = simulate_allocator(trace, roundup_power2_divisions);
  result.plan = plan_trace(trace);
  result.trace = std::move(trace);
  return result;
}

}  // namespace metamem
