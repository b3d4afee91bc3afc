#include "profiler/Tracer.h"

#include <c10/util/ScopeExit.h>
#include <ATen/SequenceNumber.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "meta/MetaMode.h"
#include "meta/MetaTensor.h"
#include "profiler/CpuMemoryCounter.h"
#include "profiler/Flops.h"
#include "profiler/PoolRoutes.h"

namespace metamem {
namespace {

// The autograd node whose backward runs on this thread, set by a
// RecordFunction callback around each node.
thread_local std::int64_t t_node = -1;
thread_local const char* t_node_name = nullptr;

std::unique_ptr<at::ObserverContext> enter_node(const at::RecordFunction& fn) {
  t_node = fn.seqNr() < 0 ? -1 : node_id(fn.forwardThreadId(), static_cast<std::uint64_t>(fn.seqNr()));
  t_node_name = fn.name();
  return nullptr;
}

void leave_node(const at::RecordFunction&, at::ObserverContext*) {
  t_node = -1;
  t_node_name = nullptr;
}

std::string qualified_name(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

}  // namespace

namespace detail {

// On a fake cpu, the traced code's own real CPU allocations (a tensor made
// from Python data, an op on real tensors, a Scalar an autograd formula
// wraps) are real memory too: the recorder records them from the CPU
// allocator, leaving out those made inside meta calls (see in_meta_call).
class TraceRecorder final : public MetaObserver, public CpuAllocationListener {
 public:
  using RestoredBlock = Tracer::RestoredBlock;

  TraceRecorder(c10::Device device, HostTensors host) : records_real_(device.is_cpu()) {
    trace_.scopes.push_back("");
    scope_stack_.push_back(0);
    node_callback_ = at::addGlobalCallback(
        at::RecordFunctionCallback(&enter_node, &leave_node)
            .scopes({at::RecordScope::BACKWARD_FUNCTION}));
    mode_.emplace(device, this, host);
    CpuMemoryCounter::set_listener(this);
  }

  ~TraceRecorder() override { stop(); }

  // What a meta call allocates on the CPU (the values a trace knows,
  // computed beside it) is the trace's own, not the step's: while compiling
  // too, whose blocks are told of only once it ends.
  bool hears_allocations_now() const override { return !in_meta_call(); }

  void on_cpu_alloc(void* data, std::size_t bytes) override {
    if (!hears_allocations_now() || bytes == 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!records_real_) {
      real_[data] = 0;  // host memory, not the device's: made in the trace, not recorded
      return;
    }
    const BufferId id = new_buffer_id();
    real_[data] = id;
    record_alloc(id, bytes);
  }

  void on_cpu_free(void* data) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = real_.find(data);
    if (found == real_.end()) return;
    const BufferId id = found->second;
    real_.erase(found);
    if (id != 0) record_free(id);
  }

  RealAllocation real_allocation(const void* data) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = real_.find(data);
    return found == real_.end() ? RealAllocation{0, true} : RealAllocation{found->second, false};
  }

  void on_alloc(BufferId id, std::size_t bytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    record_alloc(id, bytes);
  }

  void on_free(BufferId id) override {
    std::lock_guard<std::mutex> lock(mutex_);
    record_free(id);
  }

  void on_alloc_on_default_stream(BufferId id, std::size_t bytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const int stream = std::exchange(stream_, 0);
    const auto restore = c10::make_scope_exit([&] { stream_ = stream; });
    record_alloc(id, bytes);
  }

  void on_workspace(std::size_t bytes, std::thread::id handle_thread) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto key = std::make_pair(handle_thread, stream_);
    if (workspaces_.count(key) != 0) return;
    const BufferId id = workspaces_[key] = new_buffer_id();
    record_alloc(id, bytes);
    trace_.buffers.back().category = Category::Workspace;
  }

  void on_empty_cache() override { empty_cache(); }

  std::optional<std::size_t> first_granted(const std::vector<std::int64_t>& sizes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!observer_) return 0;
    return observer_->first_granted(sizes, stream_, routes_.pool_for(stream_, std::this_thread::get_id()));
  }

  // `pool`: the private pool that serves it, where it is not the routing's.
  void record_alloc(BufferId id, std::size_t bytes, std::optional<int> pool = std::nullopt) {
    if (trace_.buffers.empty()) first_id_ = id;
    Buffer buffer;
    buffer.bytes = static_cast<std::int64_t>(bytes);
    buffer.phase = phase_;
    buffer.category = phase_ == Phase::Setup ? Category::Input : Category::Temporary;
    buffer.alloc_event = trace_.events.size();
    buffer.stream = static_cast<std::uint8_t>(stream_);
    buffer.pool = static_cast<std::uint16_t>(pool.value_or(routes_.pool_for(stream_, std::this_thread::get_id())));
    trace_.buffers.push_back(buffer);
    const auto index = static_cast<std::uint32_t>(trace_.buffers.size() - 1);
    // No device holds 2^63 bytes: such a request fails as an allocation
    // beyond any device's memory does, rather than wrap the count around.
    if (bytes > static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max() - live_)) {
      refuse(index);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "out of memory: tried to allocate ", bytes, " bytes with ",
                       live_, " bytes live (metamem counts up to 2^63-1 bytes)");
    }
    if (observer_) {
      try {
        observer_->on_alloc(index, buffer.bytes, live_ + buffer.bytes, stream_, buffer.pool);
      } catch (...) {  // out of memory: the request never held anything
        refuse(index);
        throw;
      }
    }
    live_ += buffer.bytes;
    push_event(EventKind::Alloc, index);
  }

  // The buffer keeps its index (ids are consecutive) and no bytes; the
  // trace lists the request, which the code may catch and go on from.
  void refuse(std::uint32_t index) {
    Buffer& buffer = trace_.buffers[index];
    trace_.refused.push_back({index, buffer.bytes, trace_.events.size(), phase_, scope_now()});
    buffer.bytes = 0;
    buffer.refused = true;
  }

  void observe(AllocationObserver* observer) {
    std::lock_guard<std::mutex> lock(mutex_);
    observer_ = observer;
  }

  void set_stream(int stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    stream_ = stream;
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    AllocatorCall call;
    call.event = trace_.events.size();
    tell(call);
  }

  std::uint32_t checkpoint_pool(int pool) {
    std::lock_guard<std::mutex> lock(mutex_);
    AllocatorCall call;
    call.kind = AllocatorCall::Kind::PoolCheckpoint;
    call.event = trace_.events.size();
    call.pool = pool;
    tell(call);
    return pool_checkpoints_++;
  }

  std::vector<BufferId> restore_pool(std::uint32_t checkpoint, int pool, const std::vector<RestoredBlock>& blocks) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (checkpoint >= pool_checkpoints_)
      throw std::invalid_argument("no pool checkpoint " + std::to_string(checkpoint) + " was taken");
    AllocatorCall call;
    call.kind = AllocatorCall::Kind::PoolRestore;
    call.event = trace_.events.size();
    call.pool = pool;
    call.checkpoint = checkpoint;
    // The new buffers take the next indices; the observer hears of the
    // restore, which places them, before their allocations.
    std::vector<BufferId> made;
    for (const RestoredBlock& block : blocks) {
      call.held_by.push_back(block.held_by);
      if (block.kept) {
        call.buffers.push_back(*block.kept);
        continue;
      }
      call.buffers.push_back(static_cast<std::uint32_t>(trace_.buffers.size() + made.size()));
      made.push_back(new_buffer_id());
    }
    tell(call);
    auto id = made.begin();
    for (const RestoredBlock& block : blocks) {
      if (block.kept) continue;
      const int stream = std::exchange(stream_, block.stream);
      const auto restore = c10::make_scope_exit([&] { stream_ = stream; });
      record_alloc(*id, static_cast<std::size_t>(block.bytes), pool);
      TORCH_INTERNAL_ASSERT(index_of(*id) == call.buffers[static_cast<std::size_t>(&block - blocks.data())],
                            "buffer ids of a pool restore are not consecutive");
      ++id;
    }
    return made;
  }

  void tell(const AllocatorCall& call) {
    trace_.allocator_calls.push_back(call);
    if (observer_) observer_->on_allocator_call(trace_.allocator_calls.back());
  }

  std::optional<std::uint32_t> buffer_index(BufferId id) {
    std::lock_guard<std::mutex> lock(mutex_);
    return index_of(id);
  }

  void clear_cublas_workspaces() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [handle, id] : workspaces_) record_free(id);
    workspaces_.clear();
  }

  void begin_allocate_to_pool(int pool, std::optional<int> stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pool < 1 || pool > std::numeric_limits<std::uint16_t>::max())
      throw std::invalid_argument("private pools are numbered 1 to 65535, got " + std::to_string(pool));
    routes_.begin(pool, stream, std::this_thread::get_id());
  }

  void join_pool(int pool, int stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    routes_.join(pool, stream);
  }

  void end_allocate_to_pool(int pool) {
    std::lock_guard<std::mutex> lock(mutex_);
    routes_.end(pool);
  }

  // Tensor.record_stream(): the free of the tensor's buffer waits for the
  // stream's work, where it is not the buffer's own.
  void record_stream(BufferId id, const c10::IValue& stream_value) {
    const std::int64_t stream = stream_value.toStream().id();
    check_stream(stream);
    const auto index = index_of(id);
    if (!index) return;
    Buffer& buffer = trace_.buffers[*index];
    if (stream == buffer.stream) return;
    buffer.used_on_streams |= std::uint32_t{1} << stream;
    if (observer_) observer_->on_record_stream(*index, static_cast<int>(stream));
  }

  void record_free(BufferId id) {
    auto index = index_of(id);
    if (!index || trace_.buffers[*index].refused) return;
    Buffer& buffer = trace_.buffers[*index];
    buffer.free_event = trace_.events.size();
    live_ -= buffer.bytes;
    push_event(EventKind::Free, *index);
    if (observer_) observer_->on_free(*index);
  }

  void on_op(const c10::OperatorHandle& op, c10::ArrayRef<BufferId> inputs,
             c10::ArrayRef<BufferId> outputs, c10::ArrayRef<c10::IValue> arguments,
             c10::ArrayRef<c10::IValue> returns) override {
    std::lock_guard<std::mutex> lock(mutex_);
    OpEvent event;
    event.name = intern_op(op.operator_name());
    if (event.name == record_stream_op_ && !inputs.empty()) record_stream(inputs[0], arguments[1]);
    event.flops = count_flops(flop_rules_[event.name], arguments, returns);
    // Ops an autograd node runs are backward's, whatever the phase (grad(),
    // a recomputation torch.utils.checkpoint makes while backward unpacks).
    event.phase = recomputing_ > 0 ? Phase::Recompute : t_node >= 0 ? Phase::Backward : phase_;
    if (event.phase == Phase::Backward) {
      event.node = t_node;
      if (t_node >= 0 && t_node_name != nullptr) trace_.node_names.try_emplace(t_node, t_node_name);
    } else {
      // A node made for this op took the thread's last sequence number just before.
      const std::uint64_t next = at::sequence_number::peek();
      event.node = next == 0 ? -1 : node_id(at::RecordFunction::currentThreadId(), next - 1);
      event.scope = scope_now();
    }
    const auto op_index = static_cast<std::uint32_t>(trace_.ops.size());
    event.first_input = static_cast<std::uint32_t>(trace_.op_buffers.size());
    for (BufferId id : inputs)
      if (auto index = index_of(id)) trace_.op_buffers.push_back(*index);
    event.n_inputs = static_cast<std::uint32_t>(trace_.op_buffers.size()) - event.first_input;
    event.first_output = static_cast<std::uint32_t>(trace_.op_buffers.size());
    for (BufferId id : outputs) {
      auto index = index_of(id);
      if (!index) continue;
      trace_.op_buffers.push_back(*index);
      Buffer& buffer = trace_.buffers[*index];
      if (buffer.producer_op < 0 && buffer.alloc_event >= events_at_last_op_)
        buffer.producer_op = static_cast<std::int32_t>(op_index);
    }
    event.n_outputs = static_cast<std::uint32_t>(trace_.op_buffers.size()) - event.first_output;
    trace_.ops.push_back(event);
    push_event(EventKind::Op, op_index);
    events_at_last_op_ = trace_.events.size();
  }

  void begin_step() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_step();
  }

  void begin_forward() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (trace_.steps.empty()) open_step();
    phase_ = Phase::Forward;
    trace_.forward_begins.push_back(trace_.events.size());
    if (!forward_pending_) forward_first_buffer_ = trace_.buffers.size();
    forward_pending_ = true;
  }

  void begin_backward(const std::vector<at::Tensor>& outputs) {
    std::unordered_set<std::uint32_t> held;
    std::lock_guard<std::mutex> lock(mutex_);
    for (const at::Tensor& t : outputs)
      if (auto index = index_of_tensor(t)) held.insert(*index);
    trace_.backward_begins.push_back(trace_.events.size());
    forward_pending_ = false;
    for (std::size_t i = forward_first_buffer_; i < trace_.buffers.size(); ++i) {
      Buffer& buffer = trace_.buffers[i];
      if (buffer.free_event == Buffer::kAlive && buffer.category == Category::Temporary &&
          held.count(static_cast<std::uint32_t>(i)) == 0)
        buffer.category = Category::Activation;
    }
    phase_ = Phase::Backward;
  }

  void end_backward() {
    std::lock_guard<std::mutex> lock(mutex_);
    trace_.backward_ends.push_back(trace_.events.size());
  }

  void begin_optimizer() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (phase_ != Phase::Optimizer) optimizer_first_buffer_ = trace_.buffers.size();
    phase_ = Phase::Optimizer;
  }

  // What the optimizer step made and left alive is its state.
  void end_optimizer() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (std::size_t i = optimizer_first_buffer_; i < trace_.buffers.size(); ++i) {
      Buffer& buffer = trace_.buffers[i];
      if (buffer.free_event == Buffer::kAlive && buffer.category == Category::Temporary)
        buffer.category = Category::OptimizerState;
    }
  }

  void mark(const std::vector<at::Tensor>& tensors, Category category) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const at::Tensor& t : tensors)
      if (auto index = index_of_tensor(t)) trace_.buffers[*index].category = category;
  }

  void push_scope(const char* name) {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::string& parent = trace_.scopes[scope_stack_.back()];
    scope_stack_.push_back(intern_scope(parent.empty() ? std::string(name) : parent + "." + name));
  }

  void set_scope_provider(Tracer::ScopeProvider provider) {
    std::lock_guard<std::mutex> lock(mutex_);
    scope_provider_ = std::move(provider);
  }

  std::int64_t begin_region(RegionKind kind, std::int32_t first, std::int32_t last) {
    std::lock_guard<std::mutex> lock(mutex_);
    Region region;
    region.kind = kind;
    region.first = first;
    region.last = last;
    region.grad = at::GradMode::is_enabled();
    region.begin = region.end = trace_.events.size();
    trace_.regions.push_back(region);
    if (kind == RegionKind::Recompute) ++recomputing_;
    return static_cast<std::int64_t>(trace_.regions.size() - 1);
  }

  void set_region_buffer(std::int64_t index, const at::Tensor& tensor, bool output) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto buffer = index_of_tensor(tensor);
    Region& region = trace_.regions[static_cast<std::size_t>(index)];
    (output ? region.output : region.input) = buffer ? static_cast<std::int64_t>(*buffer) : -1;
  }

  void end_region(std::int64_t index) {
    std::lock_guard<std::mutex> lock(mutex_);
    Region& region = trace_.regions[static_cast<std::size_t>(index)];
    region.end = trace_.events.size();
    if (region.kind == RegionKind::Recompute) --recomputing_;
  }

  void pop_scope() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (scope_stack_.size() > 1) scope_stack_.pop_back();
  }

  std::string current_scope() {
    std::lock_guard<std::mutex> lock(mutex_);
    return trace_.scopes[scope_stack_.back()];
  }

  void push_scope_path(std::string path) {
    std::lock_guard<std::mutex> lock(mutex_);
    scope_stack_.push_back(intern_scope(std::move(path)));
  }

  Trace finish() {
    stop();
    if (trace_.steps.empty()) {  // no step was begun: the whole trace is one
      StepSpan whole;
      for (std::size_t e = 0; e < trace_.events.size(); ++e)
        if (trace_.events[e].live_bytes > whole.peak_bytes)
          whole = {0, 0, trace_.events[e].live_bytes, e};
      trace_.steps.push_back(whole);
    }
    // Backward ops belong to the module whose forward op made their node.
    std::unordered_map<std::int64_t, std::uint32_t> node_scope;
    for (const OpEvent& op : trace_.ops)
      if (op.phase == Phase::Forward || op.phase == Phase::Recompute) node_scope.try_emplace(op.node, op.scope);
    for (OpEvent& op : trace_.ops) {
      if (op.phase != Phase::Backward) continue;
      auto it = node_scope.find(op.node);
      if (it != node_scope.end()) op.scope = it->second;
    }
    return std::move(trace_);
  }

 private:
  void open_step() {
    trace_.steps.push_back({trace_.events.size(), live_, live_, trace_.events.size()});
  }

  void stop() {
    if (!mode_) return;
    CpuMemoryCounter::set_listener(nullptr);
    mode_.reset();
    at::removeCallback(node_callback_);
  }

  // The buffer of a MetaTensor, or of a real CPU tensor recorded here.
  std::optional<std::uint32_t> index_of_tensor(const at::Tensor& t) const {
    if (is_meta_tensor(t)) return index_of(buffer_of(t));
    if (!t.defined() || !t.is_cpu()) return std::nullopt;
    const auto found = real_.find(t.storage().data());
    return found == real_.end() || found->second == 0 ? std::nullopt : index_of(found->second);
  }

  std::optional<std::uint32_t> index_of(BufferId id) const {
    if (trace_.buffers.empty() || id < first_id_ || id - first_id_ >= trace_.buffers.size())
      return std::nullopt;
    return static_cast<std::uint32_t>(id - first_id_);
  }

  // The scope an event happens in (the lock held).
  std::uint32_t scope_now() {
    return scope_provider_ ? intern_scope(scope_provider_()) : scope_stack_.back();
  }

  std::uint32_t intern_scope(std::string path) {
    auto [it, added] = scope_ids_.try_emplace(path, trace_.scopes.size());
    if (added) trace_.scopes.push_back(std::move(path));
    return it->second;
  }

  std::uint32_t intern_op(const c10::OperatorName& name) {
    auto [it, added] = op_ids_.try_emplace(&name, trace_.op_names.size());
    if (added) {
      trace_.op_names.push_back(qualified_name(name));
      flop_rules_.push_back(flop_rule(trace_.op_names.back()));
      if (name.name == "aten::record_stream") record_stream_op_ = it->second;
    }
    return it->second;
  }

  void push_event(EventKind kind, std::uint32_t index) {
    trace_.events.push_back({kind, index, live_});
    if (!trace_.steps.empty() && live_ > trace_.steps.back().peak_bytes) {
      trace_.steps.back().peak_bytes = live_;
      trace_.steps.back().peak_event = trace_.events.size() - 1;
    }
  }

  std::mutex mutex_;
  Trace trace_;
  std::uint32_t pool_checkpoints_ = 0;  // taken so far
  Phase phase_ = Phase::Setup;
  int recomputing_ = 0;                    // open Recompute regions
  std::size_t optimizer_first_buffer_ = 0;  // first buffer made by the current optimizer step
  // First buffer made by the forward passes since the last backward began
  // (a pipeline schedule runs several before a backward).
  std::size_t forward_first_buffer_ = 0;
  bool forward_pending_ = false;
  std::int64_t live_ = 0;
  int stream_ = 0;  // the current CUDA stream
  PoolRoutes routes_;  // the private pools requests are routed to
  std::map<std::pair<std::thread::id, int>, BufferId> workspaces_;  // (handle's thread, stream): cuBLAS's
  AllocationObserver* observer_ = nullptr;
  BufferId first_id_ = 0;  // buffer ids of one trace are consecutive
  std::size_t events_at_last_op_ = 0;
  std::vector<std::uint32_t> scope_stack_;
  Tracer::ScopeProvider scope_provider_;
  std::unordered_map<std::string, std::uint32_t> scope_ids_;
  std::unordered_map<const c10::OperatorName*, std::uint32_t> op_ids_;
  std::vector<FlopRule> flop_rules_;  // by op name index
  std::optional<std::uint32_t> record_stream_op_;  // its op name index, once seen
  at::CallbackHandle node_callback_ = 0;
  std::optional<MetaMode> mode_;
  bool records_real_;  // real CPU allocations as the step's memory (a fake cpu)
  // Every real CPU allocation made in the trace, by data pointer: its
  // buffer where recorded, else 0 (a fake cuda's host memory). One not
  // here was made before the trace.
  std::unordered_map<const void*, BufferId> real_;
};

}  // namespace detail

namespace {
std::atomic<detail::TraceRecorder*> g_active_recorder{nullptr};
}

Tracer::Tracer(c10::Device fake_device, HostTensors host)
    : recorder_(std::make_unique<detail::TraceRecorder>(fake_device, host)) {
  g_active_recorder.store(recorder_.get());
}

Tracer::~Tracer() { g_active_recorder.store(nullptr); }

void Tracer::observe(AllocationObserver* observer) { recorder_->observe(observer); }
void Tracer::set_stream(int stream) {
  check_stream(stream);
  recorder_->set_stream(stream);
}

void Tracer::empty_cache() { recorder_->empty_cache(); }
std::uint32_t Tracer::checkpoint_pool(int pool) { return recorder_->checkpoint_pool(pool); }
std::vector<std::uint64_t> Tracer::restore_pool(std::uint32_t checkpoint, int pool,
                                                const std::vector<RestoredBlock>& blocks) {
  return recorder_->restore_pool(checkpoint, pool, blocks);
}
void Tracer::clear_cublas_workspaces() { recorder_->clear_cublas_workspaces(); }
std::optional<std::uint32_t> Tracer::buffer_index(BufferId id) const { return recorder_->buffer_index(id); }

void Tracer::begin_allocate_to_pool(int pool, std::optional<int> stream) {
  if (stream) check_stream(*stream);
  recorder_->begin_allocate_to_pool(pool, stream);
}

void Tracer::join_pool(int pool, int stream) {
  check_stream(stream);
  recorder_->join_pool(pool, stream);
}

void Tracer::end_allocate_to_pool(int pool) { recorder_->end_allocate_to_pool(pool); }
void Tracer::begin_step() { recorder_->begin_step(); }
void Tracer::begin_forward() { recorder_->begin_forward(); }
void Tracer::begin_backward(const std::vector<at::Tensor>& outputs) {
  recorder_->begin_backward(outputs);
}
void Tracer::end_backward() { recorder_->end_backward(); }
void Tracer::begin_optimizer() { recorder_->begin_optimizer(); }
void Tracer::end_optimizer() { recorder_->end_optimizer(); }
void Tracer::mark(const std::vector<at::Tensor>& tensors, Category category) {
  if (auto* recorder = g_active_recorder.load()) recorder->mark(tensors, category);
}

Trace Tracer::finish() {
  g_active_recorder.store(nullptr);
  return recorder_->finish();
}

void Tracer::push_scope(const char* name) {
  if (auto* recorder = g_active_recorder.load()) recorder->push_scope(name);
}

void Tracer::pop_scope() {
  if (auto* recorder = g_active_recorder.load()) recorder->pop_scope();
}

std::string Tracer::current_scope() {
  auto* recorder = g_active_recorder.load();
  return recorder != nullptr ? recorder->current_scope() : std::string();
}

ScopePath::ScopePath(const std::string& path) : active_(g_active_recorder.load() != nullptr) {
  if (auto* recorder = g_active_recorder.load()) recorder->push_scope_path(path);
}

ScopePath::~ScopePath() {
  if (active_) Tracer::pop_scope();
}

std::int64_t Tracer::begin_region(RegionKind kind, std::int32_t first, std::int32_t last) {
  auto* recorder = g_active_recorder.load();
  return recorder != nullptr ? recorder->begin_region(kind, first, last) : -1;
}

void Tracer::end_region(std::int64_t index) {
  if (auto* recorder = g_active_recorder.load(); recorder != nullptr && index >= 0)
    recorder->end_region(index);
}

RegionScope::RegionScope(RegionKind kind, std::int32_t first, std::int32_t last)
    : index_(Tracer::begin_region(kind, first, last)) {}

void Tracer::set_region_buffer(std::int64_t index, const at::Tensor& tensor, bool output) {
  if (auto* recorder = g_active_recorder.load(); recorder != nullptr && index >= 0)
    recorder->set_region_buffer(index, tensor, output);
}

RegionScope::~RegionScope() { Tracer::end_region(index_); }
void RegionScope::set_input(const at::Tensor& input) { Tracer::set_region_buffer(index_, input, false); }
void RegionScope::set_output(const at::Tensor& output) { Tracer::set_region_buffer(index_, output, true); }

void Tracer::set_scope_provider(ScopeProvider provider) {
  if (auto* recorder = g_active_recorder.load()) recorder->set_scope_provider(std::move(provider));
}

}  // namespace metamem
