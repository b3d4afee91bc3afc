// Llama (Hugging Face's LlamaForCausalLM layout): token embeddings, pre-norm
// blocks of RMSNorm, causal self-attention with rotary position embeddings
// and grouped-query heads, and a SwiGLU MLP; a final RMSNorm and an untied
// LM head; no biases, no dropout; cross-entropy.
#include <torch/nn/functional/activation.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include <cmath>
#include <string>

#include "examples/zoo/Transformer.h"
#include "meta/FlashAttention.h"
#include "profiler/Checkpoint.h"
#include "profiler/Tracer.h"

namespace metamem {
namespace {

namespace nn = torch::nn;

nn::Linear projection(std::int64_t in, std::int64_t out) {
  return nn::Linear(nn::LinearOptions(in, out).bias(false));
}

// x / rms(x) in fp32, back in x's dtype, times the weight.
class RmsNorm : public nn::Module {
 public:
  explicit RmsNorm(std::int64_t width) : weight_(register_parameter("weight", torch::ones({width}))) {}
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor x32 = x.to(at::kFloat);
    const at::Tensor normalized = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + 1e-6);
    return weight_ * normalized.to(x.scalar_type());
  }

 private:
  at::Tensor weight_;
};

// Rotary position embedding: x·cos plus x's halves swapped, the first
// negated, times sin (cos and sin broadcast over x's heads).
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const std::int64_t half = x.size(-1) / 2;
  const at::Tensor turned = x * cos;
  return turned + torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1) * sin;
}

class Block : public nn::Module {
 public:
  Block(const ZooConfig& c, const TensorParallelRank& tp)
      : tp_(tp),
        heads_(tp.shard(c.heads)),
        kv_heads_(tp.shard(c.kv_heads)),
        flash_(c.flash_attention),
        selective_recompute_(c.selective_recompute),
        head_dim_(c.width / c.heads),
        input_norm_(register_module("input_layernorm", std::make_shared<RmsNorm>(c.width))),
        q_(register_module("q_proj", projection(c.width, heads_ * head_dim_))),
        k_(register_module("k_proj", projection(c.width, kv_heads_ * head_dim_))),
        v_(register_module("v_proj", projection(c.width, kv_heads_ * head_dim_))),
        o_(register_module("o_proj", projection(heads_ * head_dim_, c.width))),
        post_norm_(register_module("post_attention_layernorm", std::make_shared<RmsNorm>(c.width))),
        gate_(register_module("gate_proj", projection(c.width, tp.shard(c.ffn)))),
        up_(register_module("up_proj", projection(c.width, tp.shard(c.ffn)))),
        down_(register_module("down_proj", projection(tp.shard(c.ffn), c.width))) {}

  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& causal_mask) {
    at::Tensor h = x + scoped("self_attn", [&] {
                     return attention(scoped("input_layernorm", [&] { return input_norm_->forward(x); }), cos,
                                      sin, causal_mask);
                   });
    return h + scoped("mlp", [&] {
             const at::Tensor y = scoped("post_attention_layernorm", [&] { return post_norm_->forward(h); });
             const at::Tensor gate = scoped("gate_proj", [&] { return tp_.column_linear(y, gate_->weight); });
             const at::Tensor up = scoped("up_proj", [&] { return tp_.column_linear(y, up_->weight); });
             return scoped("down_proj",
                           [&] { return tp_.row_linear(nn::functional::silu(gate) * up, down_->weight); });
           });
  }

 private:
  // The rank's heads; under sequence parallelism x is the rank's chunk of
  // the sequence and each projection gathers the rest.
  at::Tensor attention(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       const at::Tensor& causal_mask) {
    auto heads = [&](const nn::Linear& layer, const char* name, std::int64_t count) {
      const at::Tensor y = scoped(name, [&] { return tp_.column_linear(x, layer->weight); });
      return y.view({y.size(0), y.size(1), count, head_dim_});
    };
    const at::Tensor q = heads(q_, "q_proj", heads_), k = heads(k_, "k_proj", kv_heads_),
                     v = heads(v_, "v_proj", kv_heads_);
    const at::Tensor y = flash_ ? flash(q, k, v, cos, sin) : math(q, k, v, cos, sin, causal_mask);
    return scoped("o_proj",
                  [&] { return tp_.row_linear(y.view({q.size(0), q.size(1), heads_ * head_dim_}), o_->weight); });
  }

  // Rotary embeddings, then the core attention (recomputed in backward
  // under selective recompute); returns batch x seq x heads x head_dim.
  at::Tensor math(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
                  const at::Tensor& sin, const at::Tensor& causal_mask) {
    const SegmentFn core = [this, causal_mask](const std::vector<at::Tensor>& qkv) {
      return std::vector<at::Tensor>{core_attention(qkv[0], qkv[1], qkv[2], causal_mask)};
    };
    const std::vector<at::Tensor> qkv = {rotate(q.transpose(1, 2), cos, sin), rotate(k.transpose(1, 2), cos, sin),
                                         v.transpose(1, 2)};
    return (selective_recompute_ ? checkpoint(core, qkv) : core(qkv))[0];
  }

  // Scores and probabilities per head, batch x heads x seq x seq, from
  // rotated q and k and v, batch x heads x seq x head_dim.
  at::Tensor core_attention(const at::Tensor& q, at::Tensor k, at::Tensor v, const at::Tensor& causal_mask) {
    const std::int64_t batch = q.size(0), seq = q.size(2);
    // Grouped-query attention: each key/value head serves heads / kv_heads query heads.
    auto repeat = [&](const at::Tensor& t) {
      if (kv_heads_ == heads_) return t;
      return t.unsqueeze(2)
          .expand({batch, kv_heads_, heads_ / kv_heads_, seq, head_dim_})
          .reshape({batch, heads_, seq, head_dim_});
    };
    k = repeat(k);
    v = repeat(v);
    at::Tensor scores = torch::matmul(q, k.transpose(2, 3)) / std::sqrt(static_cast<double>(head_dim_));
    scores = scores.masked_fill(causal_mask, -INFINITY);
    const at::Tensor probs = torch::softmax(scores, -1, at::kFloat).to(q.scalar_type());
    return torch::matmul(probs, v).transpose(1, 2).contiguous();
  }

  // FlashAttention-2 takes grouped key/value heads as they are. Rotary
  // embedding's fp32 tables promote q and k; like Hugging Face's flash path,
  // they go back to v's dtype (the autocast dtype under autocast).
  at::Tensor flash(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
                   const at::Tensor& sin) {
    const at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);  // seq x 1 x head_dim: over heads
    return flash_attention(rotate(q, c, s).to(v.scalar_type()), rotate(k, c, s).to(v.scalar_type()), v, 0.0,
                           /*causal=*/true);
  }

  const TensorParallelRank& tp_;
  std::int64_t heads_, kv_heads_;
  bool flash_, selective_recompute_;
  std::int64_t head_dim_;
  std::shared_ptr<RmsNorm> input_norm_;
  nn::Linear q_, k_, v_, o_;
  std::shared_ptr<RmsNorm> post_norm_;
  nn::Linear gate_, up_, down_;
};

class LlamaStep final : public TransformerStep {
 public:
  explicit LlamaStep(const ZooConfig& c) : TransformerStep("Llama", c) {
    if (stage_.first()) embed_ = register_module("embed_tokens", nn::Embedding(tp_.vocab_rows(c.vocab), c.width));
    if (stage_.last()) {
      norm_ = register_module("norm", std::make_shared<RmsNorm>(c.width));
      lm_head_ = register_module("lm_head", projection(c.width, tp_.vocab_rows(c.vocab)));
    }
    for (std::int64_t i = first_layer_; i < end_layer_; ++i) {
      auto block = std::make_shared<Block>(c, tp_);
      add_block("layers", i, block,
                [this, block](const at::Tensor& x) { return block->forward(x, cos_, sin_, causal_mask_); });
    }
    // Rotary tables, seq x head_dim: each pair of dimensions turns at its own frequency.
    const std::int64_t head_dim = c.width / c.heads;
    const at::Tensor frequencies =
        1.0 / torch::pow(10000.0, torch::arange(0, head_dim, 2, torch::kFloat) / static_cast<double>(head_dim));
    const at::Tensor angles = torch::outer(torch::arange(c.seq, torch::kFloat), frequencies);
    const at::Tensor table = torch::cat({angles, angles}, -1);
    cos_ = register_buffer("cos", table.cos().to(c.dtype));
    sin_ = register_buffer("sin", table.sin().to(c.dtype));
  }

 private:
  at::Tensor embed() override {
    return scoped("embed_tokens", [&] { return tp_.sequence_chunk(tp_.embedding(tokens_, embed_->weight)); });
  }

  at::Tensor head(const at::Tensor& x) override {
    const at::Tensor y = scoped("norm", [&] { return norm_->forward(x); });
    return scoped("lm_head", [&] { return tp_.column_linear(y, lm_head_->weight); });
  }

  nn::Embedding embed_{nullptr};
  std::shared_ptr<RmsNorm> norm_;
  nn::Linear lm_head_{nullptr};
  at::Tensor cos_, sin_;
};

}  // namespace

StepBuilder llama_step(const ZooConfig& config) {
  return [config] { return std::make_unique<LlamaStep>(config); };
}

}  // namespace metamem
