// Tracer: records a Trace while a MetaMode is active.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "meta/HostTensors.h"
#include "profiler/AllocationObserver.h"
#include "profiler/Trace.h"

namespace metamem {

namespace detail {
class TraceRecorder;
}

class Tracer {
 public:
  // Starts a MetaMode on `fake_device`: from here on factories make
  // MetaTensors and every buffer is recorded (phase Setup); `host` says
  // where tensors made on the host stand on fake cuda.
  explicit Tracer(c10::Device fake_device, HostTensors host = HostTensors::OnDevice);
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // A training step begins: what is live now (parameters, buffers, inputs,
  // and what earlier steps left) is its starting point.
  void begin_step();
  // A forward pass begins (one per micro-batch); the first begins a step
  // if none was begun.
  void begin_forward();
  // Forward ends. Buffers made in the forward passes since the last
  // backward and still live, other than those the caller holds in
  // `outputs`, are the ones autograd saved.
  void begin_backward(const std::vector<at::Tensor>& outputs);
  // Backward ends: gradients are computed.
  void end_backward();
  void begin_optimizer();
  // The optimizer step ends: what it made and left alive is its state.
  void end_optimizer();
  // The buffers behind `tensors` hold `category`. Buffers made at setup are
  // inputs, and buffers made in a step are temporaries unless marked
  // otherwise (or found to be saved activations or optimizer states).
  // Acts on the active tracer, if any: models may call it.
  static void mark(const std::vector<at::Tensor>& tensors, Category category);
  // From here on `observer` (which outlives the tracer) sees every
  // allocation and free.
  void observe(AllocationObserver* observer);
  // The CUDA stream buffers are allocated on from here on (0: the default;
  // below kMaxStreams, else std::invalid_argument), as torch.cuda.set_stream()
  // makes it current. Tensor.record_stream() is recorded as it runs.
  void set_stream(int stream);
  // torch.cuda.empty_cache() is called here (Trace::allocator_calls, as
  // the two below).
  void empty_cache();
  // A CUDA graph tree keeps private pool `pool`'s layout (c10's
  // getCheckpointState); returns the checkpoint's number.
  std::uint32_t checkpoint_pool(int pool);
  // A block that returning a pool to a checkpoint hands out, which buffer
  // `held_by` (an index) held at the checkpoint: held by buffer `kept`,
  // which holds it now, or by a new buffer of `bytes` on `stream`.
  struct RestoredBlock {
    std::uint32_t held_by = 0;
    std::optional<std::uint32_t> kept;
    std::int64_t bytes = 0;
    int stream = 0;
  };
  // The tree returns the pool to checkpoint `checkpoint` (c10's
  // setCheckpointPoolState), whose allocated blocks are `blocks`. Returns
  // the ids (meta's BufferId) of the new buffers, in order, for storages to
  // hold. std::invalid_argument where the observer's allocator cannot
  // (another layout, no such checkpoint).
  std::vector<std::uint64_t> restore_pool(std::uint32_t checkpoint, int pool, const std::vector<RestoredBlock>& blocks);
  // torch._C._cuda_clearCublasWorkspaces(): every cuBLAS workspace is freed
  // and the next product on each handle and stream makes one again (CUDA
  // graph trees clear them around each warm-up and capture).
  void clear_cublas_workspaces();
  // The trace's index of traced buffer `id` (meta's BufferId; observers are
  // told indices), if this trace made it.
  std::optional<std::uint32_t> buffer_index(std::uint64_t id) const;
  // From here, requests on `stream` (where none is given, the calling
  // thread's requests, as torch.cuda.use_mem_pool routes them) are served
  // by private pool `pool` (1 to 65535), as a CUDA graph's capture routes
  // them (Buffer::pool); the latest routing that takes a request wins.
  // std::invalid_argument for a pool out of range or already routed to,
  // and for ending a routing that was not begun.
  void begin_allocate_to_pool(int pool, std::optional<int> stream = std::nullopt);
  // From here, requests on `stream` too go to `pool`, routed by stream: a
  // stream that joined the capture underway (it waited on the capturing
  // stream's work). std::invalid_argument where `pool` is not so routed.
  void join_pool(int pool, int stream);
  void end_allocate_to_pool(int pool);
  // Ends the MetaMode and returns the trace; no events are recorded after.
  // Without begin_step or begin_forward, the whole trace is one step.
  Trace finish();

  // The innermost module scope: ModuleScope calls these on the active tracer.
  static void push_scope(const char* name);
  static void pop_scope();
  // The module path ops run in now ("" without a tracer).
  static std::string current_scope();

  // Module paths that come from elsewhere (the TorchScript interpreter): while
  // set, each forward op takes the path `provider` returns.
  using ScopeProvider = std::function<std::string()>;
  static void set_scope_provider(ScopeProvider provider);

  // RegionScope calls these on the active tracer; -1: no tracer.
  static std::int64_t begin_region(RegionKind kind, std::int32_t first, std::int32_t last);
  static void end_region(std::int64_t index);
  static void set_region_buffer(std::int64_t index, const at::Tensor& tensor, bool output);

 private:
  std::unique_ptr<detail::TraceRecorder> recorder_;
};

// Marks a region of the trace (see RegionKind) while it lives. Does nothing
// when no tracer is active.
class RegionScope {
 public:
  RegionScope(RegionKind kind, std::int32_t first, std::int32_t last);
  ~RegionScope();
  // The tensors a Unit region reads and returns.
  void set_input(const at::Tensor& input);
  void set_output(const at::Tensor& output);
  RegionScope(const RegionScope&) = delete;
  RegionScope& operator=(const RegionScope&) = delete;

 private:
  std::int64_t index_;
};

// Marks the module a forward op runs in, e.g. ResNet.layer1.0.conv1. Does
// nothing when no tracer is active, so models run unchanged for real.
class ModuleScope {
 public:
  explicit ModuleScope(const char* name) { Tracer::push_scope(name); }
  ~ModuleScope() { Tracer::pop_scope(); }
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;
};

// Puts ops back in a module path taken earlier with Tracer::current_scope()
// (a recomputation runs in backward, outside its module's scopes).
class ScopePath {
 public:
  explicit ScopePath(const std::string& path);
  ~ScopePath();
  ScopePath(const ScopePath&) = delete;
  ScopePath& operator=(const ScopePath&) = delete;

 private:
  bool active_;
};

// Runs `fn` inside module scope `name` and returns its result.
template <typename Fn>
auto scoped(const char* name, Fn&& fn) {
  ModuleScope scope(name);
  return fn();
}

}  // namespace metamem
