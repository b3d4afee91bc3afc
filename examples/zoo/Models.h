// Builders of the zoo's models; zoo_step() validates their configs first
// and calls them with torch's default dtype the model's.
#pragma once

#include "examples/zoo/Zoo.h"

namespace metamem {

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
