// A CUDA graph captured in a fake-cuda trace (torch.cuda.graph, the
// recording of torch.compile's CUDA graph trees): what torch's kernels do
// differently while a capture is underway.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <vector>

namespace c10 {
class OperatorHandle;
}

namespace metamem {

void begin_graph_capture();
// What the captured graph keeps for its life besides its pool's blocks:
// the CUDA generator's graph-safe seed and offset, where it drew.
std::vector<at::Tensor> end_graph_capture();
bool graph_capture_underway();

// Whether op `op`, about to run with `arguments` on fake cuda, is a
// captured graph's first random draw. Then CUDA's generator makes its
// seed and offset for the graph (8 B each, on the default stream, outside
// the capture's pool; measured: real torch on the fake GPU), by
// make_draw_state, after the op's outputs, but before them for attention,
// which draws first.
bool first_draw_of_capture(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments);
bool draws_before_outputs(const c10::OperatorHandle& op);
void make_draw_state();

// CUDA's generator's state read (torch.cuda.get_rng_state, as activation
// checkpointing does before each region): in a capture, the first read
// makes the seed and offset as a first draw would (measured: real torch on
// the fake GPU, torchtitan's checkpointed layers under CUDA graphs).
void read_generator_state_in_capture();

}  // namespace metamem
