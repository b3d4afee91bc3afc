// The plans (ScratchPlan) of CUDA kernels whose temporaries the allocator
// meets one by one on a fake cuda device, by family; each returns the plan
// of op `qualified_name` ("aten::convolution"), or nullptr.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "meta/CpuKernelModel.h"

namespace metamem {

// scaled_dot_product_attention's backward kernels (meta/CudaAttention.cpp,
// meta/EfficientAttention.cpp).
ScratchPlanModel cuda_attention_plan_model(const std::string& qualified_name);

// CTC loss: torch's own kernels and cuDNN's (meta/CtcLoss.cpp).
ScratchPlanModel cuda_ctc_loss_plan_model(const std::string& qualified_name);

// libtorch's own convolutions, im2col and col2im (meta/CudaConvolution.cpp).
ScratchPlanModel cuda_convolution_plan_model(const std::string& qualified_name);

// Embedding lookups (meta/CudaEmbedding.cpp).
ScratchPlanModel cuda_embedding_plan_model(const std::string& qualified_name);

// index_put_ where it sorts its indices: accumulating, or deterministic
// (meta/CudaIndexing.cpp).
ScratchPlanModel cuda_indexing_plan_model(const std::string& qualified_name);

// Matrix products' operand copies (meta/CudaMatmul.cpp).
ScratchPlanModel cuda_matmul_plan_model(const std::string& qualified_name);

// Layer norm, group norm, channels-last batch norm and softmax's backward
// (meta/CudaNormalization.cpp).
ScratchPlanModel cuda_normalization_plan_model(const std::string& qualified_name);

// Max pooling (meta/CudaPooling.cpp).
ScratchPlanModel cuda_pooling_plan_model(const std::string& qualified_name);

// Roll (meta/CudaRoll.cpp).
ScratchPlanModel cuda_roll_plan_model(const std::string& qualified_name);

// Cumulative sums, products and log-sum-exps: casts, contiguous copies and
// cub's scan storage (meta/CudaScan.cpp).
ScratchPlanModel cuda_scan_plan_model(const std::string& qualified_name);

// What a cumulative sum of one slice of n values of `dtype` holds, made and
// freed at once: cub's scan storage, or under deterministic algorithms
// libtorch's own per-block sums of floating values (multinomial's prefix
// sum of one distribution).
void make_cumulative_sum_storage(ScratchPlan& plan, std::int64_t n, at::ScalarType dtype);

// Sorts, topk, whole-tensor medians, randperm and multinomial: libtorch's
// buffers and cub's temporary storage (meta/CudaSort.cpp).
ScratchPlanModel cuda_sort_plan_model(const std::string& qualified_name);

// For the plans of kernels that sort through cub (sorts, an embedding's
// gradient): the temporary storage cub 3.0's DeviceRadixSort asks for to
// sort `n` keys of `key_bytes` on `bits` of each, with values of
// `value_bytes` (0 for keys alone), on the traced GPU's architecture, n
// passed as int64_t as libtorch passes it; made and freed at once. None
// where cub sizes it by its kernels' occupancy, which a trace cannot know
// (keys under 4 bytes before sm90).
void make_cub_radix_sort_storage(ScratchPlan& plan, std::int64_t n, std::int64_t key_bytes, std::int64_t value_bytes,
                                 int bits);

// Whether CUDA's batch norm kernels take `t` as channels-last (torch's
// batch_norm_use_channels_last_kernels): a channels-last layout, or
// contiguous with unit stride over its channels (a 2-d [N, C]).
bool batch_norm_uses_channels_last_kernels(const at::Tensor& t);

// Whether batch_norm_backward_reduce (SyncBatchNorm's) takes its
// channels-last kernel: both tensors channels-last, the statistics and any
// weight contiguous.
bool batch_norm_backward_reduce_is_channels_last(const at::Tensor& grad_out, const at::Tensor& input,
                                                 const at::Tensor& mean, const at::Tensor& invstd,
                                                 const c10::optional<at::Tensor>& weight);

// The traced GPU's compute capability as cub and CUDA number it (sm90: 900).
int traced_sm();

// The tuning cub 3.0's select and scan-by-key dispatchers take on the traced
// GPU: sm90's (which later architectures keep or fall back to), sm80's (up
// to sm86), or their default (sm75, sm86, sm89).
enum class CubTuning { Sm90, Sm80, Default };
CubTuning cub_tuning();

// The temporary storage cub 3.0's DeviceScan::InclusiveSumByKey or
// InclusiveScanByKey (with the maximum) asks for over n keys and values of
// `key_bytes` each, on the traced GPU's architecture: a (key, value) pair's
// tile state in 16 bytes for each tile and 32 of padding, and each tile's
// last key; made and freed at once (meta/CudaScan.cpp).
void make_cub_scan_by_key_storage(ScratchPlan& plan, std::int64_t n, std::int64_t key_bytes);

// The temporary storage cub 3.0's DeviceSelect::Unique (or, `by_key`,
// UniqueByKey with libtorch's positions as values) asks for to select
// the runs of n sorted keys of `key_bytes` on the traced GPU's
// architecture; made and freed at once.
void make_cub_unique_storage(ScratchPlan& plan, std::int64_t n, std::int64_t key_bytes, bool by_key);

// cub's AliasTemporaries: the bytes a blob of these pieces takes, each
// rounded up to 256 bytes and 255 more to align the whole.
std::int64_t cub_alias_temporaries(std::initializer_list<std::int64_t> pieces);

// The bits keys of up to `max_key` take (cub::get_num_bits), on which
// libtorch sorts ids it knows the range of.
int cub_num_bits(std::int64_t max_key);

// Kernels that reduce a temporary of their own: a loss's mean over its
// elementwise values or per-sample losses, pdist's gradient over its pairs
// (meta/CudaReduction.cpp).
ScratchPlanModel cuda_reduction_plan_model(const std::string& qualified_name);

}  // namespace metamem
