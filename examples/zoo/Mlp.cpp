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
  MlpStep(std::int64_t batch, c10::ScalarType dtype)
      : fc1_(register_module("fc1", torch::nn::Linear(1024, 4096))),
        fc2_(register_module("fc2", torch::nn::Linear(4096, 1024))),
        dropout_(0.1) {
    cast_floating(*this, dtype);
    input_ = torch::randn({batch, 1024}, dtype);
  }

  std::vector<at::Tensor> parameters() override { return Module::parameters(); }

  at::Tensor forward_loss() override {
    ModuleScope root("MLP");
    at::Tensor x = scoped("fc1", [&] { return fc1_->forward(input_); });
    x = scoped("relu", [&] { return torch::relu(x); });
    x = scoped("dropout", [&] { return dropout_->forward(x); });
    x = scoped("fc2", [&] { return fc2_->forward(x); });
    return x.sum();
  }

 private:
  torch::nn::Linear fc1_, fc2_;
  torch::nn::Dropout dropout_;
  at::Tensor input_;
};

}  // namespace

StepBuilder mlp_step(const ZooConfig& config) {
  return [batch = config.batch, dtype = config.dtype] {
    return std::make_unique<MlpStep>(batch, dtype);
  };
}

}  // namespace metamem
