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
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace metamem {

// Bytes an op's kernel holds at once beside its outputs, from its
// arguments and results (tensors as the caller's MetaTensors).
using ScratchModel = std::int64_t (*)(c10::ArrayRef<c10::IValue> arguments,
                                      c10::ArrayRef<c10::IValue> returns);

// A kernel whose temporaries the allocator must meet one by one, in the
// kernel's order (a segment's free blocks then split as on the device):
// each step makes a piece or frees one made before it, the first
// `before_outputs` steps before the kernel's outputs exist (contiguous
// copies of its inputs). Where the kernel makes some of its outputs
// between its temporaries, a step says when (output); where it calls
// cuBLAS between them, a step says when its first call comes (which may
// make cuBLAS's workspace), instead of after every piece is made. What is
// left is freed, the last made first, as the kernel returns.
// A recorded call whose kernel tries engines in turn where the caching
// allocator refuses a workspace (cuDNN's convolutions: Conv_v8.cpp's
// try_configs), and tries the engine it last ran first at its next call
// (torch keeps it per thread: benchmark_cache).
class WorkspaceEngines {
 public:
  virtual ~WorkspaceEngines() = default;
  // The bytes piece `piece` has in the engine after those in which it had
  // `refused` bytes, in cuDNN's order; nullopt where no other is known.
  virtual std::optional<std::int64_t> next(std::size_t piece, const std::vector<std::int64_t>& refused) = 0;
  // The bytes it had in the engine the call last ran in this trace;
  // nullopt before its first run.
  virtual std::optional<std::int64_t> kept(std::size_t piece) = 0;
  virtual void ran(std::size_t piece, std::int64_t bytes) = 0;
};

struct ScratchPlan {
  struct Step {
    // EmptyCache: the kernel empties the caching allocator's cache.
    enum class Kind : std::uint8_t { Make, Free, Output, CublasCall, EmptyCache };
    Kind kind = Kind::Make;
    std::int64_t bytes = 0;  // Make: the piece's bytes (none if 0)
    std::size_t index = 0;   // Free: the piece, numbered from 0 as made; Output: the op's return
  };
  c10::SmallVector<Step, 8> steps;
  std::size_t before_outputs = 0;
  std::size_t pieces = 0;  // made so far (a grouped convolution's plan makes hundreds)
  // Recorded from real torch on the fake GPU (set_recorded_plans): its steps
  // are all the kernel makes, its first cuBLAS call included where it made
  // one and none where it did not; and each return's strides as the kernel
  // laid it out, and its sizes (none: as the meta kernel does them).
  bool recorded = false;
  std::vector<std::vector<std::int64_t>> return_sizes, return_strides;
  // Unset where the kernel has no other engine.
  std::shared_ptr<WorkspaceEngines> engines;

  // The new piece's number.
  std::size_t make(std::int64_t bytes) {
    steps.push_back({Step::Kind::Make, bytes, 0});
    return pieces++;
  }
  void free(std::size_t piece) { steps.push_back({Step::Kind::Free, 0, piece}); }
  void output(std::size_t return_index) { steps.push_back({Step::Kind::Output, 0, return_index}); }
  void cublas_call() { steps.push_back({Step::Kind::CublasCall, 0, 0}); }
  void empty_cache() { steps.push_back({Step::Kind::EmptyCache, 0, 0}); }
};
// What t.contiguous(format) allocates: a copy unless it already is (none
// for an undefined tensor). For the models and plans of every family.
std::int64_t copy_unless_contiguous(const at::Tensor& t, at::MemoryFormat format = at::MemoryFormat::Contiguous);
// What t.reshape(-1) allocates: a copy unless its strides view it flat.
std::int64_t copy_unless_viewable_flat(const at::Tensor& t);
// The copy a whole tensor's max or min (self, `flattened` false:
// self.contiguous()) or argmax or argmin without a dim (self, dim,
// keepdim; `flattened`: self.reshape(-1)) reads; none over a dim.
std::int64_t whole_tensor_read_copy(c10::ArrayRef<c10::IValue> arguments, bool flattened);
// What resize_ makes where it grows `grown`'s storage under deterministic
// algorithms (fill_resize_deterministic_): a 0-dim tensor of its dtype on its
// device, made and freed at once, through which the new elements are
// filled. 0 otherwise.
std::int64_t deterministic_resize_fill(const at::Tensor& grown);

// From the op's arguments alone: pieces made before the outputs are.
using ScratchPlanModel = ScratchPlan (*)(c10::ArrayRef<c10::IValue> arguments);

// The model of op `qualified_name` ("aten::mm", "aten::add.Scalar"), or
// nullptr when its CPU kernel holds nothing beside its outputs.
ScratchModel cpu_scratch_model(const std::string& qualified_name);

// Its families' tables, which it asks: the layers' kernels
// (meta/CpuLayerModel.cpp) and linear algebra's (meta/CpuLinalgModel.cpp).
ScratchModel cpu_layer_scratch_model(const std::string& qualified_name);
ScratchModel cpu_linalg_scratch_model(const std::string& qualified_name);

// The same for libtorch's own CUDA kernels, which a fake CUDA device (no
// cuDNN) runs: softmax's contiguous input. Kernels that make several
// temporaries in an order of their own have plans (meta/CudaKernelPlans.h).
ScratchModel cuda_native_scratch_model(const std::string& qualified_name);

// The same for metamem's own ops (meta/FlashAttention.cpp), whose kernels
// hold the same scratch on every fake device.
ScratchModel device_scratch_model(const std::string& qualified_name);

}  // namespace metamem
