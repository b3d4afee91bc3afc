// What libtorch's native CPU kernels hold beside their outputs while they
// run: im2col columns, per-group copies, BLAS operand copies, wrapped Scalar
// operands. A trace on fake cpu records them as temporaries of the op, so
// that its peak is the real CPU run's to the byte (tests/CpuKernelModelTest).
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <c10/util/SmallVector.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace metamem {

// Bytes an op's kernel holds at once beside its outputs, from its
// arguments and results (tensors as the caller's MetaTensors).
using ScratchModel = std::int64_t (*)(c10::ArrayRef<c10::IValue> arguments,
                                      c10::ArrayRef<c10::IValue> returns);

// A kernel whose temporaries the allocator must meet one by one, in the
// kernel's order (a segment's free blocks then split as on the device):
// each step makes a piece or frees one made before it, the first
// `before_outputs` steps before the kernel's outputs exist (contiguous
// copies of its inputs). What is left is freed, the last made first, as
// the kernel returns.
struct ScratchPlan {
  struct Step {
    std::int64_t bytes = 0;              // made: a piece of this many bytes (none if 0)
    std::optional<std::size_t> freed;  // or freed: the piece of this number, counted from 0 as made
  };
  c10::SmallVector<Step, 8> steps;
  std::size_t before_outputs = 0;

  // The new piece's number.
  std::size_t make(std::int64_t bytes) {
    const auto made = std::count_if(steps.begin(), steps.end(), [](const Step& step) { return !step.freed; });
    steps.push_back({bytes, std::nullopt});
    return static_cast<std::size_t>(made);
  }
  void free(std::size_t piece) { steps.push_back({0, piece}); }
};
// From the op's arguments alone: pieces made before the outputs are.
using ScratchPlanModel = ScratchPlan (*)(c10::ArrayRef<c10::IValue> arguments);

// The model of op `qualified_name` ("aten::mm", "aten::add.Scalar"), or
// nullptr when its CPU kernel holds nothing beside its outputs.
ScratchModel cpu_scratch_model(const std::string& qualified_name);

// The same for libtorch's own CUDA kernels, which a fake CUDA device (no
// cuDNN) runs: the columns of its convolutions, softmax backward's product.
ScratchModel cuda_native_scratch_model(const std::string& qualified_name);

// The same for metamem's own ops (meta/FlashAttention.cpp), whose kernels
// hold the same scratch on every fake device.
ScratchModel device_scratch_model(const std::string& qualified_name);

}  // namespace metamem
