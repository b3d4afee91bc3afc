// Builders of the zoo's models; zoo_step() validates their configs first.
#pragma once

#include "examples/zoo/Zoo.h"

namespace torch::nn {
class Module;
}

namespace metamem {

// Casts the floating-point parameters and buffers of `module` to `dtype`
// (Module::to would cast integer and bool buffers too).
void cast_floating(torch::nn::Module& module, c10::ScalarType dtype);

// The parameters of each of `modules` (shared pointers to nn::Module types).
template <typename Modules>
std::vector<std::vector<at::Tensor>> parameters_of(const Modules& modules) {
  std::vector<std::vector<at::Tensor>> parameters;
  for (const auto& module : modules) parameters.push_back(module->parameters());
  return parameters;
}

StepBuilder mlp_step(const ZooConfig& config);
StepBuilder resnet_step(const ZooConfig& config, int depth);
StepBuilder gpt2_step(const ZooConfig& config);
StepBuilder llama_step(const ZooConfig& config);

}  // namespace metamem
