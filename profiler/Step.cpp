#include "profiler/Step.h"

#include <ATen/Context.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <stdexcept>

#include "profiler/CpuMemoryCounter.h"
#include "profiler/Tracer.h"

namespace metamem {
namespace {

// Where the phases of a step begin, for whoever watches it. end() comes
// while model, optimizer and loss are still alive.
class PhaseListener {
 public:
  virtual ~PhaseListener() = default;
  virtual void forward(const TrainingStep& step, const std::vector<at::Tensor>& params) = 0;
  virtual void backward(const at::Tensor& loss) = 0;
  virtual void optimizer() = 0;
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

// The step both runs execute.
void run_step(const StepBuilder& build, const StepOptions& options, PhaseListener& phases) {
  std::unique_ptr<TrainingStep> step = build();
  std::vector<at::Tensor> params = step->parameters();
  std::vector<at::Tensor> masters;
  if (options.fp32_master_weights && options.optimizer != Optimizer::None)
    for (const at::Tensor& p : params) masters.push_back(p.detach().to(at::kFloat).requires_grad_());
  auto optimizer = make_optimizer(options.optimizer, masters.empty() ? params : masters);

  phases.forward(*step, params);
  at::Tensor loss = step->forward_loss();
  phases.backward(loss);
  loss.backward();
  if (optimizer) {
    phases.optimizer();
    for (std::size_t i = 0; i < masters.size(); ++i)
      masters[i].mutable_grad() = params[i].grad().to(at::kFloat);
    optimizer->step();
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < masters.size(); ++i) params[i].copy_(masters[i]);
  }
  phases.end();
}

class TracePhases final : public PhaseListener {
 public:
  explicit TracePhases(c10::Device device) : tracer_(device) {}
  void forward(const TrainingStep&, const std::vector<at::Tensor>& params) override {
    for (const at::Tensor& p : params) {
      parameter_bytes_ += static_cast<std::int64_t>(p.numel() * p.element_size());
      parameter_count_ += p.numel();
    }
    tracer_.begin_forward();
  }
  void backward(const at::Tensor& loss) override { tracer_.begin_backward({loss}); }
  void optimizer() override { tracer_.begin_optimizer(); }
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

class CounterPhases final : public PhaseListener {
 public:
  void forward(const TrainingStep& step, const std::vector<at::Tensor>&) override {
    host_only_ = step.host_only_bytes();
    counter_.reset_peak();
  }
  void backward(const at::Tensor&) override {}
  void optimizer() override {}
  void end() override { peak_ = counter_.peak_bytes() - host_only_; }
  std::int64_t peak() const { return peak_; }

 private:
  CpuMemoryCounter counter_;
  std::int64_t host_only_ = 0, peak_ = 0;
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

int optimizer_states_per_parameter(Optimizer optimizer) {
  switch (optimizer) {
    case Optimizer::None:
    case Optimizer::Sgd:
      return 0;
    case Optimizer::Momentum:
      return 1;
    case Optimizer::Adam:
    case Optimizer::AdamW:
      return 2;
  }
  return 0;
}

Trace trace_step(const StepBuilder& build, c10::Device fake_device, const StepOptions& options) {
  TracePhases phases(fake_device);
  run_step(build, options, phases);
  return phases.take();
}

std::int64_t achieved_cpu_peak(const StepBuilder& build, const StepOptions& options) {
  NativeCpuConvolution native_convolution;
  CounterPhases phases;
  run_step(build, options, phases);
  return phases.peak();
}

}  // namespace metamem
