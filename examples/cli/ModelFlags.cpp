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
  flags.add_list("--input", &inputs);
  flags.add("--loss", &loss);
  flags.add("--roundup-power2-divisions", &roundup_power2_divisions);
}

bool ModelFlags::is_script() const { return is_script_path(zoo.model); }

std::int64_t ModelFlags::batch() const {
  if (!is_script() || inputs.empty()) return zoo.batch;
  return parse_input_spec(inputs.front()).sizes.front();
}

StepBuilder ModelFlags::builder() const {
  if (!is_script()) {
    if (!inputs.empty()) throw std::invalid_argument("--input is for TorchScript models (FILE.pt)");
    return zoo_step(config());
  }
  if (dtype != "f32")
    throw std::invalid_argument("--dtype is for zoo models; a TorchScript model keeps its own dtypes");
  ScriptConfig script;
  script.path = zoo.model;
  for (const std::string& input : inputs) script.inputs.push_back(parse_input_spec(input));
  script.loss = parse_loss_spec(loss);
  return script_step(script);
}

int ModelFlags::allocator_divisions() const {
  if (roundup_power2_divisions < 0 || roundup_power2_divisions > 64)
    throw std::invalid_argument("--roundup-power2-divisions must be between 0 and 64");
  return static_cast<int>(roundup_power2_divisions);
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
