// The flags that choose a model and its training step, shared by profile
// and fit.
#pragma once

#include <string>

#include "examples/cli/Flags.h"
#include "examples/zoo/ScriptModel.h"
#include "examples/zoo/Zoo.h"
#include "profiler/Step.h"

namespace metamem::cli {

struct ModelFlags {
  ZooConfig zoo;
  std::string device = "cuda";
  std::string optimizer = "none";
  std::string dtype = "f32";
  std::vector<std::string> inputs;  // TorchScript models: one --input per forward argument
  std::string loss = "sum";
  std::int64_t roundup_power2_divisions = 0;  // the simulated CUDA allocator's setting

  void add_to(Flags& flags);
  // Validate what add_to could not (throw std::invalid_argument).
  StepOptions step_options() const;
  ZooConfig config() const;
  bool is_script() const;
  // The zoo batch, or a TorchScript model's first input's first dimension.
  std::int64_t batch() const;
  // The zoo model or the TorchScript file, as configured.
  StepBuilder builder() const;
  // --roundup-power2-divisions, checked.
  int allocator_divisions() const;
};

}  // namespace metamem::cli
