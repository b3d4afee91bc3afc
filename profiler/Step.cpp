#include "profiler/Step.h"

#include <ATen/autocast_mode.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <deque>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>

#include "meta/MetaMode.h"
#include "meta/MetaTensor.h"
#include "profiler/AccumulationHook.h"
#include "profiler/CpuMemoryCounter.h"
#include "profiler/ForLoopAdam.h"
#include "profiler/RepeatedSteps.h"
#include "profiler/ShardedParameters.h"
#include "profiler/Tracer.h"

namespace metamem {
namespace {

// The model-state tensors the steps keep besides the optimizer's own.
struct ModelTensors {
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> shards;      // ZeRO stage 3: the rank's shards of the parameters
  std::vector<at::Tensor> masters;     // fp32 master weights of the parameters the rank updates
  std::vector<at::Tensor> main_grads;  // fp32 main gradients
  std::vector<at::Tensor> buckets;     // DDP's gradient buckets
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

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Optimizer kind, OptimizerImpl impl,
                                                        std::vector<at::Tensor> params) {
  constexpr double lr = 1e-3;
  if (impl == OptimizerImpl::ForLoop && (kind == Optimizer::Adam || kind == Optimizer::AdamW)) {
    const bool adamw = kind == Optimizer::AdamW;  // torch.optim's default weight decays: 0.01 and 0
    return std::make_unique<ForLoopAdam>(std::move(params),
                                         torch::optim::AdamWOptions(lr).weight_decay(adamw ? 1e-2 : 0.0), adamw);
  }
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
      : active_(dtype.has_value()), type_(device.type()) {
    if (!active_) return;
    was_enabled_ = at::autocast::is_autocast_enabled(type_);
    was_dtype_ = at::autocast::get_autocast_dtype(type_);
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
    at::autocast::set_autocast_enabled(type_, enabled);
    at::autocast::set_autocast_dtype(type_, dtype);
  }

  bool active_;
  c10::DeviceType type_;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kFloat;
};

// The parameters the rank's optimizer updates, as ascending indices: all of
// them without ZeRO, and at stage 3 (each its shard).
std::vector<std::size_t> updated_by_rank(const std::vector<at::Tensor>& params, const DataParallel& dp) {
  std::vector<std::size_t> updated;
  if (!dp.active() || dp.zero_stage == 0 || dp.zero_stage == 3) {
    updated.resize(params.size());
    std::iota(updated.begin(), updated.end(), 0);
    return updated;
  }
  std::vector<std::int64_t> numels;
  for (const at::Tensor& p : params) numels.push_back(p.numel());
  const std::vector<int> owner = zero_partition(numels, dp.ranks);
  std::vector<std::int64_t> load(dp.ranks, 0);
  for (std::size_t i = 0; i < params.size(); ++i) load[owner[i]] += numels[i];
  const int rank =
      dp.rank >= 0 ? dp.rank : static_cast<int>(std::max_element(load.begin(), load.end()) - load.begin());
  for (std::size_t i = 0; i < params.size(); ++i)
    if (owner[i] == rank) updated.push_back(i);
  return updated;
}

// One micro-batch between its forward and its backward: the loss, or a
// stage's output whose data was freed once sent (Megatron's
// deallocate_pipeline_outputs), whose gradient arrives into a new buffer.
struct InFlight {
  at::Tensor output;
  std::vector<std::int64_t> sizes;  // the output's, before its data was freed
  bool is_loss = true;

  static InFlight of(at::Tensor output, const PipelineStage& stage) {
    InFlight f{std::move(output), {}, stage.last()};
    if (f.is_loss) return f;
    f.sizes = f.output.sizes().vec();
    f.output.set_data(at::empty({1}, f.output.options()));
    return f;
  }

  void backward() {
    if (is_loss) {
      output.backward();
      return;
    }
    if (!output.requires_grad()) return;
    const at::Tensor received = at::empty(sizes, output.options());
    // The engine checks gradients against the node's shapes, not the freed data's.
    torch::autograd::Engine::get_default_engine().execute({torch::autograd::impl::gradient_edge(output)},
                                                          {received}, /*keep_graph=*/false,
                                                          /*create_graph=*/false, /*accumulate_grad=*/true);
  }
};

enum class Pass { Forward, Backward };

// The passes of one optimizer step on `stage`, in order.
std::vector<Pass> schedule_passes(Schedule schedule, const PipelineStage& stage, int micro_batches) {
  const int warmup =
      schedule == Schedule::GPipe ? micro_batches : std::min(stage.stages - stage.stage - 1, micro_batches);
  std::vector<Pass> passes(static_cast<std::size_t>(warmup), Pass::Forward);
  for (int i = warmup; i < micro_batches; ++i) {
    passes.push_back(Pass::Forward);
    passes.push_back(Pass::Backward);
  }
  passes.insert(passes.end(), static_cast<std::size_t>(warmup), Pass::Backward);
  return passes;
}

// The steps both runs execute.
void run_steps(const StepBuilder& build, const StepOptions& options, PhaseListener& phases) {
  validate(options);
  std::unique_ptr<TrainingStep> step = build();
  const PipelineStage stage = step->pipeline_stage();
  if (stage.stages > 1 && options.data_parallel.zero_stage >= 2)
    throw std::invalid_argument("pipeline parallelism runs with ZeRO stage 0 or 1 (as DeepSpeed and Megatron do)");
  ModelTensors model;
  model.params = step->parameters();
  const DataParallel& dp = options.data_parallel;
  const std::vector<std::size_t> updated = updated_by_rank(model.params, dp);
  std::unique_ptr<ShardedParameters> sharded;
  std::optional<UnitHooksScope> unit_hooks;
  if (dp.zero_stage == 3) {
    sharded = std::make_unique<ShardedParameters>(model.params, step->unit_parameters(), dp.shard_group(),
                                                  dp.forward_prefetch);
    model.shards = sharded->shards();
    unit_hooks.emplace(sharded.get());
  }
  // What holds the rank's parameters and gradients: the shards at stage 3.
  const std::vector<at::Tensor>& held = sharded ? model.shards : model.params;
  const bool mixed = options.fp32_master_weights && options.optimizer != Optimizer::None;
  std::vector<at::Tensor> stepped;  // what the optimizer updates: the fp32 master weights when mixed
  for (std::size_t i : updated) {
    if (mixed) model.masters.push_back(held[i].detach().to(at::kFloat).requires_grad_());
    stepped.push_back(mixed ? model.masters.back() : held[i]);
  }
  // ZeroRedundancyOptimizer steps its partition in the order it dealt it,
  // largest first; mixed-precision optimizers (Megatron's, DeepSpeed's)
  // keep their fp32 master weights in the model's order.
  if (!mixed && (dp.zero_stage == 1 || dp.zero_stage == 2))
    std::stable_sort(stepped.begin(), stepped.end(),
                     [](const at::Tensor& a, const at::Tensor& b) { return a.numel() > b.numel(); });
  if (options.fp32_main_grads)
    for (const at::Tensor& p : model.params) model.main_grads.push_back(at::zeros_like(p, at::kFloat));
  if (dp.active() && dp.zero_stage < 2)
    for (std::int64_t bytes : ddp_bucket_bytes(model.params))
      model.buckets.push_back(at::empty({bytes}, model.params.front().options().dtype(at::kByte)));
  std::vector<c10::intrusive_ptr<torch::autograd::Node>> accumulators;  // keep the hooks alive
  for (std::size_t i = 0; i < model.params.size(); ++i) {
    const bool hands_off = options.fp32_main_grads ||
                           (dp.zero_stage == 2 && !std::binary_search(updated.begin(), updated.end(), i));
    if (!hands_off) continue;
    // Hands the accumulated gradient off and frees it: into the fp32 main
    // gradient (Megatron-LM's hook) when there is one, otherwise to the rank
    // that owns the parameter (ZeRO stage 2).
    auto hand_off = [param = model.params[i],
                     main_grad = options.fp32_main_grads ? model.main_grads[i] : at::Tensor()]() mutable {
      if (!param.grad().defined()) return;
      if (main_grad.defined()) main_grad.add_(param.grad());
      param.mutable_grad().reset();
    };
    if (auto accumulator = after_accumulation(model.params[i], std::move(hand_off)))
      accumulators.push_back(std::move(accumulator));
  }
  auto optimizer = make_optimizer(options.optimizer, options.optimizer_impl, stepped);
  const c10::Device device = model.params.empty() ? c10::Device(c10::kCPU) : model.params.front().device();
  phases.setup(*step, model);

  for (int s = 0; s < options.steps; ++s) {
    phases.step();
    std::deque<InFlight> in_flight;  // micro-batches whose backward has not run
    for (const Pass pass : schedule_passes(options.schedule, stage, options.grad_accum)) {
      if (pass == Pass::Forward) {
        phases.forward();
        if (sharded) sharded->begin_forward();
        AutocastRegion autocast(options.autocast, device);
        in_flight.push_back(InFlight::of(step->forward_loss(), stage));
        continue;
      }
      InFlight micro_batch = std::move(in_flight.front());
      in_flight.pop_front();
      phases.backward(micro_batch.output);
      if (sharded) sharded->begin_backward();
      micro_batch.backward();
      phases.end_backward();
      phases.gradients(grads_of(held));
    }
    if (optimizer) {
      phases.optimizer();
      for (std::size_t m = 0; m < model.masters.size(); ++m) {
        const std::size_t i = updated[m];
        const at::Tensor& grad = options.fp32_main_grads ? model.main_grads[i] : held[i].grad();
        if (grad.defined()) model.masters[m].mutable_grad() = grad.to(at::kFloat);
      }
      phases.gradients(grads_of(model.masters));
      optimizer->step();
      at::NoGradGuard no_grad;
      for (std::size_t m = 0; m < model.masters.size(); ++m) {
        held[updated[m]].copy_(model.masters[m]);
        model.masters[m].mutable_grad().reset();
      }
      phases.optimizer_done();
    }
    zero_grad(held, options.zero_grad);
    if (options.zero_grad != ZeroGrad::None)
      for (at::Tensor& main_grad : model.main_grads) main_grad.zero_();
  }
  phases.end();
}

class TracePhases final : public PhaseListener {
 public:
  explicit TracePhases(c10::Device device) : tracer_(device) {}
  void observe(AllocationObserver* observer) { tracer_.observe(observer); }
  void setup(const TrainingStep&, const ModelTensors& model) override {
    for (const at::Tensor& p : model.params) {
      parameter_bytes_ += static_cast<std::int64_t>(p.numel() * p.element_size());
      parameter_count_ += p.numel();
    }
    tracer_.mark(model.params, Category::Parameter);
    tracer_.mark(model.shards, Category::Parameter);
    tracer_.mark(model.masters, Category::OptimizerState);
    tracer_.mark(model.main_grads, Category::Gradient);
    tracer_.mark(model.buckets, Category::Communication);
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

// A real run's peaks, step by step: restarted where each step begins,
// read where it ends.
class StepPeakPhases : public PhaseListener {
 public:
  void setup(const TrainingStep&, const ModelTensors&) override {}
  void step() override {
    close_step();
    restart_peaks();
    in_step_ = true;
  }
  void forward() override {}
  void backward(const at::Tensor&) override {}
  void end_backward() override {}
  void gradients(const std::vector<at::Tensor>&) override {}
  void optimizer() override {}
  void optimizer_done() override {}
  void end() override { close_step(); }

 protected:
  virtual void restart_peaks() = 0;
  virtual void read_peaks() = 0;  // the step's, which has ended

 private:
  void close_step() {
    if (in_step_) read_peaks();
  }
  bool in_step_ = false;
};

// Each step's peak of the bytes held through the CPU allocator.
class CounterPhases final : public StepPeakPhases {
 public:
  void setup(const TrainingStep& step, const ModelTensors&) override { host_only_ = step.host_only_bytes(); }
  std::vector<std::int64_t> take() { return std::move(peaks_); }

 private:
  void restart_peaks() override { counter_.reset_peak(); }
  void read_peaks() override { peaks_.push_back(counter_.peak_bytes() - host_only_); }
  CpuMemoryCounter counter_;
  std::int64_t host_only_ = 0;
  std::vector<std::int64_t> peaks_;
};

// Each step's peaks in torch's CUDA caching allocator, its statistics'
// peaks restarted as torch.cuda.reset_peak_memory_stats() restarts them.
class CudaPhases final : public StepPeakPhases {
 public:
  CudaPhases() : allocator_(c10::getDeviceAllocator(c10::kCUDA)) {}
  CudaStepPeaks take() { return std::move(peaks_); }

 private:
  static constexpr c10::DeviceIndex kDevice = 0;
  void restart_peaks() override { allocator_->resetPeakStats(kDevice); }
  void read_peaks() override {
    const auto stats = allocator_->getDeviceStats(kDevice);
    constexpr auto all = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    peaks_.allocated.push_back(stats.allocated_bytes[all].peak);
    peaks_.reserved.push_back(stats.reserved_bytes[all].peak);
  }
  c10::DeviceAllocator* allocator_;
  CudaStepPeaks peaks_;
};

// Passes on what an observer has not seen yet: all but the first `seen`
// allocations and frees (a trace run again from its start).
class SeenBefore final : public AllocationObserver {
 public:
  SeenBefore(AllocationObserver* observer, std::size_t seen) : observer_(observer), seen_(seen) {}
  void on_alloc(std::uint32_t buffer, std::int64_t bytes, std::int64_t live_bytes, int stream, int pool) override {
    if (seen_ > 0) {
      --seen_;
      return;
    }
    observer_->on_alloc(buffer, bytes, live_bytes, stream, pool);
  }
  void on_record_stream(std::uint32_t buffer, int stream) override {
    if (seen_ == 0) observer_->on_record_stream(buffer, stream);
  }
  void on_free(std::uint32_t buffer) noexcept override {
    if (seen_ > 0) {
      --seen_;
      return;
    }
    observer_->on_free(buffer);
  }

 private:
  AllocationObserver* observer_;
  std::size_t seen_;
};

Trace traced_steps(const StepBuilder& build, c10::Device fake_device, const StepOptions& options,
                   AllocationObserver* observer) {
  TracePhases phases(fake_device);
  if (observer) phases.observe(observer);
  try {
    run_steps(build, options, phases);
  } catch (const UnsupportedOpError&) {
    throw;
  } catch (const c10::Error& e) {
    // Code that writes or reads a tensor's memory itself, not through an op
    // (at::tensor(values) on the traced device, a kernel reading lengths
    // from a tensor), reaches a MetaTensor's missing data.
    const std::string what = e.what_without_backtrace();
    if (what.rfind(kNoDataMessage, 0) != 0) throw;
    throw UnsupportedOpError("data_ptr", "Tensor.data_ptr()",
                             "the step reads or writes a tensor's memory directly (at::tensor(values) on the "
                             "traced device, lengths or indices read from a tensor), which a trace does not have.");
  }
  return phases.take();
}

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

OptimizerImpl parse_optimizer_impl(const std::string& name) {
  if (name == "libtorch") return OptimizerImpl::Libtorch;
  if (name == "for-loop") return OptimizerImpl::ForLoop;
  throw std::invalid_argument("unknown optimizer implementation '" + name + "' (libtorch, for-loop)");
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

Schedule parse_schedule(const std::string& name) {
  if (name == "1f1b") return Schedule::OneFOneB;
  if (name == "gpipe") return Schedule::GPipe;
  throw std::invalid_argument("unknown pipeline schedule '" + name + "' (known: 1f1b, gpipe)");
}

const char* schedule_name(Schedule schedule) { return schedule == Schedule::GPipe ? "gpipe" : "1f1b"; }

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

std::vector<int> zero_partition(const std::vector<std::int64_t>& numels, int ranks) {
  std::vector<std::size_t> order(numels.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return numels[a] > numels[b]; });
  std::vector<std::int64_t> load(ranks, 0);
  std::vector<int> owner(numels.size());
  for (std::size_t i : order) {
    const int rank = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = rank;
    load[rank] += numels[i];
  }
  return owner;
}

std::vector<std::int64_t> ddp_bucket_bytes(const std::vector<at::Tensor>& params, std::int64_t first_bucket_bytes,
                                           std::int64_t bucket_bytes) {
  struct Open {
    std::int64_t bytes = 0, limit = 0;
  };
  std::map<at::ScalarType, Open> open;
  std::vector<std::int64_t> buckets;
  for (const at::Tensor& p : params) {
    Open& bucket = open.try_emplace(p.scalar_type(), Open{0, first_bucket_bytes}).first->second;
    bucket.bytes += p.numel() * p.element_size();
    if (bucket.bytes < bucket.limit) continue;
    buckets.push_back(bucket.bytes);
    bucket = {0, bucket_bytes};
  }
  for (const auto& [dtype, bucket] : open)
    if (bucket.bytes > 0) buckets.push_back(bucket.bytes);
  return buckets;
}

void validate(const StepOptions& options) {
  if (options.steps < 1) throw std::invalid_argument("steps must be at least 1");
  if (options.grad_accum < 1) throw std::invalid_argument("grad-accum must be at least 1");
  if (options.autocast && *options.autocast != at::kBFloat16 && *options.autocast != at::kHalf)
    throw std::invalid_argument("autocast takes bf16 or f16");
  if (options.fp32_main_grads && !options.fp32_master_weights)
    throw std::invalid_argument(
        "fp32 main gradients are for low-precision parameters with fp32 master weights");
  const DataParallel& dp = options.data_parallel;
  if (dp.ranks < 1) throw std::invalid_argument("data-parallel ranks must be at least 1");
  if (dp.rank >= dp.ranks) throw std::invalid_argument("the rank must be below the data-parallel ranks");
  if (dp.zero_stage < 0 || dp.zero_stage > 3) throw std::invalid_argument("ZeRO stage must be 0, 1, 2 or 3");
  if (dp.zero_stage > 0 && !dp.active()) throw std::invalid_argument("ZeRO needs more than one data-parallel rank");
  if (dp.shard_ranks != 0 && (dp.zero_stage != 3 || dp.shard_ranks < 1 || dp.ranks % dp.shard_ranks != 0))
    throw std::invalid_argument("a shard group is for ZeRO stage 3 and must divide the data-parallel ranks");
  if (dp.forward_prefetch && dp.zero_stage != 3)
    throw std::invalid_argument("forward prefetch gathers ZeRO stage 3's parameters: it needs stage 3");
  if (dp.zero_stage >= 2 && options.fp32_main_grads)
    throw std::invalid_argument("ZeRO stages 2 and 3 reduce gradients themselves: no fp32 main gradients");
}

Trace trace_step(const StepBuilder& build, c10::Device fake_device, const StepOptions& options,
                 AllocationObserver* observer) {
  // Known before tracing, rather than after a step traced in vain (repeat_step
  // finds them too): steps that keep their gradients accumulate into them,
  // and SGD's momentum buffers, copies of the first gradients, are updated
  // by other ops.
  if (options.steps == 1 || !options.repeat_first_step || options.zero_grad != ZeroGrad::SetToNone ||
      options.optimizer == Optimizer::Momentum)
    return traced_steps(build, fake_device, options, observer);
  StepOptions one = options;
  one.steps = 1;
  const Trace first = traced_steps(build, fake_device, one, observer);
  if (std::optional<Trace> repeated = repeat_step(first, options.steps)) {
    if (observer) {
      for (std::size_t e = first.events.size(); e < repeated->events.size(); ++e)
        repeated->tell(repeated->events[e], *observer);
    }
    return std::move(*repeated);
  }
  // The first step again, as the observer has seen it already, then the rest.
  std::size_t seen = 0;
  for (const Event& event : first.events) seen += event.kind != EventKind::Op;
  SeenBefore seen_before(observer, seen);
  return traced_steps(build, fake_device, options, observer ? &seen_before : nullptr);
}

std::vector<std::int64_t> achieved_cpu_step_peaks(const StepBuilder& build,
                                                  const StepOptions& options) {
  CounterPhases phases;
  run_steps(build, options, phases);
  return phases.take();
}

CudaStepPeaks achieved_cuda_step_peaks(const StepBuilder& build, const StepOptions& options) {
  if (!at::hasCUDA()) throw std::runtime_error("libtorch's CUDA library is not loaded, or sees no GPU");
  const StepBuilder on_gpu = [&build] {
    std::unique_ptr<TrainingStep> step = build();
    auto* module = dynamic_cast<torch::nn::Module*>(step.get());
    if (!module) throw std::invalid_argument("a real CUDA run moves its model with Module::to: not a C++ module");
    module->to(c10::Device(c10::kCUDA, 0));
    return step;
  };
  CudaPhases phases;
  run_steps(on_gpu, options, phases);
  return phases.take();
}

}  // namespace metamem
