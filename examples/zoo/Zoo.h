// The built-in model zoo: stable names, each a TrainingStep builder.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "profiler/Step.h"

namespace metamem {

struct ZooConfig {
  std::string model = "mlp";
  std::int64_t batch = 8;
  std::int64_t image = 224;  // resnet: input is batch x 3 x image x image
  // gpt2 (defaults: GPT-2 124M)
  std::int64_t seq = 1024;
  std::int64_t layers = 12;
  std::int64_t width = 768;
  std::int64_t heads = 12;
  std::int64_t vocab = 50257;
  double dropout = 0.1;
};

const std::vector<std::string>& zoo_models();

// Throws std::invalid_argument for an unknown model or a bad size.
StepBuilder zoo_step(const ZooConfig& config);

}  // namespace metamem
