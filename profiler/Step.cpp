#include "profiler/Step.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <stdexcept>

#include "meta/MetaMode.h"
#include "profiler/CpuMemoryCounter.h"
#include "profiler/Tracer.h"

namespace metamem {
namespace {

// The model-state tensors the steps keep besides the optimizer's own.
struct ModelTensors {
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> masters;     // fp32 master weights
  std::vector<at::Tensor> main_grads;  // fp32 main gradients
};

// Where the phases of the steps begin, for whoever watches them. end()
// comes while model, optimizer and loss are still alive.
class PhaseListener {
 public:
  virtual ~PhaseListener() = default;
  // The model, optimizer and model-state tensors exist; steps follow.
  virtual void setup(const TrainingStep& step, const ModelTensors& model) = 0;
  virtual void step() = 0;
  virtual void forward() = 0;
  virtual void backward(const at::Tensor& loss) = 0;
  virtual void end_backward() = 0;
  // Gradients now held by `tensors` (after a backward pass, or the master
  // weights' before the optimizer step).
  virtual void gradients(const std::vector<at::Tensor>& tensors) = 0;
  virtual void optimizer() = 0;
  virtual void optimizer_done() = 0;
  virtual void end() = 0;
};

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Optimizer kind,
                                                        std::vector<at::Tensor> params) {
  constexpr double lr = 1e-3;
  switch (kind) {
    case Optimizer::None:
      return nullptr;
    case Optimizer::Sgd:
      return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(lr));
    case Optimizer::Momentum:
      return std::make_unique<torch::optim::SGD>(params,
                                                 torch::optim::SGDOptions(lr).momentum(0.9));
    case Optimizer::Adam:
      return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(lr));
    case Optimizer::AdamW:
      return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(lr));
  }
  return nullptr;
}

// Megatron-LM's gradient hook: once autograd has accumulated a parameter's
// gradient, add it into the fp32 main gradient and free it.
class AddToMainGrad final : public torch::autograd::FunctionPostHook {
 public:
  AddToMainGrad(at::Tensor param, at::Tensor main_grad)
      : param_(std::move(param)), main_grad_(std::move(main_grad)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    if (param_.grad().defined()) {
      main_grad_.add_(param_.grad());
      param_.mutable_grad().reset();
    }
    return outputs;
  }

 private:
  at::Tensor param_, main_grad_;
};

std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  return grads;
}

void zero_grad(const std::vector<at::Tensor>& params, ZeroGrad mode) {
  for (const at::Tensor& p : params) {
    at::Tensor& grad = p.mutable_grad();
    if (!grad.defined() || mode == ZeroGrad::None) continue;
    if (mode == ZeroGrad::SetToNone) {
      grad.reset();
    } else {
      grad.detach_();
      grad.zero_();
    }
  }
}

// An autocast region on `device`'s type, as torch.autocast's __enter__ and
// __exit__ make it.
class AutocastRegion {
 public:
  AutocastRegion(c10::optional<at::ScalarType> dtype, c10::Device device)
      : active_(dtype.has_value()), cuda_(device.is_cuda()) {
    if (!active_) return;
    was_enabled_ = cuda_ ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
    was_dtype_ = cuda_ ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
    set(true, *dtype);
    at::autocast::increment_nesting();
  }
  ~AutocastRegion() {
    if (!active_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    set(was_enabled_, was_dtype_);
  }
  AutocastRegion(const AutocastRegion&) = delete;
  AutocastRegion& operator=(const AutocastRegion&) = delete;

 private:
  void set(bool enabled, at::ScalarType dtype) const {
    if (cuda_) {
      at::autocast::set_enabled(enabled);
      at::autocast::set_autocast_gpu_dtype(dtype);
    } else {
      at::autocast::set_cpu_enabled(enabled);
      at::autocast::set_autocast_cpu_dtype(dtype);
    }
  }

  bool active_, cuda_, was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kFloat;
};

// The steps both runs execute.
void run_steps(const StepBuilder& build, const StepOptions& options, PhaseListener& phases) {
  validate(options);
  std::unique_ptr<TrainingStep> step = build();
  ModelTensors model;
  model.params = step->parameters();
  const bool mixed = options.fp32_master_weights && options.optimizer != Optimizer::None;
  for (const at::Tensor& p : model.params) {
    if (mixed) model.masters.push_back(p.detach().to(at::kFloat).requires_grad_());
    if (options.fp32_main_grads) model.main_grads.push_back(at::zeros_like(p, at::kFloat));
  }
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // keep the hooks alive
  for (std::size_t i = 0; i < model.main_grads.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(model.params[i]);
    if (!accumulator) continue;  // needs no gradient
    accumulator->add_post_hook(
        std::make_unique<AddToMainGrad>(model.params[i], model.main_grads[i]));
    accumulators.push_back(std::move(accumulator));
  }
  auto optimizer = make_optimizer(options.optimizer, mixed ? model.masters : model.params);
  phases.setup(*step, model);

  for (int s = 0; s < options.steps; ++s) {
    phases.step();
    for (int micro_batch = 0; micro_batch < options.grad_accum; ++micro_batch) {
      phases.forward();
      at::Tensor loss;
      {
        AutocastRegion autocast(options.autocast, model.params.empty() ? c10::Device(c10::kCPU)
                                                                        : model.params.front().device());
        loss = step->forward_loss();
      }
      phases.backward(loss);
      loss.backward();
      phases.end_backward();
      phases.gradients(grads_of(model.params));
    }
    if (optimizer) {
      phases.optimizer();
      for (std::size_t i = 0; i < model.masters.size(); ++i) {
        const at::Tensor& grad = options.fp32_main_grads ? model.main_grads[i] : model.params[i].grad();
        if (grad.defined()) model.masters[i].mutable_grad() = grad.to(at::kFloat);
      }
      phases.gradients(grads_of(model.masters));
      optimizer->step();
      at::NoGradGuard no_grad;
      for (std::size_t i = 0; i < model.masters.size(); ++i) {
        model.params[i].copy_(model.masters[i]);
        model.masters[i].mutable_grad().reset();
      }
      phases.optimizer_done();
    }
    zero_grad(model.params, options.zero_grad);
    if (options.zero_grad != ZeroGrad::None)
      for (at::Tensor& main_grad : model.main_grads) main_grad.zero_();
  }
  phases.end();
}

class TracePhases final : public PhaseListener {
 public:
  explicit TracePhases(c10::Device device) : tracer_(device) {}
  void setup(const TrainingStep&, const ModelTensors& model) override {
    for (const at::Tensor& p : model.params) {
      parameter_bytes_ += static_cast<std::int64_t>(p.numel() * p.element_size());
      parameter_count_ += p.numel();
    }
    tracer_.mark(model.params, Category::Parameter);
    tracer_.mark(model.masters, Category::OptimizerState);
    tracer_.mark(model.main_grads, Category::Gradient);
  }
  void step() override { tracer_.begin_step(); }
  void forward() override { tracer_.begin_forward(); }
  void backward(const at::Tensor& loss) override { tracer_.begin_backward({loss}); }
  void end_backward() override { tracer_.end_backward(); }
  void gradients(const std::vector<at::Tensor>& grads) override {
    tracer_.mark(grads, Category::Gradient);
  }
  void optimizer() override { tracer_.begin_optimizer(); }
  void optimizer_done() override { tracer_.end_optimizer(); }
  void end() override {
    trace_ = tracer_.finish();
    trace_.parameter_bytes = parameter_bytes_;
    trace_.parameter_count = parameter_count_;
  }
  Trace take() { return std::move(trace_); }

 private:
  Tracer tracer_;
  Trace trace_;
  std::int64_t parameter_bytes_ = 0, parameter_count_ = 0;
};

// Each step's peak: the counter restarts at every step's start.
class CounterPhases final : public PhaseListener {
 public:
  void setup(const TrainingStep& step, const ModelTensors&) override {
    host_only_ = step.host_only_bytes();
  }
  void step() override {
    close_step();
    counter_.reset_peak();
    in_step_ = true;
  }
  void forward() override {}
  void backward(const at::Tensor&) override {}
  void end_backward() override {}
  void gradients(const std::vector<at::Tensor>&) override {}
  void optimizer() override {}
  void optimizer_done() override {}
  void end() override { close_step(); }
  std::vector<std::int64_t> take() { return std::move(peaks_); }

 private:
  void close_step() {
    if (in_step_) peaks_.push_back(counter_.peak_bytes() - host_only_);
  }
  CpuMemoryCounter counter_;
  std::int64_t host_only_ = 0;
  bool in_step_ = false;
  std::vector<std::int64_t> peaks_;
};

// oneDNN's convolutions allocate internal reorders and scratchpads that no
// meta kernel can know; the CPU model is libtorch's native convolution.
class NativeCpuConvolution {
 public:
  NativeCpuConvolution() : was_enabled_(at::globalContext().userEnabledMkldnn()) {
    at::globalContext().setUserEnabledMkldnn(false);
  }
  ~NativeCpuConvolution() { at::globalContext().setUserEnabledMkldnn(was_enabled_); }

 private:
  bool was_enabled_;
};

}  // namespace

Optimizer parse_optimizer(const std::string& name) {
  if (name == "none") return Optimizer::None;
  if (name == "sgd") return Optimizer::Sgd;
  if (name == "momentum") return Optimizer::Momentum;
  if (name == "adam") return Optimizer::Adam;
  if (name == "adamw") return Optimizer::AdamW;
  throw std::invalid_argument("unknown optimizer '" + name +
                              "' (known: none, sgd, momentum, adam, adamw)");
}

const char* optimizer_name(Optimizer optimizer) {
  switch (optimizer) {
    case Optimizer::None: return "none";
    case Optimizer::Sgd: return "sgd";
    case Optimizer::Momentum: return "momentum";
    case Optimizer::Adam: return "adam";
    case Optimizer::AdamW: return "adamw";
  }
  return "?";
}

ZeroGrad parse_zero_grad(const std::string& name) {
  if (name == "set_to_none") return ZeroGrad::SetToNone;
  if (name == "zero") return ZeroGrad::Zero;
  if (name == "none") return ZeroGrad::None;
  throw std::invalid_argument("unknown zero-grad mode '" + name +
                              "' (known: set_to_none, zero, none)");
}

const char* zero_grad_name(ZeroGrad mode) {
  switch (mode) {
    case ZeroGrad::SetToNone: return "set_to_none";
    case ZeroGrad::Zero: return "zero";
    case ZeroGrad::None: return "none";
  }
  return "?";
}

void validate(const StepOptions& options) {
  if (options.steps < 1) throw std::invalid_argument("steps must be at least 1");
  if (options.grad_accum < 1) throw std::invalid_argument("grad-accum must be at least 1");
  if (options.autocast && *options.autocast != at::kBFloat16 && *options.autocast != at::kHalf)
    throw std::invalid_argument("autocast takes bf16 or f16");
  if (options.fp32_main_grads && !options.fp32_master_weights)
    throw std::invalid_argument(
        "fp32 main gradients are for low-precision parameters with fp32 master weights");
}

Trace trace_step(const StepBuilder& build, c10::Device fake_device, const StepOptions& options) {
  TracePhases phases(fake_device);
  try {
    run_steps(build, options, phases);
  } catch (const UnsupportedOpError&) {
    throw;
  } catch (const c10::Error& e) {
    // Code that writes or reads a tensor's memory itself, not through an op
    // (at::tensor(values) on the traced device, a kernel reading lengths
    // from a tensor), reaches a MetaTensor's missing storage.
    const std::string what = e.what_without_backtrace();
    if (what.rfind("Cannot access data pointer", 0) != 0) throw;
    throw UnsupportedOpError("data_ptr", "Tensor.data_ptr()",
                             "the step reads or writes a tensor's memory directly (at::tensor(values) on the "
                             "traced device, lengths or indices read from a tensor), which a trace does not have.");
  }
  return phases.take();
}

std::vector<std::int64_t> achieved_cpu_step_peaks(const StepBuilder& build,
                                                  const StepOptions& options) {
  NativeCpuConvolution native_convolution;
  CounterPhases phases;
  run_steps(build, options, phases);
  return phases.take();
}

}  // namespace metamem
