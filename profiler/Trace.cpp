#include "profiler/Trace.h"

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

}  // namespace metamem
