// CUDA reductions on a fake device: what torch's gpu_reduce_kernel holds
// beside its output. A reduction of many inputs into few outputs (a bias
// gradient: 8,192 rows summed into 256) splits each output's inputs across
// thread blocks, which combine their partial results through a staging
// buffer in global memory and count themselves done with semaphores. Both
// are allocated from the caching allocator after the output and freed when
// the kernel has been launched.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/OptionalArrayRef.h>

#include <cstdint>
#include <string>

#include "meta/CpuKernelModel.h"

namespace metamem {

// Bytes of the input's copy in the reduction's dtype (make_reduction's
// self.to(in_dtype): a sum of bools or ints reduces int64s; none where the
// kernel reads the input as it is) or of a strided input's contiguous copy
// (a whole tensor's max, min, argmax, argmin), then of the staging buffer and of the
// semaphores, in the order they are allocated; the last two 0 where the
// blocks of an output do not split its inputs.
struct ReductionStaging {
  std::int64_t cast = 0, buffer = 0, semaphores = 0;
};

using ReductionStagingModel = ReductionStaging (*)(c10::ArrayRef<c10::IValue> arguments,
                                                   c10::ArrayRef<c10::IValue> returns);

// The cast input, staging buffer and semaphores of a reduction inside a
// kernel's plan, made and freed in turn, as the reduction's kernel does.
void add_staging(ScratchPlan& plan, const ReductionStaging& staging);

// aminmax of all of `self` inside a kernel's plan, after its two 0-dim
// results (aminmax_out): self made contiguous, and the reduction's staging.
void add_aminmax_of_all(ScratchPlan& plan, const at::Tensor& self);

// Norm: linalg_vector_norm's kernels (norm_kernel_cuda), which load as
// mean's do; Extremum: amax's and amin's, which load as mean's do and
// accumulate in the input's dtype; MinMax: aminmax's of a whole tensor,
// which accumulate a (min, max) pair of it; Welford: var's and std's (and
// var_mean's, std_mean's), which load two at once and accumulate a
// running mean, M2 and count (WelfordData: 16 bytes, 32 for doubles);
// IndexedExtremum: argmax's, argmin's and max.dim's and min.dim's, which
// load as mean's do and accumulate a (value, int64 index) pair, 16 bytes;
// Logical: all's and any's, which read the input as it is into a bool.
// Mean's loads and float accumulator serve prod and nansum too.
enum class CudaReduction { Sum, Mean, Norm, Extremum, MinMax, Welford, IndexedExtremum, Logical };

// What a sum, mean, norm or extremum of `self` over `dims` into `result` holds on the
// traced GPU: for kernels that reduce through torch's own functions (layer
// norm's backward, a loss's mean).
ReductionStaging cuda_reduction_staging(CudaReduction kind, const at::Tensor& self, const at::Tensor& result,
                                        at::OptionalIntArrayRef dims, bool keepdim);

// A plain meta tensor of t's sizes, strides and dtype, on which a plan runs
// the kernel's own shape arithmetic (outside the meta mode).
at::Tensor meta_twin(const at::Tensor& t);

// Launch arithmetic the CUDA kernels share: a / b rounded up, and the
// largest power of two not above n (at least 1).
std::int64_t div_up(std::int64_t a, std::int64_t b);
std::int64_t last_pow2(std::int64_t n);

// The model of op `qualified_name` ("aten::sum.dim_IntList") for the traced
// GPU (meta/CudaAttention.h's traced_gpu()), or nullptr.
ReductionStagingModel cuda_reduction_staging_model(const std::string& qualified_name);

}  // namespace metamem
