// _metamem: the C++ half of metamem's Python module. A Session traces the
// Python code run while it is open (metamem/__init__.py drives it from
// module hooks and torch.autograd.backward); a Result renders the same
// report as the CLI.
#include <ATen/Context.h>
#include <ATen/record_function.h>
#include <c10/core/AutogradState.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>
#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>

#include "estimator/AllocatorEvents.h"
#include "estimator/CachingAllocator.h"
#include "estimator/Estimate.h"
#include "estimator/FakeGpuRecordings.h"
#include "estimator/Gpu.h"
#include "estimator/HtmlReport.h"
#include "estimator/Report.h"
#include "estimator/Snapshot.h"
#include "estimator/Units.h"
#include "meta/CublasWorkspace.h"
#include "meta/CudaAttention.h"
#include "meta/CudaGraphCapture.h"
#include "meta/DeviceCheck.h"
#include "meta/CudnnRnnCall.h"
#include "meta/FakeCuda.h"
#include "meta/KnownValues.h"
#include "meta/MetaMode.h"
#include "meta/MetaTensor.h"
#include "meta/PreTraceTensors.h"
#include "profiler/CpuMemoryCounter.h"
#include "profiler/Step.h"
#include "profiler/Tracer.h"

namespace py = pybind11;

namespace metamem::python {
namespace {

// metamem.UnsupportedOpError, its ValueReadError and metamem.TraceEndedError: torch's bindings raise
// a PyTorchError as the Python type it names, from wherever in the user's
// code the op ran.
PyObject* g_unsupported_op_error = nullptr;
PyObject* g_value_read_error = nullptr;
PyObject* g_trace_ended_error = nullptr;

struct TypedError final : torch::PyTorchError {
  TypedError(const std::string& message, PyObject* type) : PyTorchError(message), type_(type) {}
  PyObject* python_type() override { return type_ != nullptr ? type_ : PyExc_NotImplementedError; }

 private:
  PyObject* type_;
};

void raise_error(const c10::Error& error) {
  PyObject* type = g_trace_ended_error;
  if (const auto* op = dynamic_cast<const UnsupportedOpError*>(&error))
    type = op->reads_value() ? g_value_read_error : g_unsupported_op_error;
  throw TypedError(error.what_without_backtrace(), type);
}

// torch.cuda.memory_snapshot()'s segments (torch._C._cuda_memorySnapshot's
// "segments"): each cudaMalloc'd segment, or mapped range of an expandable
// one, with its blocks by address, as the simulated allocator holds them.
// No stack frames.
py::list segments_of(const CachingAllocatorSim& allocator) {
  py::list segments;
  const auto& blocks = allocator.blocks();
  for (const auto& range : allocator.snapshot_segments()) {
    py::list segment_blocks;
    for (auto it = blocks.lower_bound(range.address); it != blocks.end() && it->first < range.address + range.size;
         ++it) {
      const auto& block = it->second;
      py::dict b;
      b["address"] = it->first;
      b["size"] = block.size;
      b["requested_size"] = block.allocated ? block.requested : 0;
      b["state"] = block.state();
      b["frames"] = py::list();
      segment_blocks.append(b);
    }
    py::dict segment;
    segment["device"] = 0;
    segment["address"] = range.address;
    segment["total_size"] = range.size;
    segment["stream"] = range.stream;
    segment["segment_type"] = range.small_pool ? "small" : "large";
    segment["segment_pool_id"] = py::make_tuple(0, 0);
    segment["allocated_size"] = range.allocated;
    segment["active_size"] = range.active;
    segment["requested_size"] = range.requested;
    segment["is_expandable"] = range.expandable;
    segment["frames"] = py::list();
    segment["blocks"] = segment_blocks;
    segments.append(segment);
  }
  return segments;
}

void save(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary);
  out << contents;
  if (!out) throw py::value_error("cannot write '" + path + "'");
}

// torch.cuda.memory_stats()'s nested form (torch._C._cuda_memoryStats).
py::dict memory_stats_dict(const AllocatorStats& stats) {
  auto stat = [](const AllocatorStat& s) {
    py::dict d;
    d["current"] = s.current;
    d["peak"] = s.peak;
    d["allocated"] = s.allocated;
    d["freed"] = s.freed;
    return d;
  };
  auto pools = [&](const AllocatorStatArray& array) {
    py::dict d;
    for (std::size_t i = 0; i < array.size(); ++i) d[kStatPoolNames[i]] = stat(array[i]);
    return d;
  };
  py::dict d;
  d["num_alloc_retries"] = stats.num_alloc_retries;
  d["num_ooms"] = stats.num_ooms;
  d["max_split_size"] = stats.max_split_size;
  d["num_sync_all_streams"] = stats.num_sync_all_streams;
  d["num_device_alloc"] = stats.num_device_alloc;
  d["num_device_free"] = stats.num_device_free;
  for (const auto& [name, array] : kStatArrays) d[name] = pools(stats.*array);
  d["oversize_allocations"] = stat(stats.oversize_allocations);
  d["oversize_segments"] = stat(stats.oversize_segments);
  return d;
}

// The fake device's facts, with the table's key and what metamem's model
// adds beside tensors (cuBLAS's workspace, the CUDA context).
py::dict gpu_dict(const GpuSpec& gpu) {
  py::dict d = py::module_::import("json").attr("loads")(fake_device_json(gpu));
  d["key"] = std::string(gpu.key);
  d["cublas_workspace_bytes"] = cublas_workspace_bytes(gpu.major, gpu.minor);
  d["cuda_context_bytes"] = cuda_context_bytes(gpu);
  return d;
}

// What a block's trace says. The peaks are the trace's own; the estimate
// (node table, allocator replay, memonger plan, timeline) is made when
// something first asks for it, so that a block costs its trace alone.
class Result {
 public:
  Result(Trace trace, RunInfo run, AllocatorSetup allocator)
      : trace_(std::move(trace)), run_(std::move(run)), allocator_(std::move(allocator)) {}

  std::int64_t peak_bytes() const { return trace().measured().peak_bytes; }
  std::vector<std::int64_t> step_peaks() const {
    std::vector<std::int64_t> peaks;
    for (const StepSpan& step : trace().steps) peaks.push_back(step.peak_bytes);
    return peaks;
  }
  std::string report() const { return summary_text(run_, estimated()); }
  std::string table(const std::string& kind, int depth, bool csv) const {
    if (kind != "nodes" && kind != "modules")
      throw py::value_error("table kind must be 'nodes' or 'modules', got '" + kind + "'");
    if (depth < 1) throw py::value_error("depth must be at least 1");
    const NodeTable& nodes = estimated().nodes;
    const std::vector<NodeRow> rows = kind == "modules" ? module_table(nodes, depth) : nodes.rows;
    return csv ? rows_csv(rows) : rows_table(rows);
  }
  // (op, bytes) of each allocation and (op, -bytes) of each free, in
  // order; the op is the one whose output the buffer became ("" for none).
  std::vector<std::pair<std::string, std::int64_t>> allocations() const {
    const Trace& trace = this->trace();
    std::vector<std::pair<std::string, std::int64_t>> out;
    for (const Event& event : trace.events) {
      if (event.kind == EventKind::Op) continue;
      const Buffer& buffer = trace.buffers[event.index];
      out.emplace_back(buffer.producer_op < 0 ? "" : trace.op_name(trace.ops[buffer.producer_op]),
                       event.kind == EventKind::Alloc ? buffer.bytes : -buffer.bytes);
    }
    return out;
  }
  std::string to_json(int depth) const { return report_json(run_, estimated(), depth).dump(2); }
  // With `checkpoint` (a checkpoint report's JSON), the page shows that plan too.
  std::string html(int depth, const std::string& checkpoint) const {
    return report_html(report_json(run_, estimated(), depth),
                       checkpoint.empty() ? nlohmann::json(nullptr) : nlohmann::json::parse(checkpoint));
  }
  // FLOPs of the measured step, and of them those recomputed in backward.
  py::dict flops() const {
    const StepFlops flops = trace().measured_flops();
    py::dict out;
    out["total"] = flops.total;
    out["recompute"] = flops.recompute;
    return out;
  }
  void snapshot(const std::string& path) const { save(path, memory_snapshot_pickle(trace(), allocator_)); }
  void save_allocator_events(const std::string& path) const {
    std::ostringstream events;
    write_allocator_events(events, allocator_events(trace()));
    save(path, events.str());
  }

 private:
  const Trace& trace() const { return est_ ? est_->trace : trace_; }
  const Estimate& estimated() const {
    if (!est_) est_ = estimate(std::move(trace_), allocator_);
    return *est_;
  }

  mutable Trace trace_;  // until the estimate takes it
  mutable std::optional<Estimate> est_;
  RunInfo run_;
  AllocatorSetup allocator_;  // the session's
};

// `with Name():` holds a Guard for the block.
template <typename Guard>
struct GuardScope {
  std::optional<Guard> guard;
};

template <typename Guard>
void bind_guard(py::module_& m, const char* name) {
  py::class_<GuardScope<Guard>>(m, name)
      .def(py::init<>())
      .def("__enter__", [](GuardScope<Guard>& scope) { scope.guard.emplace(); })
      .def("__exit__", [](GuardScope<Guard>& scope, const py::args&) { scope.guard.reset(); });
}

// The calling thread's dispatch keys and autograd modes (grad, inference,
// forward AD, multithreading, view replay), as a block found them: its
// keys, and any a failed call inside it left set, must not outlive it.
struct ThreadState {
  c10::impl::LocalDispatchKeySet keys = c10::impl::tls_local_dispatch_key_set();
  c10::AutogradState autograd = c10::AutogradState::get_tls_state();

  void restore() const {
    c10::impl::_force_tls_local_dispatch_key_set(keys);
    c10::AutogradState::set_tls_state(autograd);
  }
  bool operator==(const ThreadState& o) const {
    const c10::AutogradState& a = autograd;
    const c10::AutogradState& b = o.autograd;
    return keys.included_ == o.keys.included_ && keys.excluded_ == o.keys.excluded_ &&
           a.get_grad_mode() == b.get_grad_mode() && a.get_inference_mode() == b.get_inference_mode() &&
           a.get_fw_grad_mode() == b.get_fw_grad_mode() &&
           a.get_multithreading_enabled() == b.get_multithreading_enabled() &&
           a.get_view_replay_enabled() == b.get_view_replay_enabled();
  }
};

struct TracedGpu {
  explicit TracedGpu(const std::string& key) : gpu(metamem::traits_of(metamem::find_gpu(key))) {}
  metamem::GpuTraits gpu;
  std::optional<metamem::TracedGpuScope> guard;
};

// The simulated allocator as torch.cuda's: out of memory, it raises
// torch.cuda.OutOfMemoryError, which scripts catch to try a smaller batch.
class TorchCudaAllocator final : public AllocatorAlongTrace {
 public:
  using AllocatorAlongTrace::AllocatorAlongTrace;
  void on_alloc(std::uint32_t buffer, std::int64_t bytes, std::int64_t live_bytes, int stream, int pool) override {
    try {
      AllocatorAlongTrace::on_alloc(buffer, bytes, live_bytes, stream, pool);
    } catch (const MemoryExceeded& e) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
    }
  }
};

class Session;
std::atomic<Session*> g_session{nullptr};

// A traced block of Python code. The first step begins with the block, the
// others with the first forward or backward after an optimizer's step();
// a forward pass begins with the first module call after a backward.
class Session {
 public:
  // `alloc_conf`: PYTORCH_ALLOC_CONF's text (None: as torch reads the
  // environment); fractions of `gpu`'s memory (a key of metamem's table).
  // `host_tensors`: "device" or "host" (metamem::HostTensors).
  Session(const std::string& device, const std::optional<std::string>& alloc_conf, const GpuSpec& gpu,
          const std::string& host_tensors)
      : run_{.device = device, .alloc_conf = alloc_conf.value_or(allocator_config_from_environment())},
        allocator_setup_(allocator_setup(run_.alloc_conf, alloc_conf ? "alloc_conf" : allocator_config_variable(),
                                         gpu.total_memory)),
        // cuDNN's workspaces fall back where the GPU, beside its CUDA
        // context, cannot hold them.
        allocator_(allocator_setup_, gpu_memory(gpu).allocator_bytes()),
        gpu_(gpu),
        owner_(std::this_thread::get_id()) {
    if (device != "cpu" && device != "cuda")
      throw py::value_error("device must be 'cpu' or 'cuda', got '" + device + "'");
    if (host_tensors != "device" && host_tensors != "host")
      throw py::value_error("host_tensors must be 'device' or 'host', got '" + host_tensors + "'");
    if (device == "cuda") run_.gpu_memory = gpu_memory(gpu);
    tracer_ = std::make_unique<Tracer>(c10::Device(device),
                                       host_tensors == "host" ? HostTensors::OnHost : HostTensors::OnDevice);
    // The simulated allocator answers torch.cuda's memory statistics: a fake cpu has none.
    if (device == "cuda") tracer_->observe(&allocator_);
    tracer_->begin_step();
    g_session.store(this);
    // torch.optim wraps step() and zero_grad() in these record_function scopes.
    callback_ = at::addGlobalCallback(
        at::RecordFunctionCallback(&enter_scope, &leave_scope).scopes({at::RecordScope::USER_SCOPE}));
  }

  ~Session() {
    if (tracer_) close();
  }

  void forward() {
    if (!step_open_) {
      tracer_->begin_step();
      step_open_ = true;
    }
    if (phase_ != Phase::Forward) tracer_->begin_forward();
    phase_ = Phase::Forward;
  }

  void backward(const std::vector<at::Tensor>& outputs) {
    if (!step_open_) forward();
    tracer_->begin_backward(outputs);
    phase_ = Phase::Backward;
  }

  // A module torch.utils.checkpoint recomputes in backward: its ops are
  // the step's recomputation (phase "recompute", their FLOPs its cost).
  std::int64_t begin_recompute() { return Tracer::begin_region(RegionKind::Recompute, -1, -1); }
  void end_recompute(std::int64_t region) { Tracer::end_region(region); }

  void backward_done(const std::vector<at::Tensor>& gradients) {
    tracer_->end_backward();
    tracer_->mark(gradients, Category::Gradient);
  }

  void parameters(const std::vector<at::Tensor>& params) {
    tracer_->mark(params, Category::Parameter);
    for (const at::Tensor& p : params) {
      parameter_bytes_ += static_cast<std::int64_t>(p.numel() * p.element_size());
      parameter_count_ += p.numel();
    }
  }

  // The simulated CUDA caching allocator at this moment of the trace.
  py::dict memory_stats() const { return memory_stats_dict(allocator_.sim.stats()); }
  py::list memory_segments() const { return segments_of(allocator_.sim); }
  // The NCCL communicators of one rank of a job (its process groups of two
  // or more ranks that communicated): their buffers stand beside the
  // allocator on the GPU the report shows.
  void set_nccl_communicators(int count) {
    if (run_.gpu_memory) run_.gpu_memory = gpu_memory(gpu_, 0, {.nccl_communicators = count});
  }
  void reset_peak_memory_stats() { allocator_.sim.reset_peaks(); }
  void reset_accumulated_memory_stats() { allocator_.sim.reset_accumulated(); }
  // In the trace, whose report replays it, and so in the allocator observing it.
  void empty_cache() {
    if (tracer_) tracer_->empty_cache();
  }
  void set_stream(int stream) {
    tracer_->set_stream(stream);
  }
  void clear_cublas_workspaces() { tracer_->clear_cublas_workspaces(); }
  // A CUDA graph's capture: requests on `stream` (where None, the calling
  // thread's) go to private pool `pool` until end_pool.
  void begin_pool(int pool, std::optional<int> stream) {
    tracer_->begin_allocate_to_pool(pool, stream);
  }
  // Stream `stream` joined the capture routed to `pool`.
  void join_pool(int pool, int stream) { tracer_->join_pool(pool, stream); }
  void end_pool(int pool) {
    tracer_->end_allocate_to_pool(pool);
  }
  // Where a traced storage lies on the traced GPU: its block's address in
  // the simulated allocator (from a base where a GPU's addresses are: 0 is
  // no address), or the address a storage owning no block claims; None
  // for a storage that has neither (empty, or of another trace).
  std::optional<std::int64_t> storage_address(const c10::Storage& storage) const {
    if (auto claimed = metamem::claimed_address(storage)) return *claimed;
    const auto index = tracer_->buffer_index(metamem::buffer_of(storage));
    if (!index) return std::nullopt;
    const std::int64_t address = allocator_.sim.address_of(*index);
    if (address == CachingAllocatorSim::kUnallocated) return std::nullopt;
    return kGpuAddressBase + address;
  }
  static constexpr std::int64_t kGpuAddressBase = std::int64_t{0x7f} << 40;
  // The addresses of private pool `pool`'s allocated blocks
  // (torch._C._cuda_checkPoolLiveAllocations compares them).
  std::vector<std::int64_t> pool_allocations(int pool) const {
    std::vector<std::int64_t> addresses;
    for (const auto& [address, buffer] : allocator_.sim.allocations_in_pool(pool))
      addresses.push_back(kGpuAddressBase + address);
    return addresses;
  }

  // CUDA graph trees (metamem._cuda_graph_trees) keep private pool
  // `pool`'s layout after each recording: the checkpoint's number.
  std::uint32_t checkpoint_pool(int pool) { return tracer_->checkpoint_pool(pool); }
  // The tree returns the pool to checkpoint `number`. The blocks the pool
  // holds now at the same places keep their buffers; storages `live`, which
  // own no block, hold the blocks at their addresses again; each other
  // block the checkpoint has allocated is held by a byte tensor, returned
  // by address, until the tree frees it (raw_delete).
  py::dict restore_pool(std::uint32_t number, const py::list& live) {
    const CachingAllocatorSim::PoolCheckpoint& checkpoint = allocator_.sim.checkpoint(number);
    const std::vector<CachingAllocatorSim::PoolBlock> allocated = checkpoint.allocated_blocks();
    const std::map<std::int64_t, std::uint32_t> held = allocator_.sim.allocations_in_pool(checkpoint.pool);
    std::map<std::int64_t, c10::Storage> owners;  // by simulated address
    for (py::handle storage : live) {
      const c10::Storage& s = THPStorage_Unpack(storage.ptr());
      if (auto address = metamem::claimed_address(s)) owners.emplace(*address - kGpuAddressBase, s);
    }
    std::vector<Tracer::RestoredBlock> blocks;
    std::size_t kept = 0;
    for (const auto& block : allocated) {
      const auto same = held.find(block.address);
      if (same != held.end() && allocator_.sim.blocks().at(block.address).size == block.size) {
        blocks.push_back({block.buffer, same->second});
        ++kept;
        continue;
      }
      const auto owner = owners.find(block.address);
      const auto bytes = owner != owners.end() ? static_cast<std::int64_t>(owner->second.nbytes()) : block.size;
      blocks.push_back({block.buffer, std::nullopt, bytes, block.stream});
    }
    // c10 frees them (they are stale: the trees pass none).
    if (kept != held.size())
      throw std::invalid_argument("metamem: a CUDA graph tree returned private pool " +
                                  std::to_string(checkpoint.pool) +
                                  " to a checkpoint without blocks it holds now, which the trace cannot follow");
    const std::vector<std::uint64_t> made = tracer_->restore_pool(number, checkpoint.pool, blocks);
    py::dict unowned;
    auto id = made.begin();
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i].kept) continue;
      const std::int64_t address = allocated[i].address;
      if (const auto owner = owners.find(address); owner != owners.end()) {
        metamem::hold_buffer(owner->second, *id++);
        continue;
      }
      at::Tensor holder = metamem::storage_at(kGpuAddressBase + address, static_cast<std::size_t>(blocks[i].bytes));
      metamem::hold_buffer(holder.storage(), *id++);
      unowned[py::int_(kGpuAddressBase + address)] = py::cast(holder);
    }
    return unowned;
  }

  void push_scope(const std::string& path) { scopes_.emplace_back(std::make_unique<ScopePath>(path)); }
  void pop_scope() {
    if (!scopes_.empty()) scopes_.pop_back();
  }

  Result finish(const std::string& model, const std::string& dtype) {
    scopes_.clear();
    Trace trace = close();
    trace.parameter_bytes = parameter_bytes_;
    trace.parameter_count = parameter_count_;
    run_.model = model;
    run_.dtype = dtype;
    return Result(std::move(trace), run_, allocator_setup_);
  }

 private:
  // As torch.cuda's allocator on the GPU, of unlimited memory: a step
  // larger than the GPU still gets its figures (the fit command answers
  // whether it fits).
  static AllocatorSetup allocator_setup(const std::string& alloc_conf, const std::string& source,
                                        std::int64_t gpu_memory) {
    return {parse_allocator_config(alloc_conf, source), std::numeric_limits<std::int64_t>::max(), gpu_memory};
  }

  // The trace is its thread's: another thread's optimizer is not the step's.
  static Session* on_this_thread() {
    Session* session = g_session.load();
    return session != nullptr && session->owner_ == std::this_thread::get_id() ? session : nullptr;
  }

  static std::unique_ptr<at::ObserverContext> enter_scope(const at::RecordFunction& fn) {
    Session* session = on_this_thread();
    const std::string name = fn.name();
    if (session == nullptr || name.rfind("Optimizer.", 0) != 0) return nullptr;
    session->tracer_->begin_optimizer();
    session->phase_ = Phase::Optimizer;
    // "Optimizer.step#AdamW.step": the optimizer's class.
    const std::size_t hash = name.find('#'), dot = name.find('.', hash);
    if (name.rfind("Optimizer.step#", 0) == 0 && hash != std::string::npos)
      session->run_.optimizer = name.substr(hash + 1, dot - hash - 1);
    return nullptr;
  }

  static void leave_scope(const at::RecordFunction& fn, at::ObserverContext*) {
    Session* session = on_this_thread();
    if (session == nullptr || std::string(fn.name()).rfind("Optimizer.step#", 0) != 0) return;
    session->tracer_->end_optimizer();
    session->step_open_ = false;
  }

  Trace close() {
    if (!tracer_) throw std::logic_error("metamem: the trace was already finished");
    at::removeCallback(callback_);
    g_session.store(nullptr);
    Trace trace = tracer_->finish();
    tracer_.reset();
    return trace;
  }

  RunInfo run_;  // declared first: the allocator reads its PYTORCH_ALLOC_CONF
  AllocatorSetup allocator_setup_;
  TorchCudaAllocator allocator_;  // declared before the tracer: the tracer sees it to the end
  std::unique_ptr<Tracer> tracer_;
  at::CallbackHandle callback_ = 0;
  std::vector<std::unique_ptr<ScopePath>> scopes_;
  Phase phase_ = Phase::Setup;
  bool step_open_ = true;
  std::int64_t parameter_bytes_ = 0, parameter_count_ = 0;
  const GpuSpec& gpu_;  // metamem's table's, which outlives every session
  std::thread::id owner_;
};

// The peak bytes held through the CPU allocator while `step` runs, above
// those held before.
std::int64_t achieved_cpu(const py::function& step) {
  CpuMemoryCounter counter;
  const std::int64_t before = CpuMemoryCounter::live_bytes();
  counter.reset_peak();
  step();
  return counter.peak_bytes() - before;
}

// (op, bytes) of each allocation and (op, -bytes) of each free a real CPU
// run of `step` makes, the op being the innermost one running: where a trace
// and a real run part ways.
class AllocationLog final : public CpuAllocationListener {
 public:
  void on_cpu_alloc(void* data, std::size_t bytes) override {
    sizes[data] = static_cast<std::int64_t>(bytes);
    log.emplace_back(t_ops.empty() ? std::string() : t_ops.back(), static_cast<std::int64_t>(bytes));
  }
  void on_cpu_free(void* data) override {
    const auto it = sizes.find(data);
    if (it == sizes.end()) return;
    log.emplace_back(t_ops.empty() ? std::string() : t_ops.back(), -it->second);
    sizes.erase(it);
  }

  static std::unique_ptr<at::ObserverContext> enter(const at::RecordFunction& fn) {
    t_ops.emplace_back(fn.name());
    return nullptr;
  }
  static void leave(const at::RecordFunction&, at::ObserverContext*) {
    if (!t_ops.empty()) t_ops.pop_back();
  }

  std::vector<std::pair<std::string, std::int64_t>> log;
  std::unordered_map<void*, std::int64_t> sizes;
  static thread_local std::vector<std::string> t_ops;
};
thread_local std::vector<std::string> AllocationLog::t_ops;

std::vector<std::pair<std::string, std::int64_t>> cpu_allocations(const py::function& step) {
  AllocationLog log;
  const at::CallbackHandle handle = at::addGlobalCallback(
      at::RecordFunctionCallback(&AllocationLog::enter, &AllocationLog::leave).scopes({at::RecordScope::FUNCTION}));
  CpuMemoryCounter::set_listener(&log);
  try {
    achieved_cpu(step);
  } catch (...) {
    CpuMemoryCounter::set_listener(nullptr);
    at::removeCallback(handle);
    throw;
  }
  CpuMemoryCounter::set_listener(nullptr);
  at::removeCallback(handle);
  return std::move(log.log);
}

}  // namespace
}  // namespace metamem::python

PYBIND11_MODULE(_metamem, m) {
  // pybind11 raises std::invalid_argument (bad input: a GPU key, a pool
  // number, PYTORCH_ALLOC_CONF's text) as ValueError.
  using namespace metamem::python;
  m.doc() = "metamem's C++ half; use the metamem package.";
  metamem::set_error_reporter(&raise_error);
  m.def("set_error_types", [](py::object unsupported_op, py::object value_read, py::object trace_ended) {
    g_unsupported_op_error = unsupported_op.inc_ref().ptr();
    g_value_read_error = value_read.inc_ref().ptr();
    g_trace_ended_error = trace_ended.inc_ref().ptr();
  });
  // "80GiB" -> bytes, as the command line reads sizes; ValueError naming `what` otherwise.
  m.def("parse_memory", &metamem::parse_memory, py::arg("text"), py::arg("what"));
  m.def("human_bytes", &metamem::human_bytes, py::arg("bytes"));  // "20.00 MiB", as the CLI prints sizes
  m.def("parse_memory_or_zero", &metamem::parse_memory_or_zero, py::arg("text"), py::arg("what"));
  m.def("gpu", [](const std::string& key) { return gpu_dict(metamem::find_gpu(key)); });
  // `total` bytes of `gpu` (0: all of its memory) and what it holds beside
  // the allocator (docs/gpu-memory.md), as the report's JSON has it;
  // `cuda_context`: a measured size in place of the estimate;
  // `nccl_communicators`: the job's process groups of two or more ranks.
  m.def(
      "gpu_memory_json",
      [](const std::string& gpu, std::int64_t total, std::optional<std::int64_t> cuda_context,
         int nccl_communicators) {
        return metamem::gpu_memory_json(
                   metamem::gpu_memory(metamem::find_gpu(gpu), total,
                                       {.nccl_communicators = nccl_communicators, .cuda_context = cuda_context}))
            .dump();
      },
      py::arg("gpu"), py::arg("total") = 0, py::arg("cuda_context") = py::none(), py::arg("nccl_communicators") = 0);
  // A checkpointing plan that a search of traces found (metamem checkpoint
  // --hf): (the CLI's text, its JSON), as the zoo's plans print.
  m.def(
      "checkpoint_report",
      [](const std::string& model, const std::string& device, std::int64_t batch, const std::string& dtype,
         const std::string& optimizer, std::int64_t budget, const std::string& solver, const std::string& policy,
         const std::vector<std::string>& units, std::int64_t peak, std::int64_t unchecked_peak,
         std::int64_t recompute_flops, std::int64_t step_flops, double search_ms, std::int32_t traces,
         const std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>& pareto) {
        metamem::CheckpointReport report;
        report.run.model = model;
        report.run.device = device;
        report.run.batch = batch;
        report.run.dtype = dtype;
        report.run.optimizer = optimizer;
        report.budget = budget;
        report.solver = solver;
        report.policy = metamem::parse_policy(policy);
        report.unit_names = units;
        report.peak_bytes = report.retraced_peak_bytes = peak;
        report.unchecked_peak_bytes = unchecked_peak;
        report.recompute_flops = recompute_flops;
        report.step_flops = step_flops;
        report.solver_ms = search_ms;
        report.traces = traces;
        for (const auto& [at, reached, flops] : pareto) report.pareto.push_back({at, reached, flops});
        return std::make_pair(metamem::checkpoint_text(report), metamem::checkpoint_json(report).dump(2));
      },
      py::arg("model"), py::arg("device"), py::arg("batch"), py::arg("dtype"), py::arg("optimizer"),
      py::arg("budget"), py::arg("solver"), py::arg("policy"), py::arg("units"), py::arg("peak"),
      py::arg("unchecked_peak"), py::arg("recompute_flops"), py::arg("step_flops"), py::arg("search_ms"),
      py::arg("traces"), py::arg("pareto"));
  m.def("gpu_keys", [] {
    std::vector<std::string> keys;
    for (const metamem::GpuSpec& gpu : metamem::known_gpus()) keys.emplace_back(gpu.key);
    return keys;
  });
  // `with PlaceholderValues():` reading a traced tensor's value gives zero.
  bind_guard<metamem::PlaceholderValues>(m, "PlaceholderValues");
  // `with OutsideTrace():` ops dispatch as outside the trace (FakeTensorMode's
  // meta tensors stay plain meta tensors).
  bind_guard<metamem::OutsideMetaMode>(m, "OutsideTrace");
  // `with InsideTrace():` within OutsideTrace, ops dispatch as in the trace again.
  bind_guard<metamem::InsideMetaMode>(m, "InsideTrace");
  // `with UncountedCpu():` this thread's CPU allocations are not the step's
  // (compiling), in a trace and in achieved_cpu.
  bind_guard<metamem::UncountedCpuAllocations>(m, "UncountedCpu");
  // `with TracedGpu(key):` fake-cuda kernels are chosen for that GPU of
  // metamem's table.
  py::class_<TracedGpu>(m, "TracedGpu")
      .def(py::init<const std::string&>())
      .def("__enter__", [](TracedGpu& scope) { scope.guard.emplace(scope.gpu); })
      .def("__exit__", [](TracedGpu& scope, const py::args&) { scope.guard.reset(); });
  py::class_<Result>(m, "Result")
      .def_property_readonly("peak_bytes", &Result::peak_bytes)
      .def_property_readonly("step_peaks", &Result::step_peaks)
      .def("report", &Result::report)
      .def("table", &Result::table, py::arg("kind"), py::arg("depth"), py::arg("csv"))
      .def("allocations", &Result::allocations)
      .def("to_json", &Result::to_json, py::arg("depth"))
      .def("html", &Result::html, py::arg("depth"), py::arg("checkpoint") = "")
      .def("flops", &Result::flops)
      .def("snapshot", &Result::snapshot, py::arg("path"))
      .def("save_allocator_events", &Result::save_allocator_events, py::arg("path"));
  py::class_<Session>(m, "Session")
      .def(py::init([](const std::string& device, const std::optional<std::string>& alloc_conf,
                       const std::string& gpu, const std::string& host_tensors) {
             return new Session(device, alloc_conf, metamem::find_gpu(gpu), host_tensors);
           }),
           py::arg("device"), py::arg("alloc_conf"), py::arg("gpu"), py::arg("host_tensors") = "device")
      .def("set_stream", &Session::set_stream)
      .def("begin_pool", &Session::begin_pool, py::arg("pool"), py::arg("stream"))
      .def("join_pool", &Session::join_pool, py::arg("pool"), py::arg("stream"))
      .def("end_pool", &Session::end_pool, py::arg("pool"))
      .def("pool_allocations", &Session::pool_allocations, py::arg("pool"))
      .def("checkpoint_pool", &Session::checkpoint_pool, py::arg("pool"))
      .def("restore_pool", &Session::restore_pool, py::arg("checkpoint"), py::arg("live"))
      .def("storage_address", [](const Session& session, py::handle storage) {
        return session.storage_address(THPStorage_Unpack(storage.ptr()));
      }, py::arg("storage"))
      .def("forward", &Session::forward)
      .def("backward", &Session::backward)
      .def("backward_done", &Session::backward_done)
      .def("begin_recompute", &Session::begin_recompute)
      .def("end_recompute", &Session::end_recompute, py::arg("region"))
      .def("parameters", &Session::parameters)
      .def("push_scope", &Session::push_scope)
      .def("pop_scope", &Session::pop_scope)
      .def("memory_stats", &Session::memory_stats)
      .def("memory_segments", &Session::memory_segments)
      .def("set_nccl_communicators", &Session::set_nccl_communicators, py::arg("count"))
      .def("reset_peak_memory_stats", &Session::reset_peak_memory_stats)
      .def("reset_accumulated_memory_stats", &Session::reset_accumulated_memory_stats)
      .def("empty_cache", &Session::empty_cache)
      .def("clear_cublas_workspaces", &Session::clear_cublas_workspaces)
      .def("finish", &Session::finish);
  py::class_<ThreadState>(m, "ThreadState", "The calling thread's dispatch keys and autograd modes, now.")
      .def(py::init<>())
      .def("restore", &ThreadState::restore, "Makes them the thread's again.")
      .def("__eq__", &ThreadState::operator==);
  m.def("is_traced", [](const at::Tensor& t) { return metamem::is_meta_tensor(t); }, py::arg("tensor"),
        "Whether a tensor is a trace's (on the fake device; no data).");
  m.def(
      "forget_values",
      [](const at::Tensor& t) {
        if (t.defined() && metamem::is_meta_tensor(t)) metamem::forget_values(metamem::buffer_of(t));
      },
      py::arg("tensor"), "The trace no longer knows the values of the tensor's buffer (another rank wrote them).");
  m.def(
      "exchange_grad",
      [](const at::Tensor& t, std::optional<at::Tensor> grad) -> std::optional<at::Tensor> {
        at::Tensor had = std::exchange(t.mutable_grad(), grad.value_or(at::Tensor()));
        return had.defined() ? std::optional<at::Tensor>(had) : std::nullopt;
      },
      py::arg("tensor"), py::arg("grad"),
      "Sets a tensor's .grad without torch's checks of its device and kind, and returns the one it had: a "
      "parameter on the host lends the gradient of its fake-cuda replacement to a hook.");
  m.def(
      "keep_grad_of_leaf", [](const at::Tensor& t) { metamem::keep_grad_of_leaf(t); }, py::arg("tensor"),
      "A real tensor from before the trace, where it is a leaf that requires grad: its .grad as it is, put back "
      "when the trace ends (compiled code passes a parameter to its kernels through an alias autograd does not "
      "know).");
  m.def("known_values", [](const at::Tensor& t) -> std::optional<at::Tensor> { return metamem::known_values(t); },
        py::arg("tensor"), "A traced tensor's values as a real CPU tensor, if the trace knows them; else None.");
  // A trace follows the fake GPU's recordings inside `with recordings:`.
  struct FollowedRecordings {
    metamem::FakeGpuRecordings recordings;
    std::unique_ptr<metamem::FollowRecordingsScope> following;
  };
  py::class_<FollowedRecordings>(
      m, "FakeGpuRecordings",
      "Real torch on the fake GPU of `folder` made `gpu`, run by `python` with the program `server`, asked once "
      "per distinct call of the ops whose temporaries only cuDNN knows (metamem._fake_gpu); a trace inside "
      "`with` follows its recordings. ValueError: no fake GPU in `folder`.")
      .def(py::init([](const std::string& folder, const std::string& gpu, const std::string& python,
                       const std::string& server) {
             return FollowedRecordings{{{folder, python, server}, metamem::find_gpu(gpu)}, nullptr};
           }),
           py::arg("folder"), py::arg("gpu"), py::arg("python"), py::arg("server"))
      .def("__enter__", [](FollowedRecordings& self) {
        self.following = std::make_unique<metamem::FollowRecordingsScope>(self.recordings);
      })
      .def("__exit__", [](FollowedRecordings& self, py::args) { self.following.reset(); });
  m.def(
      "cudnn_rnn",
      [](std::int64_t mode, const at::Tensor& input, const at::Tensor& hx, const std::optional<at::Tensor>& cx,
         const std::vector<at::Tensor>& weights, bool has_biases, std::int64_t num_layers, double dropout, bool train,
         bool bidirectional, bool batch_first, const std::vector<std::int64_t>& batch_sizes,
         const std::function<bool()>& reseeded) {
        return metamem::run_cudnn_rnn(static_cast<metamem::CudnnRnnMode>(mode), input, hx, cx.value_or(at::Tensor()),
                                      weights, has_biases, num_layers, dropout, train, bidirectional, batch_first,
                                      batch_sizes, reseeded);
      },
      "torch._VF's RNN `mode` (cudnnRNNMode_t) as torch runs it on cuDNN (meta/CudnnRnnCall.h): (output, hy, cy); "
      "reseeded() says, where the RNN drops out in training, whether the generator was seeded since cuDNN's "
      "dropout state was made.");
  m.def(
      "cudnn_rnn_weight_space",
      [](const std::vector<at::Tensor>& weights, std::int64_t mode, std::int64_t hidden_size, std::int64_t num_layers,
         bool bidirectional, bool has_biases) {
        return metamem::cudnn_rnn_weight_space(weights, static_cast<metamem::CudnnRnnMode>(mode), hidden_size,
                                               num_layers, bidirectional, has_biases);
      },
      "The elements of cuDNN's weight space for an RNN's weights.");
  m.def("fake_gpu_environment", &metamem::fake_gpu_environment, py::arg("folder"),
        "This process's environment (NAME=VALUE each) for a child whose CUDA is the fake GPU of `folder`.");
  m.def("run_cpp_meta_kernels_in_traces", &metamem::run_cpp_meta_kernels_in_traces, py::arg("ops"),
        py::arg("cover"));
  // A traced tensor's untyped_storage() stands for its buffer: FSDP2 frees
  // and re-makes a parameter's buffer by resizing it, and tells storages
  // apart by address.
  m.def("is_traced_storage", [](py::handle storage) {
    return THPStorage_Check(storage.ptr()) && metamem::is_meta_storage(THPStorage_Unpack(storage.ptr()));
  });
  m.def("resize_traced_storage", [](py::handle storage, std::size_t bytes) {
    metamem::resize_storage(THPStorage_Unpack(storage.ptr()), bytes);
  });
  // A CUDA graph's capture (metamem._cuda._Captures): kernels that ask
  // CUDA's capture status take their capture path.
  m.def("begin_graph_capture", &metamem::begin_graph_capture);
  m.def("end_graph_capture", &metamem::end_graph_capture,
        "Ends a capture; returns what the graph keeps for its life (CUDA's generator's seed and offset).");
  m.def("read_generator_state_in_capture", &metamem::read_generator_state_in_capture);
  // The ops whose CUDA kernels refuse tensors on two devices
  // (metamem._device_checks, from torch's native_functions.yaml).
  m.def("set_device_checks", &metamem::set_device_checks);
  // CUDA graph trees' storages (metamem._cuda_graph_trees).
  m.def("traced_storage_owns_buffer", [](py::handle storage) {
    return metamem::buffer_of(THPStorage_Unpack(storage.ptr())) != 0;
  });
  m.def("free_traced_storage_now", [](py::handle storage, std::int64_t address) {
    metamem::free_buffer_now(THPStorage_Unpack(storage.ptr()), address);
  });
  m.def("traced_autograd_multithreading", &metamem::traced_autograd_multithreading,
        "The traced code's torch.autograd.set_multithreading_enabled setting (fake cuda).");
  m.def("set_traced_autograd_multithreading", &metamem::set_traced_autograd_multithreading, py::arg("enabled"));
  m.def("set_traced_storage_access_error", [](py::handle storage, std::string message) {
    metamem::set_access_error(THPStorage_Unpack(storage.ptr()), std::move(message));
  });
  m.def("traced_storage_access_error",
        [](py::handle storage) { return metamem::access_error(THPStorage_Unpack(storage.ptr())); });
  m.def("traced_storage_at", &metamem::storage_at, py::arg("address"), py::arg("bytes"),
        "A byte tensor on the trace's device whose storage lies at `address` and owns no block.");
  m.def("achieved_cpu", &achieved_cpu, py::arg("step"));
  m.def("cpu_allocations", &cpu_allocations, py::arg("step"));
}
