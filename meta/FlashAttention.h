// FlashAttention-2 as a metamem op, so that a plan can be made for the
// kernel a GPU will run. metamem::flash_attention and its backward hold the
// memory of Dao's kernels (flash_api.cpp, mha_fwd and mha_bwd): no
// seq x seq scores; the output, an fp32 log-sum-exp per query row and the
// dropout RNG state are kept for backward, which holds fp32 accumulators for
// dq and the rows' dot products (and, for grouped-query heads, dk and dv per
// query head) beside its gradients. Meta kernels trace it on either fake
// device; a CPU kernel computes it for real with the same buffers, so that
// CPU parity checks the model.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <c10/util/SmallVector.h>

#include <cstdint>

namespace metamem {

// Attention of q (batch, seq_q, heads, head_dim) over k and v (batch, seq_k,
// kv_heads, head_dim), FlashAttention's layout, each with a contiguous last
// dimension; heads a multiple of kv_heads. A causal mask aligns to the
// bottom right, as FlashAttention's does. `scale` defaults to
// 1/sqrt(head_dim). Returns (batch, seq_q, heads, head_dim); differentiable
// in q, k and v. On a fake cuda device q, k and v must be f16 or bf16, as
// FlashAttention-2 requires.
at::Tensor flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           double dropout_p = 0.0, bool causal = false,
                           c10::optional<double> scale = c10::nullopt);

// What FlashAttention-2's backward (mha_bwd) allocates after dq, dk and
// dv, bytes in its order: the fp32 row dot products, the fp32 dq
// accumulator (rows rounded up to 128, head_dim to `head_dim_rounded`,
// which differs between FlashAttention's releases) and, when heads >
// kv_heads, dk and dv per query head.
c10::SmallVector<std::int64_t, 4> flash_attention_backward_scratch(std::int64_t batch, std::int64_t seq_q,
                                                                   std::int64_t seq_k, std::int64_t heads,
                                                                   std::int64_t kv_heads, std::int64_t head_dim,
                                                                   std::int64_t head_dim_rounded,
                                                                   std::int64_t element_size);

// Query-key pairs one (batch, head) of the attention scores: every key per
// query row, or under the causal mask only those each row may see.
std::int64_t flash_attention_scores(std::int64_t seq_q, std::int64_t seq_k, bool causal);

}  // namespace metamem
