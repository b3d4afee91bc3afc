// What the zoo's decoder-only transformers (gpt2, llama) share: one stage of
// a pipeline of them under tensor parallelism. The first stage embeds the
// tokens and the others receive their input; each runs its blocks as a
// chain; the last applies the head and the vocab-parallel cross-entropy.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "examples/zoo/Models.h"

namespace metamem {

class TransformerStep : public TrainingStep, public torch::nn::Module {
 public:
  PipelineStage pipeline_stage() const override { return stage_; }
  std::vector<at::Tensor> parameters() override { return Module::parameters(); }
  std::vector<std::vector<at::Tensor>> unit_parameters() override { return parameters_of(blocks_); }
  at::Tensor forward_loss() final;

 protected:
  // `name`: the root module scope. Registers the causal mask and makes the
  // tokens (first stage) and targets (last stage).
  TransformerStep(const char* name, const ZooConfig& config);

  // The blocks' input from tokens_ (first stage).
  virtual at::Tensor embed() = 0;
  // Logits over the rank's vocabulary from the blocks' output (last stage).
  virtual at::Tensor head(const at::Tensor& x) = 0;

  // Registers the model's block `index` as `prefix`_`index` and runs it as
  // the chain's next unit.
  void add_block(const std::string& prefix, std::int64_t index, std::shared_ptr<torch::nn::Module> block,
                 std::function<at::Tensor(const at::Tensor&)> forward);

  const TensorParallelRank tp_;
  const PipelineStage stage_;
  const std::int64_t first_layer_, end_layer_;  // this stage's blocks, by index in the model
  at::Tensor causal_mask_, tokens_, targets_;

 private:
  const char* name_;
  CheckpointPolicy checkpoint_;
  std::vector<std::int64_t> received_;  // the sizes of a later stage's input
  c10::ScalarType dtype_;
  std::vector<std::shared_ptr<torch::nn::Module>> blocks_;
  std::vector<Unit> units_;  // the blocks, in order
};

}  // namespace metamem
