#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include "examples/zoo/Models.h"
#include "profiler/Tracer.h"

namespace metamem {
namespace {

// Linear(1024->4096) - ReLU - Dropout - Linear(4096->1024), loss = sum().
class MlpStep final : public TrainingStep, public torch::nn::Module {
 public:
  MlpStep(std::int64_t batch, c10::ScalarType dtype, CheckpointPolicy checkpoint)
      : fc1_(register_module("fc1", torch::nn::Linear(1024, 4096))),
        fc2_(register_module("fc2", torch::nn::Linear(4096, 1024))),
        dropout_(0.1),
        checkpoint_(std::move(checkpoint)) {
    input_ = register_buffer("input", torch::randn({batch, 1024}, dtype));
    units_ = {{{"fc1"}, [this](const at::Tensor& x) { return fc1_->forward(x); }},
              {{"relu"}, [](const at::Tensor& x) { return torch::relu(x); }},
              {{"dropout"}, [this](const at::Tensor& x) { return dropout_->forward(x); }},
              {{"fc2"}, [this](const at::Tensor& x) { return fc2_->forward(x); }}};
  }

  std::vector<at::Tensor> parameters() override { return Module::parameters(); }
  std::vector<std::vector<at::Tensor>> unit_parameters() override {
    return {fc1_->parameters(), {}, {}, fc2_->parameters()};
  }

  at::Tensor forward_loss() override {
    ModuleScope root("MLP");
    return run_chain(units_, input_, checkpoint_).sum();
  }

 private:
  torch::nn::Linear fc1_, fc2_;
  torch::nn::Dropout dropout_;
  CheckpointPolicy checkpoint_;
  std::vector<Unit> units_;
  at::Tensor input_;
};

}  // namespace

StepBuilder mlp_step(const ZooConfig& config) {
  return [batch = config.batch, dtype = config.dtype, checkpoint = config.checkpoint] {
    return std::make_unique<MlpStep>(batch, dtype, checkpoint);
  };
}

}  // namespace metamem
