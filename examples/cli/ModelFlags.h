// The flags that choose a model and its training step, shared by profile
// and fit.
#pragma once

#include <string>

#include "examples/cli/Flags.h"
#include "examples/zoo/Zoo.h"
#include "profiler/Step.h"

namespace metamem::cli {

struct ModelFlags {
  ZooConfig zoo;
  std::string device = "cuda";
  std::string optimizer = "none";
  std::string dtype = "f32";

  void add_to(Flags& flags);
  // Validates what add_to could not (throws std::invalid_argument).
  StepOptions step_options() const;
  ZooConfig config() const;
};

}  // namespace metamem::cli
