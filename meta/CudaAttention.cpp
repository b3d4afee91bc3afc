#include "meta/CudaAttention.h"
#include "meta/CudaKernelPlans.h"

#include <ATen/Context.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_permuted.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>
#include <c10/util/env.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <tuple>
#include <vector>
#include <utility>

#include "meta/CudaGraphCapture.h"
#include "meta/EfficientAttention.h"
#include "meta/FlashAttention.h"
#include "meta/OwnKernel.h"

namespace metamem {
namespace {

GpuTraits g_traced_gpu;

// The cuDNN that torch==2.14.1 installs (nvidia-cudnn-cu13==9.24.0.43), as
// versionRuntimeCuDNN() reports it: what cuDNN attention's constraints and
// the preference for it on Hopper and Blackwell depend on.
constexpr long kCudnnVersion = 92400;

// Whether the wheel's cuDNN frontend takes head_dim 256 (frontend 1.24 and
// newer; torch 2.14 bundles a newer one). Only head sizes above 128 on sm90
// and sm10x depend on it.
constexpr bool kCudnnFrontendTakesD256 = true;

// What cuDNN attention's execution plans take of their workspace beyond
// the buffers of the operation, forward and backward: 256 bytes on every
// shape measured (a real H200 with cuDNN 9.19, the fake GPU with 9.24).
constexpr std::int64_t kCudnnPlanBytes = 256;

bool at_least(GpuTraits gpu, int major, int minor) {
  return gpu.major > major || (gpu.major == major && gpu.minor >= minor);
}

bool within(GpuTraits gpu, GpuTraits low, GpuTraits high) {
  return at_least(gpu, low.major, low.minor) && !at_least(gpu, high.major, high.minor + 1);
}

bool low_precision(const sdp::sdp_params& p) {
  return p.query.scalar_type() == at::kHalf || p.query.scalar_type() == at::kBFloat16;
}

bool low_precision_dtypes(const sdp::sdp_params& p, GpuTraits gpu) {
  if (gpu.major >= 8) return sdp::check_tensor_dtype(p, std::array{at::kHalf, at::kBFloat16}, false);
  return sdp::check_tensor_dtype(p, std::array{at::kHalf}, false);
}

// The operands' alignment in elements CUTLASS's GEMMs need
// (minimum_gemm_alignment in sdp_utils.cpp).
std::int64_t gemm_alignment(const sdp::sdp_params& p, GpuTraits gpu) {
  const bool half = low_precision(p);
  const bool tensor_cores = gpu.major >= 8 || (gpu.major >= 7 && half);
  std::int64_t alignment = gpu.major >= 8 ? 4 : 1;
  if (tensor_cores) alignment = std::max<std::int64_t>(alignment, 128 / (half ? 16 : 32));
  return alignment;
}

bool dense_and_4d(const sdp::sdp_params& p) {
  return sdp::has_only_dense_inputs(p) && sdp::check_tensor_shapes(p, false) &&
         sdp::check_nonzero_sequence_lengths_dense(p, false);
}

bool can_use_flash(const sdp::sdp_params& p, GpuTraits gpu) {
  if (!sdp::check_runtime_disabled_flash(p, false) || !dense_and_4d(p) || !sdp::check_for_attn_mask(p, false))
    return false;
  const c10::SymInt d = p.query.sym_size(3);
  if (p.key.sym_size(3) != d || p.value.sym_size(3) != d || d > 256) return false;
  if (!within(gpu, {8, 0}, {12, 1})) return false;
  // Backward fails on sm86-89 and sm120-121 for some head sizes.
  if (sdp::input_requires_grad(p) && (within(gpu, {8, 6}, {8, 9}) || within(gpu, {12, 0}, {12, 1})) &&
      !(d <= 192 || (p.dropout == 0.0 && d > 224)))
    return false;
  if (p.is_causal && p.query.sym_size(2) != p.key.sym_size(2)) return false;
  return low_precision_dtypes(p, gpu) &&
         sdp::check_batch_size_and_num_heads_dense<true, true, true>(p, false) &&
         sdp::check_last_dim_stride_equals_1_dense<true>(p, false);
}

bool can_use_mem_efficient(const sdp::sdp_params& p, GpuTraits gpu) {
  if (!sdp::check_runtime_disabled_mem_efficient(p, false) || !within(gpu, {5, 0}, {12, 1}) || !dense_and_4d(p))
    return false;
  const std::int64_t alignment = gemm_alignment(p, gpu);
  const c10::SymInt d = p.query.sym_size(3), d_v = p.value.sym_size(3);
  if (p.key.sym_size(3) != d || d % alignment != 0 || d_v % alignment != 0) return false;
  if (gpu.major >= 8)
    for (const at::Tensor* t : {&p.query, &p.key, &p.value})
      if (t->sym_numel() != 0 && t->sym_storage_offset() % alignment != 0) return false;
  if (!sdp::check_last_dim_stride_equals_1_dense<false>(p, false) ||
      !sdp::check_batch_size_and_num_heads_dense<true, true, true>(p, false))
    return false;
  if (gpu.major >= 8) return sdp::check_tensor_dtype(p, std::array{at::kHalf, at::kFloat, at::kBFloat16}, false);
  return sdp::check_tensor_dtype(p, std::array{at::kHalf, at::kFloat}, false);
}

bool hopper_or_blackwell(GpuTraits gpu) { return (gpu.major == 9 && gpu.minor == 0) || gpu.major == 10; }

bool cudnn_takes_d256(GpuTraits gpu) {
  const bool sm107_too_old = gpu.major == 10 && gpu.minor == 7 && kCudnnVersion <= 92500;
  return hopper_or_blackwell(gpu) && !sm107_too_old && kCudnnVersion > 92200 && kCudnnFrontendTakesD256;
}

bool cudnn_shapes(const sdp::sdp_params& p, GpuTraits gpu) {
  constexpr std::int64_t kMaxDim = 65535;
  if (p.query.sym_size(0) > kMaxDim || p.query.sym_size(1) > kMaxDim) return false;
  const c10::SymInt s_q = p.query.sym_size(2), s_k = p.key.sym_size(2);
  const c10::SymInt d_qk = p.query.sym_size(3), d_v = p.value.sym_size(3);
  std::int64_t limit = 128;
  if (cudnn_takes_d256(gpu))
    limit = 256;
  else if (hopper_or_blackwell(gpu) && d_qk == 192 && d_v == 128)
    limit = 192;
  if (d_qk > limit || d_v > limit || d_qk % 8 != 0 || d_v % 8 != 0) return false;
  if (s_k == 1 || (p.dropout != 0.0 && s_q == 1)) return false;
  // Backward on sm90/sm10x takes only some head sizes.
  if (sdp::input_requires_grad(p) && cudnn_takes_d256(gpu))
    return (d_qk <= 128 && d_v <= 128) || (d_qk == 192 && d_v == 128) || (d_qk == 256 && d_v == 256);
  return true;
}

bool can_use_cudnn(const sdp::sdp_params& p, GpuTraits gpu) {
  auto& ctx = at::globalContext();
  if (!ctx.userEnabledCuDNNSDP() || !dense_and_4d(p)) return false;
  if (ctx.deterministicAlgorithms() && !ctx.deterministicAlgorithmsWarnOnly()) return false;
  if (!low_precision_dtypes(p, gpu) || !sdp::check_attn_mask_shape(p, false)) return false;
  if (!within(gpu, {8, 0}, {12, 1})) return false;
  if (p.dropout * 16.0 != static_cast<double>(static_cast<std::int64_t>(p.dropout * 16.0))) return false;
  return sdp::check_last_dim_stride_equals_1_dense<true>(p, false) &&
         sdp::check_batch_size_and_num_heads_dense<true, false, true>(p, false) && cudnn_shapes(p, gpu);
}

// torch's order unless the user set one: on Hopper and Blackwell with
// cuDNN newer than 9.15 torch puts cuDNN first at its first SDPA call.
std::array<at::SDPBackend, at::num_sdp_backends> priority_order(GpuTraits gpu) {
  auto order = at::globalContext().sDPPriorityOrder();
  constexpr std::array<at::SDPBackend, at::num_sdp_backends> kDefault{
      at::SDPBackend::flash_attention, at::SDPBackend::efficient_attention, at::SDPBackend::math,
      at::SDPBackend::cudnn_attention, at::SDPBackend::overrideable};
  const bool deprioritized = c10::utils::check_env("TORCH_CUDNN_SDPA_DEPRIORITIZED") == true;
  if (order == kDefault && !deprioritized && kCudnnVersion > 91500 && (gpu.major == 9 || gpu.major == 10))
    order = {at::SDPBackend::cudnn_attention, at::SDPBackend::flash_attention, at::SDPBackend::efficient_attention,
             at::SDPBackend::math, at::SDPBackend::overrideable};
  return order;
}

std::int64_t traced_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                           const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                           std::optional<double>, bool enable_gqa) {
  const sdp::sdp_params p{query, key, value, attn_mask, dropout_p, is_causal, enable_gqa};
  const GpuTraits gpu = g_traced_gpu;
  auto& ctx = at::globalContext();
  for (const at::SDPBackend backend : priority_order(gpu)) {
    switch (backend) {
      case at::SDPBackend::cudnn_attention:
        if (can_use_cudnn(p, gpu)) return static_cast<std::int64_t>(backend);
        break;
      case at::SDPBackend::flash_attention:
        if (can_use_flash(p, gpu)) return static_cast<std::int64_t>(backend);
        break;
      case at::SDPBackend::efficient_attention:
        if (can_use_mem_efficient(p, gpu)) return static_cast<std::int64_t>(backend);
        break;
      case at::SDPBackend::math:
        if (ctx.userEnabledMathSDP()) return static_cast<std::int64_t>(backend);
        break;
      default:
        break;
    }
  }
  TORCH_CHECK(false, "scaled_dot_product_attention: no backend enabled in torch.backends.cuda runs these inputs on a ",
              gpu.major, ".", gpu.minor, " GPU (torch: \"No available kernel. Aborting execution.\")");
}

// The DispatchStub's only member is its table, whose CUDA slot is public:
// reading it is the one way to put the previous choice back.
at::native::DispatchStubImpl& choice_table() {
  static_assert(sizeof(at::native::_fused_sdp_choice_stub) == sizeof(at::native::DispatchStubImpl));
  return *reinterpret_cast<at::native::DispatchStubImpl*>(&at::native::_fused_sdp_choice_stub);
}

std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

// PyTorch's flash backward (_flash_attention_backward, mha_bwd) on (batch,
// heads, seq, head_dim) operands: before the gradients, the output's
// gradient and the output made contiguous in the kernel's (batch, seq,
// heads, head_dim) layout; after them, mha_bwd's buffers with head_dim
// rounded to 32 up to 128 and to 64 above. Each is a block of its own in a
// real run, and their order decides where the allocator splits segments.
ScratchPlan flash_backward_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& q = arguments[1].toTensor();
  const at::Tensor& k = arguments[2].toTensor();
  ScratchPlan plan;
  for (const at::Tensor& t : {arguments[0].toTensor(), arguments[4].toTensor()})
    if (!t.transpose(1, 2).is_contiguous()) plan.make(static_cast<std::int64_t>(t.nbytes()));
  plan.before_outputs = plan.steps.size();
  const std::int64_t head_dim = q.size(3);
  const std::int64_t padded = round_up(head_dim, 8);
  for (const std::int64_t bytes : flash_attention_backward_scratch(q.size(0), q.size(2), k.size(2), q.size(1),
                                                                   k.size(1), head_dim,
                                                                   round_up(padded, padded <= 128 ? 32 : 64),
                                                                   q.element_size()))
    plan.make(bytes);
  return plan;
}

// cuDNN's SDPA backward, after the gradients: PyTorch's copy of the
// output's gradient into the output's layout where the two differ, then
// the execution plan's workspace (cudnn-frontend's
// CompositeSDPABackwardNode): an fp32 softmax sum per query row and an fp32
// dq accumulator, with grouped heads dk and dv per query head, and 256
// bytes of the plan's own, as in the forward (measured: real torch with
// cuDNN 9 on the fake GPU, and a real H200).
ScratchPlan cudnn_backward_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& grad_out = arguments[0].toTensor();
  const at::Tensor& q = arguments[1].toTensor();
  const at::Tensor& k = arguments[2].toTensor();
  const at::Tensor& v = arguments[3].toTensor();
  const at::Tensor& out = arguments[4].toTensor();
  const std::int64_t b = q.size(0), h_q = q.size(1), s_q = q.size(2), s_kv = k.size(2);
  std::int64_t workspace = b * h_q * s_q * 4 + b * h_q * s_q * q.size(3) * 4 + kCudnnPlanBytes;
  if (k.size(1) != h_q) workspace += b * h_q * s_kv * k.size(3) * k.element_size();
  if (v.size(1) != h_q) workspace += b * h_q * s_kv * v.size(3) * v.element_size();
  ScratchPlan plan;
  for (std::size_t gradient = 0; gradient < 3; ++gradient) plan.output(gradient);
  if (grad_out.strides() != out.strides()) plan.make(static_cast<std::int64_t>(grad_out.nbytes()));
  plan.free(plan.make(workspace));
  return plan;
}

// cuDNN's forward: after its outputs, the execution plan's workspace.
std::int64_t cudnn_forward_bytes(c10::ArrayRef<c10::IValue>, c10::ArrayRef<c10::IValue>) { return kCudnnPlanBytes; }

// FlashAttention's forward with dropout: after its outputs, a 16-byte
// temporary beside the RNG state it keeps (measured: real torch on the fake
// GPU, an A100).
std::int64_t flash_forward_bytes(c10::ArrayRef<c10::IValue> arguments, c10::ArrayRef<c10::IValue>) {
  return arguments[3].toDouble() > 0.0 ? 16 : 0;
}

using at::Tensor;
using FusedOutputs = std::tuple<Tensor, Tensor, Tensor, Tensor, c10::SymInt, c10::SymInt, Tensor, Tensor, Tensor>;
using Gradients = std::tuple<Tensor, Tensor, Tensor>;

// A result of `shape` whose dimensions lie in memory in the order of
// `like`'s (cuDNN's alloc_with_matching_layout).
Tensor empty_in_layout_of(const Tensor& like, at::IntArrayRef shape) {
  if (like.sizes() == shape) return at::empty_like(like);
  std::array<std::int64_t, 4> order{0, 1, 2, 3}, strides{};
  std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return like.stride(a) > like.stride(b); });
  std::int64_t stride = 1;
  for (auto dim = order.rbegin(); dim != order.rend(); ++dim) {
    strides[*dim] = stride;
    stride *= shape[*dim];
  }
  return at::empty_strided(shape, strides, like.options());
}

// The kernels' outputs as the CUDA kernels make them (PyTorch's
// attention.cu and its meta functions): FlashAttention's output in q's
// layout, its fp32 log-sum-exp and its RNG state on the device.
FusedOutputs flash_forward(const Tensor& q, const Tensor& k, const Tensor&, double, bool, bool return_debug_mask,
                           std::optional<double>) {
  const std::int64_t b = q.size(0), h = q.size(1), s_q = q.size(2), s_k = k.size(2);
  Tensor debug_mask = at::empty({0}, q.options());
  if (return_debug_mask) {
    const std::int64_t block = q.size(3) > 64 ? 128 : 256;
    std::int64_t columns = (s_q + block - 1) / block;
    if (s_k <= 128) columns = 128; else if (s_k <= 256) columns = 256;
    debug_mask = at::empty({b, h, s_q, columns}, q.options());
  }
  return {at::empty_like(q), at::empty({b, h, s_q}, q.options().dtype(at::kFloat)), Tensor(), Tensor(),
          c10::SymInt(s_q), c10::SymInt(s_k), at::empty({2}, q.options().dtype(at::kUInt64)),
          at::empty({}, q.options().dtype(at::kUInt64)), debug_mask};
}

Gradients flash_backward(const Tensor&, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor&,
                         const Tensor&, const Tensor&, const Tensor&, c10::SymInt, c10::SymInt, double, bool,
                         const Tensor&, const Tensor&, std::optional<double>) {
  return {at::empty_like(q), at::empty_like(k), at::empty_like(v)};
}

// The memory-efficient kernel writes (batch, seq, heads, head_dim) and pads
// its log-sum-exp rows to 32. Its Philox seed and offset come first: on
// the device without dropout, or with it while a CUDA graph is captured;
// else host scalars (as real CPU tensors, which a trace does not count).
std::tuple<Tensor, Tensor, Tensor, Tensor> efficient_forward(const Tensor& q, const Tensor&, const Tensor& v,
                                                             const std::optional<Tensor>&, bool compute_log_sumexp,
                                                             double dropout_p, bool, std::optional<double>) {
  const std::int64_t b = q.size(0), h = q.size(1), s_q = q.size(2);
  const bool on_host = dropout_p > 0.0 && !graph_capture_underway();
  const at::TensorOptions rng = on_host ? at::TensorOptions(at::kCPU).dtype(at::kLong) : q.options().dtype(at::kLong);
  Tensor seed = at::zeros({}, rng), offset = at::zeros({}, rng);
  Tensor out = at::empty({b, s_q, h, v.size(3)}, q.options()).transpose(1, 2);
  return {std::move(out),
          at::empty({b, h, compute_log_sumexp ? round_up(s_q, 32) : 0}, q.options().dtype(at::kFloat)),
          std::move(seed), std::move(offset)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> efficient_backward(const Tensor&, const Tensor& q, const Tensor& k,
                                                              const Tensor& v, const Tensor& attn_bias,
                                                              const Tensor&, const Tensor&, const Tensor&,
                                                              const Tensor&, double, std::array<bool, 4> grad_input,
                                                              bool, std::optional<double>) {
  auto gradient = [](const Tensor& t) { return at::empty_permuted(t.sizes(), {0, 2, 1, 3}, t.options()); };
  Tensor grad_bias;
  if (attn_bias.defined() && grad_input[3]) {
    std::vector<std::int64_t> sizes = attn_bias.sizes().vec();
    const std::int64_t last = sizes.back();
    sizes.back() = round_up(last, 16);
    grad_bias = at::empty(sizes, attn_bias.options()).narrow(-1, 0, last);
  }
  return {gradient(q), gradient(k), gradient(v), grad_bias};
}

// cuDNN's output in q's order of dimensions, its fp32 softmax statistics
// and its Philox seed and offset on the device (made first: MetaMode's
// allocation orders).
FusedOutputs cudnn_forward(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>&,
                           bool compute_log_sumexp, double, bool, bool, std::optional<double>) {
  const std::int64_t b = q.size(0), h = q.size(1), s_q = q.size(2);
  return {empty_in_layout_of(q, {b, h, s_q, v.size(3)}),
          compute_log_sumexp ? at::empty({b, h, s_q, 1}, q.options().dtype(at::kFloat)) : Tensor(),
          Tensor(), Tensor(), c10::SymInt(s_q), c10::SymInt(k.size(2)),
          at::empty({}, q.options().dtype(at::kLong)), at::empty({}, q.options().dtype(at::kLong)), Tensor()};
}

Gradients cudnn_backward(const Tensor&, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor&,
                         const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         c10::SymInt, c10::SymInt, double, bool, std::optional<double>) {
  return {at::empty_like(q), at::empty_like(k), at::empty_like(v)};
}

}  // namespace

GpuTraits traced_gpu() { return g_traced_gpu; }

TracedGpuScope::TracedGpuScope(GpuTraits gpu) : previous_(g_traced_gpu) { g_traced_gpu = gpu; }

TracedGpuScope::~TracedGpuScope() { g_traced_gpu = previous_; }

void* install_sdpa_choice() {
  return std::exchange(choice_table().cuda_dispatch_ptr, reinterpret_cast<void*>(&traced_choice));
}

void restore_sdpa_choice(void* previous) { choice_table().cuda_dispatch_ptr = previous; }

std::vector<OwnKernelEntry> cuda_attention_kernels() {
  return {own("_scaled_dot_product_flash_attention", TORCH_FN(flash_forward)),
          own("_scaled_dot_product_flash_attention_backward", TORCH_FN(flash_backward)),
          own("_scaled_dot_product_efficient_attention", TORCH_FN(efficient_forward)),
          own("_scaled_dot_product_efficient_attention_backward", TORCH_FN(efficient_backward)),
          own("_scaled_dot_product_cudnn_attention", TORCH_FN(cudnn_forward)),
          own("_scaled_dot_product_cudnn_attention_backward", TORCH_FN(cudnn_backward))};
}

ScratchModel cuda_scratch_model(const std::string& qualified_name) {
  if (qualified_name == "aten::_scaled_dot_product_efficient_attention") return &efficient_attention_forward_bytes;
  if (qualified_name == "aten::_scaled_dot_product_flash_attention") return &flash_forward_bytes;
  if (qualified_name == "aten::_scaled_dot_product_cudnn_attention") return &cudnn_forward_bytes;
  return nullptr;
}

ScratchPlanModel cuda_attention_plan_model(const std::string& qualified_name) {
  if (qualified_name == "aten::_scaled_dot_product_efficient_attention_backward")
    return &efficient_attention_backward_plan;
  if (qualified_name == "aten::_scaled_dot_product_cudnn_attention_backward") return &cudnn_backward_plan;
  return qualified_name == "aten::_scaled_dot_product_flash_attention_backward" ? &flash_backward_plan : nullptr;
}

}  // namespace metamem
