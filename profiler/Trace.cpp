#include "profiler/Trace.h"

namespace metamem {

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::Setup: return "setup";
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::Optimizer: return "optimizer";
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
  std::int64_t total = 0;
  for (const Buffer& b : buffers)
    if (b.saved_for_backward) total += b.bytes;
  return total;
}

}  // namespace metamem
