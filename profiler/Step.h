// One training step of a model, run either traced on a fake device or for
// real on CPU, from the same code.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "profiler/AllocationObserver.h"
#include "profiler/Trace.h"

namespace metamem {

// Where a model's step sits in a pipeline: stage `stage` of `stages`.
struct PipelineStage {
  int stages = 1, stage = 0;
  bool first() const { return stage == 0; }
  bool last() const { return stage == stages - 1; }
};

// Owns a model's parameters, buffers and inputs (made when it is built) and
// computes the loss of one forward pass.
class TrainingStep {
 public:
  virtual ~TrainingStep() = default;
  // The loss; a pipeline stage before the last returns its output, which
  // the next stage receives.
  virtual at::Tensor forward_loss() = 0;
  virtual PipelineStage pipeline_stage() const { return {}; }
  virtual std::vector<at::Tensor> parameters() = 0;
  // The parameters of each unit of the model's chain (see Chain.h), in
  // order: ZeRO stage 3 gathers them per unit. None: one unit, the model.
  virtual std::vector<std::vector<at::Tensor>> unit_parameters() { return {}; }
  // Host memory the step holds that is no tensor of the model and would not
  // be on a device (the TorchScript loader keeps its debug records): left
  // out of the achieved CPU peak.
  virtual std::int64_t host_only_bytes() const { return 0; }
};

// Builds a step on whatever device factories produce now: MetaTensors under
// a Tracer, real CPU tensors otherwise.
using StepBuilder = std::function<std::unique_ptr<TrainingStep>()>;

enum class Optimizer { None, Sgd, Momentum, Adam, AdamW };

// "none", "sgd", "momentum", "adam", "adamw"; throws std::invalid_argument.
Optimizer parse_optimizer(const std::string& name);
const char* optimizer_name(Optimizer optimizer);

// Whose code Adam and AdamW run: libtorch's C++ classes, or torch.optim's
// Python for-loop (ForLoopAdam.h). SGD's memory is the same in both.
enum class OptimizerImpl { Libtorch, ForLoop };
OptimizerImpl parse_optimizer_impl(const std::string& name);  // "libtorch", "for-loop"; throws

// What happens to gradients after the optimizer step: set_to_none frees
// them (zero_grad()'s default), zero keeps and zeroes them
// (zero_grad(set_to_none=False)), none keeps them as they are.
enum class ZeroGrad { SetToNone, Zero, None };
ZeroGrad parse_zero_grad(const std::string& name);  // throws std::invalid_argument
const char* zero_grad_name(ZeroGrad mode);

// Data parallelism over `ranks` ranks, as `rank` sees it (by default the
// rank holding the most parameter elements). Stage 0 is DDP: every rank keeps all model
// states, and DDP's gradient buckets (flat copies of the gradients, as with
// gradient_as_bucket_view=False). Stage 1 adds ZeroRedundancyOptimizer: the
// parameters are partitioned across ranks by its rule and a rank's
// optimizer states and fp32 master weights are those of its own only.
// Stage 2 also releases the gradients of the other ranks' parameters once
// autograd has accumulated them (reduced to their owner), and keeps no
// buckets. Stage 3 shards every parameter, its gradient and its optimizer
// states, and gathers parameters per unit (see ShardedParameters.h). Other
// collectives move data in place: they cost no memory here.
struct DataParallel {
  int ranks = 1;
  int zero_stage = 0;
  int rank = -1;  // -1: the busiest
  // Stage 3: the ranks one shard group spans (FSDP's HYBRID_SHARD: a node's;
  // the groups replicate each other); 0: all of them.
  int shard_ranks = 0;
  // Stage 3: each unit's forward gathers the next unit's parameters too
  // (FSDP's forward_prefetch=True), so two units are whole at once.
  bool forward_prefetch = false;
  bool active() const { return ranks > 1; }
  int shard_group() const { return shard_ranks > 0 ? shard_ranks : ranks; }
};

// ZeroRedundancyOptimizer's partition (torch.distributed.optim):
// parameters from the largest down, each to the rank with the fewest
// elements so far (the lowest such rank). The owner rank of each of
// `numels`, in their order.
std::vector<int> zero_partition(const std::vector<std::int64_t>& numels, int ranks);

// DDP's buckets: parameters in order, grouped by dtype, a bucket closing once
// it holds `first_bucket_bytes` (the first) or `bucket_bytes` (the rest).
// The bytes of each bucket.
std::vector<std::int64_t> ddp_bucket_bytes(const std::vector<at::Tensor>& params,
                                           std::int64_t first_bucket_bytes = std::int64_t{1} << 20,
                                           std::int64_t bucket_bytes = std::int64_t{25} << 20);

// Pipeline schedules of a stage's micro-batches: GPipe runs every forward,
// then every backward; 1F1B (PipeDream-Flush, Megatron's default) runs
// stages − stage − 1 forwards, then alternates one forward and one backward,
// so that at most stages − stage micro-batches are in flight.
enum class Schedule { OneFOneB, GPipe };
Schedule parse_schedule(const std::string& name);  // "1f1b", "gpipe"; throws std::invalid_argument
const char* schedule_name(Schedule schedule);

struct StepOptions {
  Optimizer optimizer = Optimizer::None;
  // Mixed precision: the optimizer updates fp32 copies of the parameters
  // (made at setup) from fp32 copies of their gradients (made for the
  // optimizer step, freed after it), and the model's low-precision
  // parameters are copied back.
  bool fp32_master_weights = false;
  // Megatron-LM's main gradients: a persistent fp32 buffer per parameter
  // that each gradient is added into as soon as autograd accumulates it;
  // the low-precision gradient is then freed. The fp32 master weights use
  // them as their gradients.
  bool fp32_main_grads = false;
  int steps = 2;       // consecutive training steps; the last is measured
  // Steps after the first repeat its trace where they can (RepeatedSteps.h)
  // instead of being traced: half the time for the same trace.
  bool repeat_first_step = true;
  int grad_accum = 1;  // micro-batches (forward and backward) per optimizer step
  // The order of the micro-batches' passes on a pipeline stage (see
  // TrainingStep::pipeline_stage). A stage before the last frees its
  // output's data once sent, keeping its autograd node (Megatron's
  // deallocate_pipeline_outputs), and receives its gradient into a new
  // buffer; the input a later stage receives is a new buffer too.
  Schedule schedule = Schedule::OneFOneB;
  ZeroGrad zero_grad = ZeroGrad::SetToNone;
  // Mixed precision by autocast: forward and loss run in an autocast region
  // of this dtype on the parameters' device, as under torch.autocast (casts
  // of parameters cached until the region ends). CPU autocast takes bf16 only.
  c10::optional<at::ScalarType> autocast;
  DataParallel data_parallel;
  OptimizerImpl optimizer_impl = OptimizerImpl::Libtorch;
};

// Throws std::invalid_argument for options that cannot run together.
void validate(const StepOptions& options);

// Setup (build, optimizer), then `options.steps` steps of forward, loss,
// backward (per micro-batch), optimizer step and zero_grad on
// `fake_device`. The trace's measured step is the last.
// `observer` sees the allocations and frees as they are recorded, and may
// stop the trace (AllocationObserver.h).
Trace trace_step(const StepBuilder& build, c10::Device fake_device, const StepOptions& options = {},
                 AllocationObserver* observer = nullptr);

// The same steps on real CPU tensors: each step's peak bytes held through
// the CPU allocator, from its start (model states and inputs live) to its end.
// Its kernels are those the process's flags pick (oneDNN's convolutions and
// LSTMs where oneDNN is on, as a trace records them).
std::vector<std::int64_t> achieved_cpu_step_peaks(const StepBuilder& build,
                                                  const StepOptions& options = {});

// Each step's max allocated and max reserved bytes of torch's CUDA caching
// allocator, from the step's start to its end.
struct CudaStepPeaks {
  std::vector<std::int64_t> allocated, reserved;
};

// The same steps by real torch on the current CUDA device (a GPU, or the
// fake GPU of oracle/), as a C++ program runs them: the model built on the
// CPU (`build` must make a torch::nn::Module) and moved to the GPU with
// Module::to, its parameters' order. Throws std::runtime_error where
// libtorch's CUDA library is not loaded or sees no device.
CudaStepPeaks achieved_cuda_step_peaks(const StepBuilder& build, const StepOptions& options = {});

}  // namespace metamem
