#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include "examples/zoo/Models.h"
#include "profiler/Tracer.h"

namespace metamem {
namespace {

// Linear(1024->4096) - ReLU - Dropout - Linear(4096->1024), loss = sum().
class MlpStep final : public TrainingStep {
 public:
  explicit MlpStep(std::int64_t batch)
      : fc1_(1024, 4096), fc2_(4096, 1024), dropout_(0.1),
        input_(torch::randn({batch, 1024})) {}

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
  return [batch = config.batch] { return std::make_unique<MlpStep>(batch); };
}

}  // namespace metamem
