// GPT-2 (nanoGPT layout): token + position embeddings, pre-norm blocks of
// causal self-attention and a GELU MLP, weight-tied LM head, cross-entropy.
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/types.h>

#include <cmath>
#include <string>

#include "examples/zoo/Models.h"
#include "meta/FlashAttention.h"
#include "profiler/Tracer.h"

namespace metamem {
namespace {

namespace nn = torch::nn;

// A linear layer over the last dimension as one addmm on the flattened
// input, as PyTorch 2.x runs contiguous 3-d input (1.13 adds the bias in
// place after a matmul, which would change a kept product's output).
at::Tensor linear(const nn::Linear& layer, const at::Tensor& x) {
  auto sizes = x.sizes().vec();
  const at::Tensor y = torch::addmm(layer->bias, x.reshape({-1, sizes.back()}), layer->weight.t());
  sizes.back() = y.size(1);
  return y.view(sizes);
}

class Block : public nn::Module {
 public:
  explicit Block(const ZooConfig& c)
      : heads_(c.heads),
        flash_(c.flash_attention),
        ln_1_(register_module("ln_1", nn::LayerNorm(nn::LayerNormOptions({c.width})))),
        c_attn_(register_module("c_attn", nn::Linear(c.width, 3 * c.width))),
        attn_proj_(register_module("attn_c_proj", nn::Linear(c.width, c.width))),
        ln_2_(register_module("ln_2", nn::LayerNorm(nn::LayerNormOptions({c.width})))),
        c_fc_(register_module("c_fc", nn::Linear(c.width, 4 * c.width))),
        mlp_proj_(register_module("mlp_c_proj", nn::Linear(4 * c.width, c.width))),
        attn_dropout_(c.dropout),
        resid_dropout_(c.dropout) {
    register_module("attn_dropout", attn_dropout_);
    register_module("resid_dropout", resid_dropout_);
  }

  at::Tensor forward(const at::Tensor& x, const at::Tensor& causal_mask) {
    at::Tensor h = x + scoped("attn", [&] {
                     return attention(scoped("ln_1", [&] { return ln_1_->forward(x); }),
                                      causal_mask);
                   });
    return h + scoped("mlp", [&] {
             at::Tensor y = scoped("ln_2", [&] { return ln_2_->forward(h); });
             y = scoped("c_fc", [&] { return linear(c_fc_, y); });
             y = scoped("gelu", [&] { return nn::functional::gelu(y); });
             y = scoped("c_proj", [&] { return linear(mlp_proj_, y); });
             return scoped("dropout", [&] { return resid_dropout_->forward(y); });
           });
  }

 private:
  at::Tensor attention(const at::Tensor& x, const at::Tensor& causal_mask) {
    const std::int64_t batch = x.size(0), seq = x.size(1), width = x.size(2);
    const std::int64_t head_dim = width / heads_;
    auto qkv = scoped("c_attn", [&] { return linear(c_attn_, x); }).split(width, 2);
    auto heads = [&](const at::Tensor& t) { return t.view({batch, seq, heads_, head_dim}); };
    at::Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
    at::Tensor y;
    if (flash_) {
      const double dropout = attn_dropout_->is_training() ? attn_dropout_->options.p() : 0.0;
      y = flash_attention(q, k, v, dropout, /*causal=*/true).view({batch, seq, width});
    } else {
      q = q.transpose(1, 2);
      k = k.transpose(1, 2);
      v = v.transpose(1, 2);
      at::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(head_dim));
      scores = scores.masked_fill(causal_mask, -INFINITY);
      at::Tensor probs = scoped("attn_dropout", [&] {
        return attn_dropout_->forward(torch::softmax(scores, -1));
      });
      y = torch::matmul(probs, v).transpose(1, 2).contiguous().view({batch, seq, width});
    }
    y = scoped("c_proj", [&] { return linear(attn_proj_, y); });
    return scoped("resid_dropout", [&] { return resid_dropout_->forward(y); });
  }

  std::int64_t heads_;
  bool flash_;
  nn::LayerNorm ln_1_;
  nn::Linear c_attn_, attn_proj_;
  nn::LayerNorm ln_2_;
  nn::Linear c_fc_, mlp_proj_;
  nn::Dropout attn_dropout_, resid_dropout_;
};

class Gpt2Step final : public TrainingStep, public nn::Module {
 public:
  Gpt2Step(const ZooConfig& c, std::int64_t batch)
      : checkpoint_(c.checkpoint),
        wte_(register_module("wte", nn::Embedding(c.vocab, c.width))),
        wpe_(register_module("wpe", nn::Embedding(c.seq, c.width))),
        drop_(register_module("drop", nn::Dropout(c.dropout))),
        ln_f_(register_module("ln_f", nn::LayerNorm(nn::LayerNormOptions({c.width})))) {
    for (std::int64_t i = 0; i < c.layers; ++i) {
      blocks_.push_back(register_module("h_" + std::to_string(i), std::make_shared<Block>(c)));
      units_.push_back({{"h", std::to_string(i)}, [this, block = blocks_.back()](const at::Tensor& x) {
                          return block->forward(x, causal_mask_);
                        }});
    }
    // True above the diagonal: positions a token may not attend to.
    causal_mask_ = register_buffer(
        "causal_mask", torch::ones({c.seq, c.seq}, torch::kBool).triu(1).view({1, 1, c.seq, c.seq}));
    tokens_ = torch::zeros({batch, c.seq}, torch::kLong);
    positions_ = torch::arange(c.seq, torch::kLong).unsqueeze(0);
    targets_ = torch::zeros({batch * c.seq}, torch::kLong);
    cast_floating(*this, c.dtype);
  }

  std::vector<at::Tensor> parameters() override { return Module::parameters(); }

  at::Tensor forward_loss() override {
    ModuleScope root("GPT2");
    at::Tensor x = scoped("wte", [&] { return wte_->forward(tokens_); }) +
                   scoped("wpe", [&] { return wpe_->forward(positions_); });
    x = scoped("drop", [&] { return drop_->forward(x); });
    x = run_chain(units_, std::move(x), checkpoint_);
    x = scoped("ln_f", [&] { return ln_f_->forward(x); });
    // The LM head shares the token embedding's weight.
    at::Tensor logits =
        scoped("lm_head", [&] { return torch::matmul(x, wte_->weight.t()); });
    return nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), targets_);
  }

 private:
  CheckpointPolicy checkpoint_;
  nn::Embedding wte_, wpe_;
  nn::Dropout drop_;
  nn::LayerNorm ln_f_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::vector<Unit> units_;  // the blocks, in order
  at::Tensor causal_mask_, tokens_, positions_, targets_;
};

}  // namespace

StepBuilder gpt2_step(const ZooConfig& config) {
  return [config] { return std::make_unique<Gpt2Step>(config, config.batch); };
}

}  // namespace metamem
