// The built-in model zoo: stable names, each a TrainingStep builder.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "examples/zoo/TensorParallel.h"
#include "profiler/Chain.h"
#include "profiler/Step.h"

namespace metamem {

struct ZooConfig {
  std::string model = "mlp";
  std::int64_t batch = 8;
  c10::ScalarType dtype = c10::kFloat;  // parameters and float inputs
  std::int64_t image = 224;  // resnet: input is batch x 3 x image x image
  // gpt2 and llama (defaults: GPT-2 124M's shape)
  std::int64_t seq = 1024;
  std::int64_t layers = 12;
  std::int64_t width = 768;
  std::int64_t heads = 12;
  std::int64_t vocab = 50257;
  // llama only: key/value heads (0: as many as heads) and the MLP's hidden
  // width (0: Llama's rule, 8/3 x width rounded up to a multiple of 256)
  std::int64_t kv_heads = 0;
  std::int64_t ffn = 0;
  // gpt2 and llama: attention by metamem::flash_attention (FlashAttention-2's
  // memory) instead of matmuls and a softmax over seq x seq scores
  bool flash_attention = false;
  // gpt2 and llama: the traced rank's shard under Megatron's tensor (and
  // sequence) parallelism; the vocabulary is padded to a multiple of ranks.
  TensorParallel tensor_parallel;
  // gpt2 and llama: the traced stage of a pipeline, which holds
  // layers / stages blocks; the first also the embeddings, the last the
  // final norm, the LM head (gpt2: its own copy of the tied embedding, as
  // Megatron keeps) and the loss.
  PipelineStage pipeline;
  // gpt2 and llama with math attention: Megatron's selective recompute,
  // the core attention (scores, softmax, dropout, values) checkpointed.
  bool selective_recompute = false;
  double dropout = 0.1;
  // Units of the model's chain (mlp: its four layers; resnet: residual
  // blocks; gpt2, llama: transformer blocks) recomputed in backward.
  CheckpointPolicy checkpoint;
};

const std::vector<std::string>& zoo_models();

// "f32", "f16", "bf16"; throws std::invalid_argument.
c10::ScalarType parse_dtype(const std::string& name);

// Throws std::invalid_argument for an unknown model or a bad size.
StepBuilder zoo_step(const ZooConfig& config);

}  // namespace metamem
