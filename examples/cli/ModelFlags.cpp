#include "examples/cli/ModelFlags.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "estimator/Units.h"
#include "examples/cli/Commands.h"

namespace metamem::cli {
namespace {

// The zoo's shape flags and the models that take them. One given to
// another model (--width to mlp, --seq to resnet50; any to a TorchScript
// file, whose shapes are its --input) would be ignored: the answer would
// not be for the model asked about.
void check_shape_flags(const std::string& model, bool script, const std::set<std::string>& given) {
  const std::vector<std::string>& zoo = zoo_models();
  if (!script && std::find(zoo.begin(), zoo.end(), model) == zoo.end()) return;  // zoo_step names it
  static const std::vector<std::pair<std::string, std::vector<std::string>>> takers = {
      {"--image", {"resnet18", "resnet50"}}, {"--seq", {"gpt2", "llama"}},     {"--layers", {"gpt2", "llama"}},
      {"--width", {"gpt2", "llama"}},        {"--heads", {"gpt2", "llama"}},   {"--vocab", {"gpt2", "llama"}},
      {"--kv-heads", {"llama"}},             {"--ffn", {"llama"}}};
  for (const auto& [flag, models] : takers) {
    if (given.count(flag) == 0 || (!script && std::find(models.begin(), models.end(), model) != models.end()))
      continue;
    std::string takes;
    for (const std::string& name : models) takes += (takes.empty() ? "" : " and ") + name;
    throw std::invalid_argument(flag + " is for the zoo's " + takes +
                                (script ? ": a TorchScript model's shapes are its --input" : ", not " + model));
  }
}

}  // namespace

void ModelFlags::add_to(Flags& flags) {
  flags.record_given(&given);
  flags.add("--model", &zoo.model);
  for (auto [name, value] :
       {std::pair{"--batch", &zoo.batch}, {"--seq", &zoo.seq}, {"--image", &zoo.image}, {"--layers", &zoo.layers},
        {"--width", &zoo.width}, {"--heads", &zoo.heads}, {"--vocab", &zoo.vocab}, {"--kv-heads", &zoo.kv_heads},
        {"--ffn", &zoo.ffn}, {"--steps", &steps},
        {"--grad-accum", &grad_accum}, {"--tp", &tp}, {"--pp", &pp}, {"--stage", &stage},
        {"--microbatches", &microbatches}, {"--dp", &dp}, {"--zero", &zero}, {"--gpus-per-node", &gpus_per_node},
        {"--rank", &rank}})
    flags.add(name, value);
  flags.add("--device", &device, {"cpu", "cuda"});
  flags.add("--gpu", &gpu);
  flags.add("--alloc-conf", &alloc_conf);
  flags.add("--cuda-context", &cuda_context);
  flags.add("--nccl-buffers", &nccl_buffers);
  flags.add("--optimizer", &optimizer);
  flags.add("--optimizer-impl", &optimizer_impl, {"libtorch", "for-loop"});
  flags.add("--dtype", &dtype);
  flags.add_list("--input", &inputs);
  flags.add("--loss", &loss);
  flags.add("--zero-grad", &zero_grad, {"set_to_none", "zero", "none"});
  flags.add("--main-grads", &main_grads, {"param", "fp32"});
  flags.add("--policy", &policy);
  flags.add("--amp", &amp, {"none", "bf16", "f16"});
  flags.add("--attention", &attention, {"math", "flash"});
  flags.add("--schedule", &schedule, {"1f1b", "gpipe"});
  flags.add("--fsdp", &fsdp, {"none", "full", "hybrid"});
  flags.add_switch("--sequence-parallel", &sequence_parallel);
  flags.add_switch("--forward-prefetch", &forward_prefetch);
  flags.add_switch("--selective-recompute", &selective_recompute);
}

bool ModelFlags::is_script() const { return is_script_path(zoo.model); }

std::int64_t ModelFlags::batch() const {
  if (!is_script() || inputs.empty()) return zoo.batch;
  return parse_input_spec(inputs.front()).sizes.front();
}

StepBuilder ModelFlags::builder(const std::optional<CheckpointPolicy>& policy) const {
  if (!is_script()) {
    if (!inputs.empty()) throw std::invalid_argument("--input is for TorchScript models (FILE.pt)");
    ZooConfig c = config();
    if (policy) c.checkpoint = *policy;
    return zoo_step(c);
  }
  if (dtype != "f32")
    throw std::invalid_argument("--dtype is for zoo models; a TorchScript model keeps its own dtypes");
  if (attention != "math") throw std::invalid_argument("--attention is for the zoo's gpt2 and llama");
  if (tp != 1 || sequence_parallel || selective_recompute || pp != 1)
    throw std::invalid_argument(
        "--tp, --sequence-parallel, --selective-recompute and --pp are for the zoo's gpt2 and llama");
  ScriptConfig script;
  if (policy) script.checkpoint = *policy;
  else if (this->policy != "none") script.checkpoint = parse_policy(this->policy);
  script.path = zoo.model;
  for (const std::string& input : inputs) script.inputs.push_back(parse_input_spec(input));
  script.loss = parse_loss_spec(loss);
  return script_step(script);
}

const GpuSpec& ModelFlags::gpu_spec() const { return find_gpu(gpu); }

ModelFlags::TracedGpu ModelFlags::gpu_scope() const {
  std::unique_ptr<FollowRecordingsScope> recordings;
  if (device == "cuda")
    if (const std::optional<FakeGpu> fake_gpu = fake_gpu_of_environment())
      recordings = std::make_unique<FollowRecordingsScope>(FakeGpuRecordings(*fake_gpu, gpu_spec()));
  return {TracedGpuScope(traits_of(gpu_spec())), std::move(recordings)};
}

AllocatorSetup ModelFlags::allocator(std::int64_t memory) const {
  const bool from_environment = alloc_conf == allocator_config_from_environment();
  return {parse_allocator_config(alloc_conf, from_environment ? allocator_config_variable() : "--alloc-conf"), memory,
          gpu_spec().total_memory};
}

GpuMemory ModelFlags::gpu_memory(std::int64_t total) const { return gpu_memory(total, tp, pp, dp); }

GpuMemory ModelFlags::gpu_memory(std::int64_t total, std::int64_t tp_ranks, std::int64_t pp_stages,
                                 std::int64_t dp_ranks) const {
  GpuMemoryOptions options;
  // Hybrid FSDP shards within a node and replicates across nodes: two groups.
  const bool hybrid = fsdp == "hybrid" && dp_ranks > gpus_per_node;
  options.nccl_communicators = (tp_ranks > 1) + (pp_stages > 1) + (dp_ranks > 1) + hybrid;
  if (!cuda_context.empty()) options.cuda_context = parse_memory_or_zero(cuda_context, "--cuda-context");
  if (!nccl_buffers.empty()) options.nccl_buffers = parse_memory_or_zero(nccl_buffers, "--nccl-buffers");
  return metamem::gpu_memory(gpu_spec(), total, options);
}

StepOptions ModelFlags::step_options() const {
  auto count = [](const char* flag, std::int64_t value) {
    if (value < 1 || value > 1000)
      throw std::invalid_argument(std::string(flag) + " must be between 1 and 1000");
    return static_cast<int>(value);
  };
  StepOptions options;
  options.optimizer = parse_optimizer(optimizer);
  options.optimizer_impl = parse_optimizer_impl(optimizer_impl);
  options.fp32_master_weights = parse_dtype(dtype) != c10::kFloat;
  options.fp32_main_grads = main_grads == "fp32";
  if (options.fp32_main_grads && !options.fp32_master_weights)
    throw std::invalid_argument("--main-grads fp32 is for low-precision parameters (--dtype f16|bf16)");
  options.steps = count("--steps", steps);
  options.grad_accum = count("--grad-accum", grad_accum);
  if (microbatches != 0) {
    if (pp < 2) throw std::invalid_argument("--microbatches is for --pp; without it, --grad-accum");
    if (grad_accum != 1) throw std::invalid_argument("give --microbatches or --grad-accum, not both");
    options.grad_accum = count("--microbatches", microbatches);
  }
  options.schedule = parse_schedule(schedule);
  options.zero_grad = parse_zero_grad(zero_grad);
  options.data_parallel.ranks = count("--dp", dp);
  if (zero < 0 || zero > 3) throw std::invalid_argument("--zero must be 0, 1, 2 or 3");
  if (zero > 0 && dp < 2) throw std::invalid_argument("--zero needs --dp 2 or more");
  options.data_parallel.zero_stage = static_cast<int>(zero);
  if (fsdp != "none") {
    if (zero != 0) throw std::invalid_argument("--fsdp shards as ZeRO stage 3 does: give --fsdp or --zero, not both");
    if (dp < 2) throw std::invalid_argument("--fsdp needs --dp 2 or more");
    options.data_parallel.zero_stage = 3;
    if (fsdp == "hybrid") {
      const int node = count("--gpus-per-node", gpus_per_node);
      if (dp % node != 0) throw std::invalid_argument("--fsdp hybrid needs --dp to be a multiple of --gpus-per-node");
      options.data_parallel.shard_ranks = node;
    }
  }
  if (forward_prefetch && options.data_parallel.zero_stage != 3)
    throw std::invalid_argument("--forward-prefetch is for ZeRO stage 3 (--zero 3 or --fsdp)");
  options.data_parallel.forward_prefetch = forward_prefetch;
  if (rank < -1 || rank >= dp) throw std::invalid_argument("--rank must be between 0 and --dp minus 1");
  options.data_parallel.rank = static_cast<int>(rank);
  if (amp != "none") {
    options.autocast = parse_dtype(amp);
    if (sequence_parallel || pp > 1)
      throw std::invalid_argument("--amp with --sequence-parallel or --pp is not modelled: Megatron trains with "
                                  "16-bit parameters (--dtype)");
  }
  return options;
}

ZooConfig ModelFlags::config() const {
  check_shape_flags(zoo.model, is_script(), given);
  ZooConfig config = zoo;
  config.dtype = parse_dtype(dtype);
  config.checkpoint = parse_policy(policy);
  config.flash_attention = attention == "flash";
  config.tensor_parallel = {tp, sequence_parallel};
  if (pp < 1 || pp > 1000) throw std::invalid_argument("--pp must be between 1 and 1000");
  if (stage < 0 || stage >= pp) throw std::invalid_argument("--stage must be between 0 and --pp minus 1");
  config.pipeline = {static_cast<int>(pp), static_cast<int>(stage)};
  config.selective_recompute = selective_recompute;
  return config;
}

RunInfo ModelFlags::run_info() const {
  RunInfo run;
  run.model = zoo.model;
  run.device = device;
  run.dtype = dtype;
  run.batch = batch();
  run.options = step_options();
  run.optimizer = optimizer_name(run.options->optimizer);
  if (run.options->optimizer_impl == OptimizerImpl::ForLoop) run.optimizer += " (for-loop)";
  run.tensor_parallel = tp;
  run.sequence_parallel = sequence_parallel;
  run.pipeline = config().pipeline;
  run.alloc_conf = alloc_conf;
  if (device == "cuda") run.gpu_memory = gpu_memory();
  return run;
}

}  // namespace metamem::cli
