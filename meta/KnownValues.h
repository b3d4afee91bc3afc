// KnownValues: the values a trace knows. A traced tensor has no data, but
// some are made from Python numbers alone by deterministic ops (an
// attention mask of ones, arange's positions, linspace's drop-path rates)
// and are small: the trace computes those for real on CPU beside the
// MetaTensors, so that code reading them (`if mask.all()`, `.tolist()`)
// reads what the real run reads. Values never count as memory: they live
// beside the trace, in the buffers' shadows, and die with the buffers.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/FunctionRef.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "meta/MetaMode.h"

namespace c10 {
class OperatorHandle;
}

namespace metamem {

// The most an op's outputs may hold for the trace to compute their values
// (its inputs' buffers and outputs together: twice that). A model's square
// constants (GPT-2's 1,024 x 1,024 bool causal mask in each of its 12
// layers, 1 MiB) would cost the trace more than their values are worth:
// computing those masks' ones made the Python GPT-2 block 3 ms slower to
// build (bench/python_gpt2_bench.py).
inline constexpr std::int64_t kKnownValuesLimit = std::int64_t{768} << 10;

// The same for a step's index arithmetic, ops whose outputs are integers or
// that compare integers: transformers reads the position ids of every token
// of a step to find packed sequences (their difference, where it is not 1
// and its running sum; int64: 8 MiB at 1,048,576 tokens).
inline constexpr std::int64_t kKnownIndicesLimit = std::int64_t{8} << 20;

// After `op` ran on MetaTensors (`arguments` and `returns` as the caller
// sees them): the values of its new buffers when every tensor it reads has
// known values, none is random or uninitialised and all fit the limit; the
// buffers it writes otherwise lose theirs. The op then runs for real on
// those values and on the real tensors among the arguments, and writes
// those it writes: `before_running` is called first.
void learn_values(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments,
                  c10::ArrayRef<c10::IValue> returns, c10::function_ref<void()> before_running);

// Before `op` runs: raises the real kernel's error where it indexes with
// indices the trace knows and one is out of range (embedding, index_select,
// gather, indexing by tensors), which the meta kernel never looks at. The
// CPU kernels' errors, on a fake cuda too (where the real run stops at a
// device-side assert that does not say which index).
void check_known_indices(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments);

// A MetaTensor's values as a real CPU tensor of its sizes and strides, if
// the trace knows them; likewise of the meta tensor inside one, as a
// kernel receives it.
std::optional<at::Tensor> known_values(const at::Tensor& t);

// The values of an integer tensor a kernel reads on the host (lengths,
// indices), flattened: a real host tensor's own (torch.tensor([...]) beside
// traced tensors), or those the trace knows of a traced one.
std::optional<std::vector<std::int64_t>> known_integers(const at::Tensor& t);

// The buffer is freed: its values go with it.
void forget_values(BufferId id);

// The trace ends: no op runs on its tensors any more, and values kept past
// it (tensors still alive at the process's exit) would be freed by a CPU
// allocator already destroyed.
void forget_all_values();

}  // namespace metamem
