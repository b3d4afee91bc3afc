#include "profiler/Flops.h"

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <unordered_map>

#include "meta/FlashAttention.h"

namespace metamem {
namespace {

const at::Tensor* tensor_at(c10::ArrayRef<c10::IValue> values, std::size_t i) {
  return i < values.size() && values[i].isTensor() ? &values[i].toTensor() : nullptr;
}

std::int64_t matmul_flops(c10::ArrayRef<c10::IValue> args, c10::ArrayRef<c10::IValue> returns,
                          std::size_t left) {
  const at::Tensor* a = tensor_at(args, left);
  const at::Tensor* out = tensor_at(returns, 0);
  if (a == nullptr || out == nullptr) return 0;
  return 2 * out->numel() * a->size(-1);
}

// Each element of the dense side (the output; the input when transposed)
// takes weight.size(1) * kernel multiply-adds: two FLOPs each.
std::int64_t conv_flops(const at::Tensor& output, const at::Tensor& input,
                        const at::Tensor& weight, bool transposed) {
  std::int64_t kernel = 1;
  for (std::int64_t d = 2; d < weight.dim(); ++d) kernel *= weight.size(d);
  return 2 * (transposed ? input : output).numel() * weight.size(1) * kernel;
}

std::int64_t first_tensor_numel(c10::ArrayRef<c10::IValue> values) {
  for (const auto& v : values)
    if (v.isTensor() && v.toTensor().defined()) return v.toTensor().numel();
  return 0;
}

// Scores a causal mask leaves seq_q queries over seq_k keys, aligned to the
// top left as SDPA's is_causal is: row i sees keys 0..i.
std::int64_t top_left_causal_scores(std::int64_t seq_q, std::int64_t seq_k) {
  const std::int64_t short_rows = std::min(seq_q, seq_k);
  return short_rows * (short_rows + 1) / 2 + (seq_q - short_rows) * seq_k;
}

// `per_score` FLOPs per head_dim for each score the attention computes.
std::int64_t attention_flops(const FlopRule& rule, c10::ArrayRef<c10::IValue> args, std::int64_t per_score) {
  const at::Tensor *q = tensor_at(args, rule.query_at), *k = tensor_at(args, rule.query_at + 1);
  if (q == nullptr || k == nullptr || q->dim() != 4 || rule.causal_at >= args.size()) return 0;
  const bool causal = args[rule.causal_at].toBool();
  const int heads_dim = rule.sdpa ? 1 : 2, seq_dim = rule.sdpa ? 2 : 1;
  const std::int64_t seq_q = q->size(seq_dim), seq_k = k->size(seq_dim);
  const std::int64_t scores = !causal ? seq_q * seq_k
                              : rule.sdpa ? top_left_causal_scores(seq_q, seq_k)
                                          : flash_attention_scores(seq_q, seq_k, true);
  return per_score * q->size(0) * q->size(heads_dim) * scores * q->size(3);
}

}  // namespace

FlopRule flop_rule(const std::string& qualified_name) {
  const std::string name = qualified_name.substr(0, qualified_name.find('.'));
  static const std::unordered_map<std::string, FlopRule> rules = {
      {"aten::mm", {FlopKind::MatMul}},
      {"aten::bmm", {FlopKind::MatMul}},
      {"aten::addmm", {FlopKind::AddMatMul}},
      {"aten::baddbmm", {FlopKind::AddMatMul}},
      {"aten::convolution", {FlopKind::Convolution}},
      {"aten::convolution_backward", {FlopKind::ConvBackward}},
      {"aten::native_batch_norm", {FlopKind::NormForward}},
      {"aten::native_batch_norm_backward", {FlopKind::NormBackward}},
      {"aten::native_layer_norm", {FlopKind::NormForward}},
      {"aten::native_layer_norm_backward", {FlopKind::NormBackward}},
      {"aten::_softmax", {FlopKind::Softmax}},
      {"aten::_softmax_backward_data", {FlopKind::Softmax}},
      {"aten::_log_softmax", {FlopKind::Softmax}},
      {"aten::_log_softmax_backward_data", {FlopKind::Softmax}},
      {"metamem::flash_attention", {FlopKind::Attention, 0, 4}},
      {"metamem::flash_attention_backward", {FlopKind::AttentionBackward, 1, 8}},
      // SDPA's kernels, as torch's scaled_dot_product_attention picks them.
      {"aten::_scaled_dot_product_flash_attention", {FlopKind::Attention, 0, 4, true}},
      {"aten::_scaled_dot_product_flash_attention_for_cpu", {FlopKind::Attention, 0, 4, true}},
      {"aten::_scaled_dot_product_efficient_attention", {FlopKind::Attention, 0, 6, true}},
      {"aten::_scaled_dot_product_cudnn_attention", {FlopKind::Attention, 0, 6, true}},
      {"aten::_scaled_dot_product_flash_attention_backward", {FlopKind::AttentionBackward, 1, 11, true}},
      {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", {FlopKind::AttentionBackward, 1, 7, true}},
      {"aten::_scaled_dot_product_efficient_attention_backward", {FlopKind::AttentionBackward, 1, 11, true}},
      {"aten::_scaled_dot_product_cudnn_attention_backward", {FlopKind::AttentionBackward, 1, 14, true}},
  };
  if (auto it = rules.find(name); it != rules.end()) return it->second;
  static const char* elementwise[] = {
      "aten::add", "aten::sub", "aten::mul", "aten::div", "aten::relu", "aten::gelu",
      "aten::threshold_backward", "aten::gelu_backward", "aten::native_dropout",
      "aten::native_dropout_backward", "aten::masked_fill", "aten::sum", "aten::mean",
      "aten::pow", "aten::sin", "aten::cos", "aten::exp", "aten::sqrt", "aten::rsqrt",
      "aten::max_pool2d_with_indices", "aten::max_pool2d_with_indices_backward",
      "aten::_adaptive_avg_pool2d", "aten::_adaptive_avg_pool2d_backward", "aten::lerp",
      "aten::addcmul", "aten::addcdiv", "aten::nll_loss_forward", "aten::nll_loss_backward",
      "aten::tanh", "aten::sigmoid", "aten::neg", "aten::clamp", "aten::bernoulli"};
  for (const char* prefix : elementwise) {
    const std::string p(prefix);
    if (qualified_name == p || qualified_name.rfind(p + ".", 0) == 0 || qualified_name.rfind(p + "_", 0) == 0)
      return {FlopKind::Elementwise};
  }
  return {};
}

std::int64_t count_flops(const FlopRule& rule, c10::ArrayRef<c10::IValue> args,
                         c10::ArrayRef<c10::IValue> returns) {
  switch (rule.kind) {
    case FlopKind::None:
      return 0;
    case FlopKind::MatMul:
      return matmul_flops(args, returns, 0);
    case FlopKind::AddMatMul:
      return matmul_flops(args, returns, 1);
    case FlopKind::Convolution: {
      const at::Tensor *input = tensor_at(args, 0), *weight = tensor_at(args, 1),
                       *out = tensor_at(returns, 0);
      if (!input || !weight || !out) return 0;
      return conv_flops(*out, *input, *weight, args[6].toBool());
    }
    case FlopKind::ConvBackward: {
      const at::Tensor *grad_out = tensor_at(args, 0), *input = tensor_at(args, 1),
                       *weight = tensor_at(args, 2);
      if (!grad_out || !input || !weight) return 0;
      const auto mask = args[10].toBoolList();
      const std::int64_t one = conv_flops(*grad_out, *input, *weight, args[7].toBool());
      return one * (mask[0] + mask[1]) + (mask[2] ? grad_out->numel() : 0);
    }
    case FlopKind::NormForward:
      return 5 * first_tensor_numel(args);
    case FlopKind::NormBackward:
      return 8 * first_tensor_numel(args);
    case FlopKind::Softmax:
      return 5 * first_tensor_numel(returns);
    case FlopKind::Elementwise:
      return first_tensor_numel(returns);
    case FlopKind::Attention:
      return attention_flops(rule, args, 4);
    case FlopKind::AttentionBackward:
      return attention_flops(rule, args, 10);
  }
  return 0;
}

}  // namespace metamem
