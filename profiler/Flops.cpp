#include "profiler/Flops.h"

#include <ATen/core/Tensor.h>

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

// `per_score` FLOPs per head_dim for each score the attention computes.
std::int64_t attention_flops(c10::ArrayRef<c10::IValue> args, std::size_t q_at, std::size_t causal_at,
                             std::int64_t per_score) {
  const at::Tensor *q = tensor_at(args, q_at), *k = tensor_at(args, q_at + 1);
  if (q == nullptr || k == nullptr || causal_at >= args.size()) return 0;
  const std::int64_t scores = flash_attention_scores(q->size(1), k->size(1), args[causal_at].toBool());
  return per_score * q->size(0) * q->size(2) * scores * q->size(3);
}

}  // namespace

FlopRule flop_rule(const std::string& name) {
  static const std::unordered_map<std::string, FlopRule> rules = {
      {"aten::mm", FlopRule::MatMul},
      {"aten::bmm", FlopRule::MatMul},
      {"aten::addmm", FlopRule::MatMul},
      {"aten::baddbmm", FlopRule::MatMul},
      {"aten::convolution", FlopRule::Convolution},
      {"aten::convolution_backward", FlopRule::ConvBackward},
      {"aten::native_batch_norm", FlopRule::NormForward},
      {"aten::native_batch_norm_backward", FlopRule::NormBackward},
      {"aten::native_layer_norm", FlopRule::NormForward},
      {"aten::native_layer_norm_backward", FlopRule::NormBackward},
      {"aten::_softmax", FlopRule::Softmax},
      {"aten::_softmax_backward_data", FlopRule::Softmax},
      {"aten::_log_softmax", FlopRule::Softmax},
      {"aten::_log_softmax_backward_data", FlopRule::Softmax},
      {"metamem::flash_attention", FlopRule::Attention},
      {"metamem::flash_attention_backward", FlopRule::AttentionBackward},
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
    if (name == p || name.rfind(p + ".", 0) == 0 || name.rfind(p + "_", 0) == 0)
      return FlopRule::Elementwise;
  }
  return FlopRule::None;
}

std::int64_t count_flops(FlopRule rule, c10::ArrayRef<c10::IValue> args,
                         c10::ArrayRef<c10::IValue> returns) {
  switch (rule) {
    case FlopRule::None:
      return 0;
    case FlopRule::MatMul:  // addmm/baddbmm take the added tensor first
      return matmul_flops(args, returns, args.size() >= 3 && tensor_at(args, 2) ? 1 : 0);
    case FlopRule::Convolution: {
      const at::Tensor *input = tensor_at(args, 0), *weight = tensor_at(args, 1),
                       *out = tensor_at(returns, 0);
      if (!input || !weight || !out) return 0;
      return conv_flops(*out, *input, *weight, args[6].toBool());
    }
    case FlopRule::ConvBackward: {
      const at::Tensor *grad_out = tensor_at(args, 0), *input = tensor_at(args, 1),
                       *weight = tensor_at(args, 2);
      if (!grad_out || !input || !weight) return 0;
      const auto mask = args[10].toBoolList();
      const std::int64_t one = conv_flops(*grad_out, *input, *weight, args[7].toBool());
      return one * (mask[0] + mask[1]) + (mask[2] ? grad_out->numel() : 0);
    }
    case FlopRule::NormForward:
      return 5 * first_tensor_numel(args);
    case FlopRule::NormBackward:
      return 8 * first_tensor_numel(args);
    case FlopRule::Softmax:
      return 5 * first_tensor_numel(returns);
    case FlopRule::Elementwise:
      return first_tensor_numel(returns);
    case FlopRule::Attention:
      return attention_flops(args, 0, 4, 4);
    case FlopRule::AttentionBackward:
      return attention_flops(args, 1, 8, 10);
  }
  return 0;
}

}  // namespace metamem
