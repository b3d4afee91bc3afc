// Builders of the zoo's models; zoo_step() validates their configs first.
#pragma once

#include "examples/zoo/Zoo.h"

namespace metamem {

StepBuilder mlp_step(const ZooConfig& config);
StepBuilder resnet_step(const ZooConfig& config, int depth);
StepBuilder gpt2_step(const ZooConfig& config);

}  // namespace metamem
