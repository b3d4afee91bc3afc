// Llama (Hugging Face's LlamaForCausalLM layout): token embeddings, pre-norm
// blocks of RMSNorm, causal self-attention with rotary position embeddings
// and grouped-query heads, and a SwiGLU MLP; a final RMSNorm and an untied
// LM head; no biases, no dropout; cross-entropy.
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include <cmath>
#include <string>

#include "examples/zoo/Models.h"
#include "meta/FlashAttention.h"
#include "profiler/Tracer.h"

namespace metamem {
namespace {

namespace nn = torch::nn;

nn::Linear projection(std::int64_t in, std::int64_t out) {
  return nn::Linear(nn::LinearOptions(in, out).bias(false));
}

at::Tensor linear(const nn::Linear& layer, const at::Tensor& x) { return torch::matmul(x, layer->weight.t()); }

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
  explicit Block(const ZooConfig& c)
      : heads_(c.heads),
        kv_heads_(c.kv_heads),
        flash_(c.flash_attention),
        head_dim_(c.width / c.heads),
        input_norm_(register_module("input_layernorm", std::make_shared<RmsNorm>(c.width))),
        q_(register_module("q_proj", projection(c.width, c.width))),
        k_(register_module("k_proj", projection(c.width, c.kv_heads * (c.width / c.heads)))),
        v_(register_module("v_proj", projection(c.width, c.kv_heads * (c.width / c.heads)))),
        o_(register_module("o_proj", projection(c.width, c.width))),
        post_norm_(register_module("post_attention_layernorm", std::make_shared<RmsNorm>(c.width))),
        gate_(register_module("gate_proj", projection(c.width, c.ffn))),
        up_(register_module("up_proj", projection(c.width, c.ffn))),
        down_(register_module("down_proj", projection(c.ffn, c.width))) {}

  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& causal_mask) {
    at::Tensor h = x + scoped("self_attn", [&] {
                     return attention(scoped("input_layernorm", [&] { return input_norm_->forward(x); }), cos,
                                      sin, causal_mask);
                   });
    return h + scoped("mlp", [&] {
             const at::Tensor y = scoped("post_attention_layernorm", [&] { return post_norm_->forward(h); });
             const at::Tensor gate = scoped("gate_proj", [&] { return linear(gate_, y); });
             const at::Tensor up = scoped("up_proj", [&] { return linear(up_, y); });
             return scoped("down_proj", [&] { return linear(down_, nn::functional::silu(gate) * up); });
           });
  }

 private:
  at::Tensor attention(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       const at::Tensor& causal_mask) {
    const std::int64_t batch = x.size(0), seq = x.size(1);
    auto heads = [&](const nn::Linear& layer, const char* name, std::int64_t count) {
      return scoped(name, [&] { return linear(layer, x); }).view({batch, seq, count, head_dim_});
    };
    const at::Tensor q = heads(q_, "q_proj", heads_), k = heads(k_, "k_proj", kv_heads_),
                     v = heads(v_, "v_proj", kv_heads_);
    const at::Tensor y = flash_ ? flash(q, k, v, cos, sin) : math(q, k, v, cos, sin, causal_mask);
    return scoped("o_proj", [&] { return linear(o_, y.reshape({batch, seq, heads_ * head_dim_})); });
  }

  // Scores and probabilities per head, batch x heads x seq x seq; returns
  // batch x seq x heads x head_dim.
  at::Tensor math(at::Tensor q, at::Tensor k, at::Tensor v, const at::Tensor& cos, const at::Tensor& sin,
                  const at::Tensor& causal_mask) {
    const std::int64_t batch = q.size(0), seq = q.size(1);
    q = rotate(q.transpose(1, 2), cos, sin);
    k = rotate(k.transpose(1, 2), cos, sin);
    v = v.transpose(1, 2);
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
    return torch::matmul(probs, v).transpose(1, 2);
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

  std::int64_t heads_, kv_heads_;
  bool flash_;
  std::int64_t head_dim_;
  std::shared_ptr<RmsNorm> input_norm_;
  nn::Linear q_, k_, v_, o_;
  std::shared_ptr<RmsNorm> post_norm_;
  nn::Linear gate_, up_, down_;
};

class LlamaStep final : public TrainingStep, public nn::Module {
 public:
  LlamaStep(const ZooConfig& c, std::int64_t batch)
      : checkpoint_(c.checkpoint),
        embed_(register_module("embed_tokens", nn::Embedding(c.vocab, c.width))),
        norm_(register_module("norm", std::make_shared<RmsNorm>(c.width))),
        lm_head_(register_module("lm_head", projection(c.width, c.vocab))) {
    for (std::int64_t i = 0; i < c.layers; ++i) {
      blocks_.push_back(register_module("layers_" + std::to_string(i), std::make_shared<Block>(c)));
      units_.push_back({{"layers", std::to_string(i)}, [this, block = blocks_.back()](const at::Tensor& x) {
                          return block->forward(x, cos_, sin_, causal_mask_);
                        }});
    }
    // Rotary tables, seq x head_dim: each pair of dimensions turns at its own frequency.
    const std::int64_t head_dim = c.width / c.heads;
    const at::Tensor frequencies =
        1.0 / torch::pow(10000.0, torch::arange(0, head_dim, 2, torch::kFloat) / static_cast<double>(head_dim));
    const at::Tensor angles = torch::outer(torch::arange(c.seq, torch::kFloat), frequencies);
    const at::Tensor table = torch::cat({angles, angles}, -1);
    cos_ = register_buffer("cos", table.cos());
    sin_ = register_buffer("sin", table.sin());
    causal_mask_ = register_buffer(
        "causal_mask", torch::ones({c.seq, c.seq}, torch::kBool).triu(1).view({1, 1, c.seq, c.seq}));
    tokens_ = torch::zeros({batch, c.seq}, torch::kLong);
    targets_ = torch::zeros({batch * c.seq}, torch::kLong);
    cast_floating(*this, c.dtype);
  }

  std::vector<at::Tensor> parameters() override { return Module::parameters(); }

  at::Tensor forward_loss() override {
    ModuleScope root("Llama");
    at::Tensor x = scoped("embed_tokens", [&] { return embed_->forward(tokens_); });
    x = run_chain(units_, std::move(x), checkpoint_);
    x = scoped("norm", [&] { return norm_->forward(x); });
    const at::Tensor logits = scoped("lm_head", [&] { return linear(lm_head_, x); });
    return nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), targets_);
  }

 private:
  CheckpointPolicy checkpoint_;
  nn::Embedding embed_;
  std::shared_ptr<RmsNorm> norm_;
  nn::Linear lm_head_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::vector<Unit> units_;  // the blocks, in order
  at::Tensor cos_, sin_, causal_mask_, tokens_, targets_;
};

}  // namespace

StepBuilder llama_step(const ZooConfig& config) {
  return [config] { return std::make_unique<LlamaStep>(config, config.batch); };
}

}  // namespace metamem
