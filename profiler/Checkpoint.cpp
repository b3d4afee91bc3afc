#include "profiler/Checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <mutex>
#include <optional>

#include "profiler/KeptOutputs.h"
#include "profiler/Tracer.h"

namespace metamem {
namespace {

using torch::autograd::variable_list;

// The CPU generator's state, copied without a tensor (get_state() would
// allocate one, which a real CPU run would count).
class CpuRandomState {
 public:
  static CpuRandomState capture() {
    auto* gen = generator();
    std::lock_guard<std::mutex> lock(gen->mutex_);
    return {gen->engine(), gen->next_float_normal_sample(), gen->next_double_normal_sample()};
  }
  void restore() const {
    auto* gen = generator();
    std::lock_guard<std::mutex> lock(gen->mutex_);
    gen->set_engine(engine_);
    gen->set_next_float_normal_sample(next_float_);
    gen->set_next_double_normal_sample(next_double_);
  }

 private:
  CpuRandomState(at::mt19937 engine, c10::optional<float> f, c10::optional<double> d)
      : engine_(engine), next_float_(f), next_double_(d) {}
  static at::CPUGeneratorImpl* generator() {
    return at::check_generator<at::CPUGeneratorImpl>(at::detail::getDefaultCPUGenerator());
  }
  at::mt19937 engine_;
  c10::optional<float> next_float_;
  c10::optional<double> next_double_;
};

// Drops the caller's copy of a root gradient once the engine has taken its
// own, so that the gradient is freed when the root node is done with it.
class ReleaseRootGradients final : public torch::autograd::FunctionPreHook {
 public:
  explicit ReleaseRootGradients(variable_list* gradients) : gradients_(gradients) {}
  variable_list operator()(const variable_list& grads) override {
    if (gradients_ != nullptr) gradients_->clear();
    gradients_ = nullptr;
    return grads;
  }

 private:
  variable_list* gradients_;
};

class CheckpointBackward final : public torch::autograd::Node {
 public:
  CheckpointBackward(SegmentFn fn, std::vector<at::Tensor> inputs, CpuRandomState random,
                     SegmentLabel label, std::unique_ptr<KeptOutputs> kept)
      : fn_(std::move(fn)), inputs_(std::move(inputs)), random_(random), label_(label),
        kept_(std::move(kept)), scope_(Tracer::current_scope()) {}

  std::string name() const override { return "CheckpointBackward"; }

  void keep_outputs(std::vector<at::Tensor> aliases) { outputs_ = std::move(aliases); }

  variable_list apply(variable_list&& grads) override {
    RegionScope region(RegionKind::CheckpointBackward, label_.first, label_.last);
    outputs_.clear();
    std::vector<at::Tensor> leaves;
    for (const at::Tensor& input : inputs_)
      leaves.push_back(input.detach().requires_grad_(input.requires_grad()));

    std::vector<at::Tensor> recomputed;
    {
      RegionScope recompute(RegionKind::Recompute, label_.first, label_.last);
      ScopePath scope(scope_);
      const CpuRandomState now = CpuRandomState::capture();
      random_.restore();
      at::AutoGradMode grad(true);
      std::optional<KeptOutputs::Scope> replay;
      if (kept_) replay.emplace(*kept_, KeptOutputs::Mode::Replay);
      recomputed = fn_(leaves);
      replay.reset();
      if (kept_) kept_->clear();
      now.restore();
    }
    torch::autograd::edge_list roots;
    variable_list root_grads;
    for (std::size_t i = 0; i < recomputed.size() && i < grads.size(); ++i) {
      if (!recomputed[i].requires_grad() || !grads[i].defined()) continue;
      roots.push_back(torch::autograd::impl::gradient_edge(recomputed[i]));
      root_grads.push_back(std::move(grads[i]));
    }
    recomputed.clear();
    grads.clear();
    if (!roots.empty()) {
      if (roots.size() == 1)
        roots[0].function->add_pre_hook(std::make_unique<ReleaseRootGradients>(&root_grads));
      torch::autograd::Engine::get_default_engine().execute(
          roots, root_grads, /*keep_graph=*/false, /*create_graph=*/false,
          /*accumulate_grad=*/true);
    }
    variable_list input_grads;
    for (const at::Tensor& leaf : leaves) input_grads.push_back(leaf.grad());
    return input_grads;
  }

  void release_variables() override {
    inputs_.clear();
    outputs_.clear();
    if (kept_) kept_->clear();
  }

 private:
  SegmentFn fn_;
  std::vector<at::Tensor> inputs_;
  std::vector<at::Tensor> outputs_;  // detached aliases: no reference cycle
  CpuRandomState random_;
  SegmentLabel label_;
  std::unique_ptr<KeptOutputs> kept_;  // selective: outputs the forward kept
  std::string scope_;                  // the module path the segment ran in
};

}  // namespace

std::vector<at::Tensor> checkpoint(const SegmentFn& fn, const std::vector<at::Tensor>& inputs,
                                   SegmentLabel label, const std::vector<std::string>& keep) {
  if (!at::GradMode::is_enabled()) return fn(inputs);
  const CpuRandomState random = CpuRandomState::capture();
  auto kept = keep.empty() ? nullptr : std::make_unique<KeptOutputs>(keep);
  std::vector<at::Tensor> outputs;
  {
    at::NoGradGuard no_grad;
    std::optional<KeptOutputs::Scope> record;
    if (kept) record.emplace(*kept, KeptOutputs::Mode::Record);
    outputs = fn(inputs);
  }
  auto node = c10::make_intrusive<CheckpointBackward>(fn, inputs, random, label, std::move(kept));
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  std::vector<at::Tensor> aliases;
  for (const at::Tensor& output : outputs) {
    bool is_input = false;
    for (const at::Tensor& input : inputs) is_input = is_input || output.is_same(input);
    TORCH_CHECK(!is_input && !output.is_view() && !output.requires_grad(),
                "checkpoint: a segment's outputs must be new tensors, not views or inputs");
    torch::autograd::impl::set_gradient_edge(output, {node, node->add_input_metadata(output)});
    aliases.push_back(output.detach());
  }
  node->keep_outputs(std::move(aliases));
  return outputs;
}

}  // namespace metamem
