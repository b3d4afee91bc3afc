// ResNet-18 and ResNet-50 as in torchvision (same module names).
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/types.h>

#include <string>

#include "examples/zoo/Models.h"
#include "profiler/Tracer.h"

namespace metamem {
namespace {

namespace nn = torch::nn;

nn::Conv2d conv(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride) {
  return nn::Conv2d(
      nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

struct ConvBn {
  nn::Conv2d conv;
  nn::BatchNorm2d bn;
  const char *conv_name, *bn_name;

  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = scoped(conv_name, [&] { return conv->forward(x); });
    return scoped(bn_name, [&] { return bn->forward(y); });
  }
};

// A residual block: BasicBlock (two 3x3) or Bottleneck (1x1, 3x3, 1x1).
class Block : public nn::Module {
 public:
  Block(std::int64_t in, std::int64_t planes, std::int64_t stride, bool bottleneck) {
    const char* convs[] = {"conv1", "conv2", "conv3"};
    const char* bns[] = {"bn1", "bn2", "bn3"};
    std::int64_t expansion = bottleneck ? 4 : 1;
    std::vector<std::pair<std::int64_t, std::int64_t>> shape;  // (kernel, stride) of each conv
    if (bottleneck)
      shape = {{1, 1}, {3, stride}, {1, 1}};
    else
      shape = {{3, stride}, {3, 1}};
    std::int64_t channels = in;
    for (std::size_t i = 0; i < shape.size(); ++i) {
      std::int64_t out = i + 1 == shape.size() ? planes * expansion : planes;
      layers_.push_back({register_module(convs[i], conv(channels, out, shape[i].first, shape[i].second)),
                         register_module(bns[i], nn::BatchNorm2d(out)), convs[i], bns[i]});
      channels = out;
    }
    if (stride != 1 || in != planes * expansion) {
      downsample_ = ConvBn{register_module("downsample_0", conv(in, channels, 1, stride)),
                           register_module("downsample_1", nn::BatchNorm2d(channels)), "0", "1"};
    }
  }

  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = x;
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      y = layers_[i].forward(y);
      if (i + 1 < layers_.size()) y = scoped("relu", [&] { return torch::relu_(y); });
    }
    at::Tensor identity = x;
    if (downsample_) {
      ModuleScope scope("downsample");
      identity = downsample_->forward(x);
    }
    y += identity;
    return scoped("relu", [&] { return torch::relu_(y); });
  }

 private:
  std::vector<ConvBn> layers_;
  c10::optional<ConvBn> downsample_;
};

class ResNetStep final : public TrainingStep, public nn::Module {
 public:
  ResNetStep(int depth, std::int64_t batch, std::int64_t image, c10::ScalarType dtype,
             CheckpointPolicy checkpoint, std::int64_t classes = 1000)
      : stem_{register_module("conv1", conv(3, 64, 7, 2)),
              register_module("bn1", nn::BatchNorm2d(64)), "conv1", "bn1"},
        pool_(nn::MaxPool2dOptions(3).stride(2).padding(1)),
        checkpoint_(std::move(checkpoint)) {
    const bool bottleneck = depth == 50;
    const std::int64_t blocks[2][4] = {{2, 2, 2, 2}, {3, 4, 6, 3}};
    std::int64_t in = 64;
    for (int stage = 0; stage < 4; ++stage) {
      std::int64_t planes = 64 << stage;
      auto& stage_blocks = stages_.emplace_back();
      for (std::int64_t b = 0; b < blocks[bottleneck][stage]; ++b) {
        std::string name = "layer" + std::to_string(stage + 1) + "_" + std::to_string(b);
        stage_blocks.push_back(register_module(
            name, std::make_shared<Block>(in, planes, b == 0 && stage > 0 ? 2 : 1, bottleneck)));
        units_.push_back({{"layer" + std::to_string(stage + 1), std::to_string(b)},
                          [block = stage_blocks.back()](const at::Tensor& x) { return block->forward(x); }});
        in = planes * (bottleneck ? 4 : 1);
      }
    }
    fc_ = register_module("fc", nn::Linear(in, classes));
    input_ = register_buffer("input", torch::randn({batch, 3, image, image}, dtype));
    target_ = register_buffer("target", torch::zeros({batch}, torch::kLong));
  }

  std::vector<at::Tensor> parameters() override { return Module::parameters(); }
  std::vector<std::vector<at::Tensor>> unit_parameters() override {
    std::vector<std::vector<at::Tensor>> units;
    for (const auto& blocks : stages_)
      for (auto& block : parameters_of(blocks)) units.push_back(std::move(block));
    return units;
  }

  at::Tensor forward_loss() override {
    ModuleScope root("ResNet");
    at::Tensor x = stem_.forward(input_);
    x = scoped("relu", [&] { return torch::relu_(x); });
    x = scoped("maxpool", [&] { return pool_->forward(x); });
    x = run_chain(units_, std::move(x), checkpoint_);
    x = scoped("avgpool", [&] { return torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1); });
    x = scoped("fc", [&] { return fc_->forward(x); });
    return torch::nn::functional::cross_entropy(x, target_);
  }

 private:
  ConvBn stem_;
  nn::MaxPool2d pool_;
  std::vector<std::vector<std::shared_ptr<Block>>> stages_;
  std::vector<Unit> units_;  // the blocks, in order
  CheckpointPolicy checkpoint_;
  nn::Linear fc_{nullptr};
  at::Tensor input_, target_;
};

}  // namespace

StepBuilder resnet_step(const ZooConfig& config, int depth) {
  return [depth, batch = config.batch, image = config.image, dtype = config.dtype,
          checkpoint = config.checkpoint] {
    return std::make_unique<ResNetStep>(depth, batch, image, dtype, checkpoint);
  };
}

}  // namespace metamem
