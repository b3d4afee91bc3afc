// Activation checkpointing in C++: a segment of a model runs forward without
// keeping what autograd would save, and its backward recomputes it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace metamem {

using SegmentFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// Which units of a chain a segment spans, for the trace's regions.
struct SegmentLabel {
  std::int32_t first = -1, last = -1;
};

// Runs `fn(inputs)` with autograd off and returns its outputs attached to one
// backward node. The node keeps the inputs and the CPU random state; its
// backward restores that state (dropout draws the same mask), recomputes
// `fn` with autograd on, and runs the recomputed graph's backward at once,
// from the gradients of the outputs. Parameters used inside receive their
// gradients as usual, whether or not an input requires grad.
//
// As with torch.utils.checkpoint(use_reentrant=False), the recomputed tensors
// live only as long as their backward needs them, and the inputs until the
// segment's backward ends. Unlike it, recomputation starts when the outputs'
// gradients arrive (torch starts at the first saved tensor unpacked), and
// the node keeps its outputs until then, so that their bytes are freed at a
// point that does not depend on what the following layers save. Outputs
// must be new tensors (not views); without autograd, `fn` just runs.
//
// Ops named in `keep` (see KeptOutputs.h) keep their outputs from the
// forward, and the recomputation reuses them instead of running them.
std::vector<at::Tensor> checkpoint(const SegmentFn& fn, const std::vector<at::Tensor>& inputs,
                                   SegmentLabel label = {}, const std::vector<std::string>& keep = {});

}  // namespace metamem
