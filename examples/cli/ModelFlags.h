// The flags that choose a model and its training step, shared by profile
// and fit.
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <string>

#include "estimator/CachingAllocator.h"
#include "estimator/FakeGpuRecordings.h"
#include "estimator/Gpu.h"
#include "estimator/GpuMemory.h"
#include "estimator/Report.h"
#include "examples/cli/Flags.h"
#include "examples/zoo/ScriptModel.h"
#include "examples/zoo/Zoo.h"
#include "meta/CudaAttention.h"
#include "profiler/Step.h"

namespace metamem::cli {

struct ModelFlags {
  ZooConfig zoo;
  std::string device = "cuda";
  std::string gpu = "H100-80GB";     // what a fake-cuda trace's kernel choices are for
  std::string optimizer = "none";
  std::string optimizer_impl = "libtorch";  // or for-loop: torch.optim's Python Adam and AdamW
  std::string dtype = "f32";
  std::vector<std::string> inputs;  // TorchScript models: one --input per forward argument
  std::string loss = "sum";
  std::string alloc_conf = allocator_config_from_environment();  // the simulated CUDA allocator's PYTORCH_ALLOC_CONF
  std::string cuda_context, nccl_buffers;  // measured sizes in place of the estimates ("": estimate)
  std::int64_t steps = 2;
  std::int64_t grad_accum = 1;
  std::string zero_grad = "set_to_none";
  std::string main_grads = "param";  // or fp32
  std::string policy = "none";       // checkpointed units, as "0-3[1-2],5"
  std::string amp = "none";          // autocast: bf16 or f16
  std::string attention = "math";    // or flash (gpt2, llama)
  std::int64_t tp = 1;               // tensor-parallel ranks
  bool sequence_parallel = false;
  bool selective_recompute = false;
  std::int64_t pp = 1;               // pipeline stages
  std::int64_t stage = 0;            // the traced stage
  std::int64_t microbatches = 0;     // per optimizer step under --pp (0: --grad-accum's)
  std::string schedule = "1f1b";     // or gpipe
  std::int64_t dp = 1;               // data-parallel ranks
  std::int64_t zero = 0;             // ZeRO stage
  std::string fsdp = "none";         // full (ZeRO stage 3) or hybrid (sharded within a node)
  bool forward_prefetch = false;     // ZeRO stage 3 / FSDP: gather the next unit in forward too
  std::int64_t gpus_per_node = 8;
  std::int64_t rank = -1;            // the traced rank; -1: the busiest
  std::set<std::string> given;       // the flags given (Flags::record_given)

  void add_to(Flags& flags);
  // Validate what add_to could not (throw std::invalid_argument).
  StepOptions step_options() const;
  ZooConfig config() const;
  bool is_script() const;
  // The zoo batch, or a TorchScript model's first input's first dimension.
  std::int64_t batch() const;
  // The zoo model or the TorchScript file, as configured: its chain
  // checkpointed by --policy, or by `policy` where given.
  StepBuilder builder(const std::optional<CheckpointPolicy>& policy = std::nullopt) const;
  // --gpu, checked.
  const GpuSpec& gpu_spec() const;
  // While alive, fake-cuda kernels (SDPA's backend) are chosen for --gpu,
  // and with $METAMEM_FAKE_GPU set, convolutions and RNNs follow real
  // torch's on that fake GPU made the --gpu (estimator/FakeGpuRecordings.h).
  struct TracedGpu {
    TracedGpuScope kernels;
    std::unique_ptr<FollowRecordingsScope> recordings;
  };
  TracedGpu gpu_scope() const;
  // The simulated CUDA allocator on the --gpu, with --alloc-conf: on a
  // device of `memory` bytes, or of unlimited memory (the bytes a step
  // needs, however many).
  AllocatorSetup allocator(std::int64_t memory = std::numeric_limits<std::int64_t>::max()) const;
  // `total` bytes of the --gpu (0: all of its memory) and what one rank of
  // the layout holds there beside the allocator: the CUDA context and one
  // NCCL communicator per process group of two or more ranks.
  GpuMemory gpu_memory(std::int64_t total = 0) const;
  GpuMemory gpu_memory(std::int64_t total, std::int64_t tp, std::int64_t pp, std::int64_t dp) const;
  // The run as the report names it.
  RunInfo run_info() const;
};

}  // namespace metamem::cli
