#include "examples/cli/ModelFlags.h"

namespace metamem::cli {

void ModelFlags::add_to(Flags& flags) {
  flags.add("--model", &zoo.model);
  for (auto [name, value] : {std::pair{"--batch", &zoo.batch}, {"--seq", &zoo.seq},
                             {"--image", &zoo.image}, {"--layers", &zoo.layers},
                             {"--width", &zoo.width}, {"--heads", &zoo.heads},
                             {"--vocab", &zoo.vocab}})
    flags.add(name, value);
  flags.add("--device", &device, {"cpu", "cuda"});
  flags.add("--optimizer", &optimizer);
  flags.add("--dtype", &dtype);
}

StepOptions ModelFlags::step_options() const {
  StepOptions options;
  options.optimizer = parse_optimizer(optimizer);
  options.fp32_master_weights = parse_dtype(dtype) != c10::kFloat;
  return options;
}

ZooConfig ModelFlags::config() const {
  ZooConfig config = zoo;
  config.dtype = parse_dtype(dtype);
  return config;
}

}  // namespace metamem::cli
