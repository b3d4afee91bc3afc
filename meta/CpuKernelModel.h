// What libtorch's native CPU kernels hold beside their outputs while they
// run: im2col columns, per-group copies, BLAS operand copies, wrapped Scalar
// operands. A trace on fake cpu records them as temporaries of the op, so
// that its peak is the real CPU run's to the byte (tests/CpuKernelModelTest).
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <c10/util/SmallVector.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace metamem {

// Bytes an op's kernel holds at once beside its outputs, from its
// arguments and results (tensors as the caller's MetaTensors).
using ScratchModel = std::int64_t (*)(c10::ArrayRef<c10::IValue> arguments,
                                      c10::ArrayRef<c10::IValue> returns);

// A kernel whose temporaries the allocator must meet one by one, in the
// kernel's order (a segment's free blocks then split as on the device):
// each piece's bytes in the order allocated, the first `before_outputs`
// of them before the kernel's outputs (contiguous copies of its inputs);
// all are freed, the last made first, as the kernel returns.
struct ScratchPlan {
  c10::SmallVector<std::int64_t, 6> pieces;
  std::size_t before_outputs = 0;
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
