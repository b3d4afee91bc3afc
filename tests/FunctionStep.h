// A TrainingStep from two lambdas, for tests: make the tensors, compute a loss.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "profiler/Step.h"

namespace metamem::testing {

using Tensors = std::vector<at::Tensor>;

inline StepBuilder function_step(std::function<Tensors()> make,
                                 std::function<at::Tensor(Tensors&)> loss) {
  struct Step final : TrainingStep {
    Tensors tensors;
    std::function<at::Tensor(Tensors&)> loss;
    at::Tensor forward_loss() override { return loss(tensors); }
    std::vector<at::Tensor> parameters() override {
      std::vector<at::Tensor> params;
      for (const at::Tensor& t : tensors)
        if (t.requires_grad()) params.push_back(t);
      return params;
    }
  };
  return [make, loss] {
    auto step = std::make_unique<Step>();
    step->tensors = make();
    step->loss = loss;
    return step;
  };
}

}  // namespace metamem::testing
