// GPT-2 (nanoGPT layout): token + position embeddings, pre-norm blocks of
// causal self-attention and a GELU MLP, weight-tied LM head, cross-entropy.
#include <torch/nn/functional/activation.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
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

class Block : public nn::Module {
 public:
  Block(const ZooConfig& c, const TensorParallelRank& tp)
      : tp_(tp),
        heads_(tp.shard(c.heads)),
        flash_(c.flash_attention),
        selective_recompute_(c.selective_recompute),
        ln_1_(register_module("ln_1", nn::LayerNorm(nn::LayerNormOptions({c.width})))),
        c_attn_(register_module("c_attn", nn::Linear(c.width, tp.shard(3 * c.width)))),
        attn_proj_(register_module("attn_c_proj", nn::Linear(tp.shard(c.width), c.width))),
        ln_2_(register_module("ln_2", nn::LayerNorm(nn::LayerNormOptions({c.width})))),
        c_fc_(register_module("c_fc", nn::Linear(c.width, tp.shard(4 * c.width)))),
        mlp_proj_(register_module("mlp_c_proj", nn::Linear(tp.shard(4 * c.width), c.width))),
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
             y = scoped("c_fc", [&] { return tp_.column_linear(y, c_fc_->weight, c_fc_->bias); });
             y = scoped("gelu", [&] { return nn::functional::gelu(y); });
             y = scoped("c_proj", [&] { return tp_.row_linear(y, mlp_proj_->weight, mlp_proj_->bias); });
             return scoped("dropout", [&] { return resid_dropout_->forward(y); });
           });
  }

 private:
  // The rank's heads; under sequence parallelism x is the rank's chunk of
  // the sequence and c_attn gathers the rest.
  at::Tensor attention(const at::Tensor& x, const at::Tensor& causal_mask) {
    const at::Tensor qkv = scoped("c_attn", [&] { return tp_.column_linear(x, c_attn_->weight, c_attn_->bias); });
    const std::int64_t batch = qkv.size(0), seq = qkv.size(1), width = qkv.size(2) / 3;
    const auto parts = qkv.split(width, 2);
    auto heads = [&](const at::Tensor& t) { return t.view({batch, seq, heads_, width / heads_}); };
    const at::Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
    at::Tensor y;
    if (flash_) {
      const double dropout = attn_dropout_->is_training() ? attn_dropout_->options.p() : 0.0;
      y = flash_attention(q, k, v, dropout, /*causal=*/true);
    } else {
      const SegmentFn core = [this, causal_mask](const std::vector<at::Tensor>& qkv) {
        return std::vector<at::Tensor>{math_attention(qkv[0], qkv[1], qkv[2], causal_mask)};
      };
      y = (selective_recompute_ ? checkpoint(core, {q, k, v}) : core({q, k, v}))[0];
    }
    y = scoped("c_proj",
               [&] { return tp_.row_linear(y.view({batch, seq, width}), attn_proj_->weight, attn_proj_->bias); });
    return scoped("resid_dropout", [&] { return resid_dropout_->forward(y); });
  }

  // Softmax of scaled, masked scores, dropout, times the values: batch x
  // seq x heads x head_dim in, a new tensor of the same shape out.
  at::Tensor math_attention(at::Tensor q, at::Tensor k, at::Tensor v, const at::Tensor& causal_mask) {
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
    q = q.transpose(1, 2);
    k = k.transpose(1, 2);
    v = v.transpose(1, 2);
    at::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * scale;
    scores = scores.masked_fill(causal_mask, -INFINITY);
    at::Tensor probs = scoped("attn_dropout", [&] { return attn_dropout_->forward(torch::softmax(scores, -1)); });
    return torch::matmul(probs, v).transpose(1, 2).contiguous();
  }

  const TensorParallelRank& tp_;
  std::int64_t heads_;
  bool flash_, selective_recompute_;
  nn::LayerNorm ln_1_;
  nn::Linear c_attn_, attn_proj_;
  nn::LayerNorm ln_2_;
  nn::Linear c_fc_, mlp_proj_;
  nn::Dropout attn_dropout_, resid_dropout_;
};

class Gpt2Step final : public TransformerStep {
 public:
  explicit Gpt2Step(const ZooConfig& c) : TransformerStep("GPT2", c) {
    // Megatron keeps the tied embedding on the first stage and the last.
    if (stage_.first() || stage_.last())
      wte_ = register_module("wte", nn::Embedding(tp_.vocab_rows(c.vocab), c.width));
    if (stage_.first()) {
      wpe_ = register_module("wpe", nn::Embedding(c.seq, c.width));
      drop_ = register_module("drop", nn::Dropout(c.dropout));
      positions_ = register_buffer("positions", torch::arange(c.seq, torch::kLong).unsqueeze(0));
    }
    if (stage_.last()) ln_f_ = register_module("ln_f", nn::LayerNorm(nn::LayerNormOptions({c.width})));
    for (std::int64_t i = first_layer_; i < end_layer_; ++i) {
      auto block = std::make_shared<Block>(c, tp_);
      add_block("h", i, block, [this, block](const at::Tensor& x) { return block->forward(x, causal_mask_); });
    }
  }

 private:
  at::Tensor embed() override {
    at::Tensor x = scoped("wte", [&] { return tp_.embedding(tokens_, wte_->weight); }) +
                   scoped("wpe", [&] { return wpe_->forward(positions_); });
    return scoped("drop", [&] { return drop_->forward(tp_.sequence_chunk(x)); });
  }

  // The LM head shares the token embedding's weight.
  at::Tensor head(const at::Tensor& x) override {
    const at::Tensor y = scoped("ln_f", [&] { return ln_f_->forward(x); });
    return scoped("lm_head", [&] { return tp_.column_linear(y, wte_->weight); });
  }

  nn::Embedding wte_{nullptr}, wpe_{nullptr};
  nn::Dropout drop_{nullptr};
  nn::LayerNorm ln_f_{nullptr};
  at::Tensor positions_;
};

}  // namespace

StepBuilder gpt2_step(const ZooConfig& config) {
  return [config] { return std::make_unique<Gpt2Step>(config); };
}

}  // namespace metamem
