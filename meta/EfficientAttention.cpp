#include "meta/EfficientAttention.h"

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>

#include "meta/CudaAttention.h"

namespace metamem {
namespace {

// One of cutlassB.h's backward kernels, as its template arguments and
// launch checks describe it. Only the aligned kernels: each list puts them
// first, and the launch check takes them for every input the unaligned
// ones take.
struct Kernel {
  bool dropout;            // kApplyDropout
  int block_i, block_j;    // kBlockSizeI (queries), kBlockSizeJ (keys)
  int max_k;               // kMaxK, the largest head size it takes
  bool seq_aligned;        // needs queries and keys whole blocks
  bool sm86_89_only = false;  // compiled in for compute capabilities 8.6 and 8.9 alone
  bool large_shared = false;  // more shared memory than sm86/89's 101,376 B (see below)
};

// The lists of cutlassB.h in order, for torch 2.14.1. Which blocks need more
// shared memory than an sm86 or sm89 GPU gives (101,376 B) was measured on
// the fake GPU, which runs torch's choice on the GPU's properties: the
// 16-bit kernels of 128 x 128 blocks and the f32 ones of 128 x 64; they fit
// in an A100's 166,912 B.
constexpr Kernel kHalfSm80[] = {
    {false, 64, 64, 32, true},    {false, 64, 64, 32, false},   {false, 64, 64, 64, true},
    {false, 64, 64, 64, false},   {false, 128, 64, 96, false, true},
    {false, 128, 128, 128, true, false, true},  {false, 128, 128, 128, false, false, true},
    {false, 64, 64, 128, true},   {false, 64, 64, 128, false},
    {false, 128, 64, 65536, false}, {false, 64, 64, 65536, false},
    {true, 64, 64, 32, false},    {true, 64, 64, 64, false},    {true, 128, 128, 128, false, false, true},
    {true, 64, 64, 128, false},   {true, 128, 64, 65536, false}, {true, 64, 64, 65536, false}};
constexpr Kernel kHalfSm75[] = {
    {false, 64, 64, 32, false},  {false, 64, 64, 64, false}, {false, 128, 64, 128, false},
    {false, 64, 64, 128, false}, {false, 128, 64, 65536, false}, {false, 64, 64, 65536, false},
    {true, 64, 64, 32, false},   {true, 64, 64, 64, false},  {true, 128, 64, 128, false},
    {true, 64, 64, 128, false},  {true, 128, 64, 65536, false}, {true, 64, 64, 65536, false}};
constexpr Kernel kHalfSm70[] = {
    {false, 64, 64, 32, true},    {false, 64, 64, 32, false},    {false, 64, 64, 64, true},
    {false, 64, 64, 64, false},   {false, 128, 64, 128, true},   {false, 128, 64, 128, false},
    {false, 64, 64, 128, true},   {false, 64, 64, 128, false},   {false, 128, 64, 65536, false},
    {false, 64, 64, 65536, false}, {true, 64, 64, 32, false},    {true, 64, 64, 64, false},
    {true, 128, 64, 128, false},  {true, 64, 64, 128, false},    {true, 128, 64, 65536, false},
    {true, 64, 64, 65536, false}};
constexpr Kernel kFloatSm80[] = {
    {false, 64, 64, 32, false},  {false, 64, 64, 64, false},
    {false, 128, 64, 128, false, false, true}, {false, 64, 64, 128, false},
    {false, 128, 64, 65536, false, false, true}, {false, 64, 64, 65536, false},
    {true, 64, 64, 32, false},   {true, 64, 64, 64, false},
    {true, 128, 64, 128, false, false, true}, {true, 64, 64, 128, false},
    {true, 128, 64, 65536, false, false, true}, {true, 64, 64, 65536, false}};
// f32 from sm50 to sm79 and f16 below sm70: 64 x 64 blocks only.
constexpr Kernel kSmall[] = {
    {false, 64, 64, 32, false},  {false, 64, 64, 64, false}, {false, 64, 64, 128, false},
    {false, 64, 64, 65536, false}, {true, 64, 64, 32, false}, {true, 64, 64, 64, false},
    {true, 64, 64, 128, false},  {true, 64, 64, 65536, false}};

// A list and the architecture its kernels are built for (their ArchTag:
// keys split across blocks from sm70).
struct KernelList {
  c10::ArrayRef<Kernel> kernels;
  int arch;
};

// dispatch_cutlassB's list for the dtype and compute capability (x10).
KernelList kernels_for(bool half, int cc) {
  if (half && cc >= 80) return {kHalfSm80, 80};
  if (half && cc >= 75) return {kHalfSm75, 75};
  if (half && cc >= 70) return {kHalfSm70, 70};
  if (!half && cc >= 80) return {kFloatSm80, 80};
  return {kSmall, cc >= 75 ? 75 : cc >= 70 ? 70 : 50};
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace

std::int64_t efficient_attention_forward_bytes(c10::ArrayRef<c10::IValue> arguments, c10::ArrayRef<c10::IValue>) {
  // (query, key, value, ...), each (batch, heads, seq, head_dim). Every
  // cutlassF list's kernels take 64 or 128 keys per block up to head size
  // 128, and 128 keys with any head size above.
  const at::Tensor& q = arguments[0].toTensor();
  const at::Tensor& v = arguments[2].toTensor();
  if (q.scalar_type() == at::kFloat || std::max(q.size(3), v.size(3)) <= 128) return 0;
  return q.size(0) * q.size(2) * q.size(1) * v.size(3) * 4;
}

ScratchPlan efficient_attention_backward_plan(c10::ArrayRef<c10::IValue> arguments) {
  // (grad_out, query, key, value, attn_bias, out, logsumexp, philox_seed,
  // philox_offset, dropout_p, ...), each (batch, heads, seq, head_dim).
  const at::Tensor& grad_out = arguments[0].toTensor();
  const at::Tensor& q = arguments[1].toTensor();
  const at::Tensor& k = arguments[2].toTensor();
  const at::Tensor& v = arguments[3].toTensor();
  const bool dropout = arguments[9].toDouble() != 0.0;
  const std::int64_t batch = q.size(0), heads = q.size(1), queries = q.size(2), keys = k.size(2);
  const std::int64_t head_dim = q.size(3), head_dim_v = v.size(3);
  const bool half = q.scalar_type() != at::kFloat;

  ScratchPlan plan;
  // The kernel reads the output's gradient as (batch, seq, heads, head_dim).
  if (!grad_out.transpose(1, 2).is_contiguous()) plan.make(static_cast<std::int64_t>(grad_out.nbytes()));
  plan.before_outputs = plan.steps.size();

  // With fewer key and value heads than query heads (grouped-query
  // attention), key and value are expanded to the query's heads after the
  // outputs are made, and held to the op's end (measured: real torch on
  // the fake GPU).
  for (const at::Tensor* kv : {&k, &v})
    if (kv->size(1) != heads) plan.make(kv->numel() / kv->size(1) * heads * kv->element_size());

  const GpuTraits gpu = traced_gpu();
  const int cc = gpu.major * 10 + gpu.minor;
  const auto [kernels, arch] = kernels_for(half, cc == 121 ? 120 : cc);
  const Kernel* chosen = nullptr;
  for (const Kernel& kernel : kernels) {
    if (kernel.max_k < std::max(head_dim, head_dim_v) || (dropout && !kernel.dropout)) continue;
    if (kernel.sm86_89_only && cc != 86 && cc != 89) continue;
    if (kernel.seq_aligned && (queries % kernel.block_i != 0 || keys % kernel.block_j != 0)) continue;
    if (kernel.large_shared && gpu.shared_memory_per_block_optin <= 101376) continue;
    chosen = &kernel;
    break;
  }
  TORCH_CHECK(chosen != nullptr, "memory-efficient attention backward: no kernel for head size ", head_dim,
              " on a ", gpu.major, ".", gpu.minor, " GPU (torch: \"cutlassB: no kernel found to launch!\")");
  const std::int64_t block_i = chosen->block_i, block_j = chosen->block_j;
  const bool in_registers = half && chosen->max_k <= block_i;  // kOutputInRF: dk, dv need no accumulator
  const bool split_keys = arch >= 70;

  // delta: 16-bit kernels compute it (but sm70's that keep dk and dv outside
  // their registers); otherwise (grad_out.float() * out.float()).sum(-1)
  // .transpose(-2, -1).contiguous(), its temporaries freed the last made
  // first. With one head (PVT v2's first stage) or one query the sum
  // transposed is contiguous already: it is delta.
  const std::int64_t rows = batch * heads * queries, delta_bytes = 4 * rows;
  std::size_t delta = 0;
  if (half && (in_registers || arch != 70)) {
    delta = plan.make(delta_bytes);
  } else {
    const std::int64_t widened = 4 * rows * head_dim_v;
    const std::optional<std::size_t> grad_float = half ? std::optional(plan.make(widened)) : std::nullopt;
    const std::optional<std::size_t> out_float = half ? std::optional(plan.make(widened)) : std::nullopt;
    const std::size_t product = plan.make(widened), sum = plan.make(delta_bytes);
    const bool transposed_in_place = heads == 1 || queries == 1;
    delta = transposed_in_place ? sum : plan.make(delta_bytes);
    if (!transposed_in_place) plan.free(sum);
    plan.free(product);
    for (const auto& piece : {out_float, grad_float})
      if (piece) plan.free(*piece);
  }

  // Keys split across thread blocks (torch's heuristic), each split with dk
  // and dv accumulators where the kernel needs them.
  const bool accumulates_kv = half && !in_registers;
  std::int64_t splits = ceil_div(keys, block_j);
  if (batch * heads >= 256 && keys <= 2 * block_j) splits = 1;
  if (accumulates_kv) splits = std::min<std::int64_t>(splits, 200 / (batch * heads));
  auto& context = at::globalContext();
  if (!split_keys || splits < 1 || (context.deterministicAlgorithms() && !context.deterministicAlgorithmsWarnOnly()))
    splits = 1;
  const std::int64_t dk = accumulates_kv ? splits * block_j * ceil_div(head_dim, block_i) * block_i : 0;
  const std::int64_t dv = accumulates_kv ? splits * block_j * ceil_div(head_dim_v, block_i) * block_i : 0;
  // dq: per query block and head_dim column block, a lock, a counter, two
  // pads and the block's fp32 tile.
  const std::int64_t dq = (split_keys || half)
                              ? ceil_div(queries, block_i) * ceil_div(head_dim, block_j) * (4 + block_i * block_j)
                              : 0;
  const std::int64_t per_head = ceil_div(dk + dv + dq, 4) * 4;
  plan.make(batch * heads * per_head * 4);
  plan.free(delta);  // delta lives in the launch; the workspace until the op returns
  return plan;
}

}  // namespace metamem
