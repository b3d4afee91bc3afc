#include "examples/zoo/Zoo.h"

#include <c10/core/DefaultDtype.h>
#include <c10/core/ScalarTypeToTypeMeta.h>

#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

#include "examples/zoo/Models.h"

namespace metamem {
namespace {

void require_positive(const char* what, std::int64_t value) {
  if (value <= 0) throw std::invalid_argument(std::string(what) + " must be positive");
}

// A trace's work grows with these; ten times what any model has.
constexpr std::int64_t kMostLayers = 10'000;
constexpr std::int64_t kMostRanks = 1'000;  // as --dp, --pp

void require_at_most(const char* what, std::int64_t value, std::int64_t most) {
  if (value > most)
    throw std::invalid_argument(std::string(what) + " must be at most " + std::to_string(most) + ", got " +
                                std::to_string(value));
}

// A tensor the model makes has this many elements (a factor without a
// name is the model's own): its bytes (8 to an
// element at most) must fit in int64, as torch's storage sizes must.
void require_elements(std::initializer_list<std::pair<const char*, std::int64_t>> factors) {
  constexpr std::int64_t kMostElements = std::int64_t{1} << 60;
  std::int64_t elements = 1;
  bool overflow = false;
  std::string named;
  for (const auto& [what, value] : factors) {
    overflow = overflow || __builtin_mul_overflow(elements, value, &elements) || elements > kMostElements;
    named += (named.empty() ? "" : " x ") + std::string(what) + (*what ? " " : "") + std::to_string(value);
  }
  if (overflow)
    throw std::invalid_argument(named + ": a tensor of more than 2^60 elements, whose bytes overflow int64");
}

// Parallelism splits `what` evenly across its `parts` (tensor-parallel
// ranks, pipeline stages).
void require_multiple(const char* what, std::int64_t value, const char* parts_name, std::int64_t parts) {
  if (value % parts != 0)
    throw std::invalid_argument(std::string(what) + " (" + std::to_string(value) + ") must be a multiple of the " +
                                parts_name + " (" + std::to_string(parts) + ")");
}

// While alive, factories without a dtype make `dtype` (torch's default
// dtype, which the layers' parameters and buffers take).
class DefaultDtype {
 public:
  explicit DefaultDtype(c10::ScalarType dtype) : was_(c10::get_default_dtype()) {
    c10::set_default_dtype(c10::scalarTypeToTypeMeta(dtype));
  }
  ~DefaultDtype() { c10::set_default_dtype(was_); }
  DefaultDtype(const DefaultDtype&) = delete;
  DefaultDtype& operator=(const DefaultDtype&) = delete;

 private:
  caffe2::TypeMeta was_;
};

// The model's layers made in `dtype` from the start, as a C++ program that
// builds on the CPU and moves the model to the GPU holds them there: never
// f32 first. Made in f32 on the device and cast, they left their f32 blocks
// in the caching allocator's cache, which the step's activations reused
// unsplit: ResNet-50 in bf16 then peaked 3.4 MB over real torch on the
// fake GPU (tests/python/zoo_fake_gpu_sweep.py).
StepBuilder built_in(c10::ScalarType dtype, StepBuilder build) {
  return [dtype, build = std::move(build)] {
    const DefaultDtype in(dtype);
    return build();
  };
}

StepBuilder validated_step(const ZooConfig& config);

}  // namespace

StepBuilder zoo_step(const ZooConfig& config) { return built_in(config.dtype, validated_step(config)); }

const std::vector<std::string>& zoo_models() {
  static const std::vector<std::string> names = {"mlp", "resnet18", "resnet50", "gpt2", "llama"};
  return names;
}

c10::ScalarType parse_dtype(const std::string& name) {
  if (name == "f32") return c10::kFloat;
  if (name == "f16") return c10::kHalf;
  if (name == "bf16") return c10::kBFloat16;
  throw std::invalid_argument("unknown dtype '" + name + "' (known: f32, f16, bf16)");
}

namespace {

StepBuilder validated_step(const ZooConfig& config) {
  require_positive("batch", config.batch);
  const bool transformer = config.model == "gpt2" || config.model == "llama";
  const TensorParallel& tp = config.tensor_parallel;
  if (config.flash_attention && !transformer) throw std::invalid_argument("flash attention is for gpt2 and llama");
  require_positive("tensor-parallel ranks", tp.ranks);
  require_at_most("tensor-parallel ranks", tp.ranks, kMostRanks);
  if ((tp.ranks > 1 || tp.sequence_parallel) && !transformer)
    throw std::invalid_argument("tensor parallelism is for gpt2 and llama");
  if (tp.sequence_parallel && tp.ranks == 1)
    throw std::invalid_argument("sequence parallelism needs tensor parallelism (2 or more ranks)");
  const PipelineStage& pp = config.pipeline;
  if (pp.stages < 1 || pp.stage < 0 || pp.stage >= pp.stages)
    throw std::invalid_argument("the pipeline stage must be between 0 and the stages minus 1");
  if (pp.stages > 1 && !transformer) throw std::invalid_argument("pipeline parallelism is for gpt2 and llama");
  if (config.selective_recompute && (!transformer || config.flash_attention))
    throw std::invalid_argument("selective recompute is for gpt2 and llama with math attention");
  if (config.model == "mlp") {
    require_elements({{"batch", config.batch}, {"", 4096}});
    return mlp_step(config);
  }
  if (config.model == "resnet18" || config.model == "resnet50") {
    require_positive("image", config.image);
    require_elements({{"batch", config.batch}, {"", 64}, {"image", config.image}, {"image", config.image}});
    return resnet_step(config, config.model == "resnet18" ? 18 : 50);
  }
  if (config.model == "gpt2" || config.model == "llama") {
    for (auto [what, value] : {std::pair{"seq", config.seq}, {"layers", config.layers},
                               {"width", config.width}, {"heads", config.heads},
                               {"vocab", config.vocab}})
      require_positive(what, value);
    require_at_most("layers", config.layers, kMostLayers);
    require_elements({{"batch", config.batch}, {"seq", config.seq}, {"vocab", config.vocab}});
    require_elements({{"batch", config.batch}, {"heads", config.heads}, {"seq", config.seq}, {"seq", config.seq}});
    require_elements({{"batch", config.batch}, {"seq", config.seq}, {"", 4}, {"width", config.width}});
    require_elements({{"vocab", config.vocab}, {"width", config.width}});
    if (config.width % config.heads != 0)
      throw std::invalid_argument("width must be a multiple of heads");
    require_multiple("heads", config.heads, "tensor-parallel ranks", tp.ranks);
    require_multiple("layers", config.layers, "pipeline stages", pp.stages);
    if (tp.sequence_parallel) require_multiple("seq", config.seq, "tensor-parallel ranks", tp.ranks);
    // The core attention's output must be a new tensor to be checkpointed.
    if (config.selective_recompute && (config.heads / tp.ranks < 2 || config.seq < 2))
      throw std::invalid_argument("selective recompute needs 2 or more heads per rank and seq 2 or more");
    if (config.model == "gpt2") {
      if (config.dropout < 0 || config.dropout >= 1)
        throw std::invalid_argument("dropout must be in [0, 1)");
      return gpt2_step(config);
    }
    ZooConfig llama = config;
    if (llama.kv_heads == 0) llama.kv_heads = llama.heads;
    if (llama.ffn == 0) llama.ffn = (8 * llama.width / 3 + 255) / 256 * 256;
    require_positive("kv-heads", llama.kv_heads);
    require_positive("ffn", llama.ffn);
    require_elements({{"batch", llama.batch}, {"seq", llama.seq}, {"ffn", llama.ffn}});
    require_elements({{"width", llama.width}, {"ffn", llama.ffn}});
    if (llama.heads % llama.kv_heads != 0) throw std::invalid_argument("heads must be a multiple of kv-heads");
    require_multiple("kv-heads", llama.kv_heads, "tensor-parallel ranks", tp.ranks);
    require_multiple("ffn", llama.ffn, "tensor-parallel ranks", tp.ranks);
    if (llama.width / llama.heads % 2 != 0)
      throw std::invalid_argument("width / heads must be even (rotary embeddings turn pairs)");
    return llama_step(llama);
  }
  std::string known;
  for (const auto& name : zoo_models()) known += (known.empty() ? "" : ", ") + name;
  throw std::invalid_argument("unknown model '" + config.model + "' (known: " + known + ")");
}

}  // namespace

}  // namespace metamem
