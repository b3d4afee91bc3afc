// MetaMode: while one is alive, factory functions make MetaTensors on its
// fake device and every aten op on MetaTensors runs on the meta backend.
// An observer sees each buffer (inner storage) made and freed and each op.
// Real tensors stay real: a tensor made from Python data (torch.tensor) is a
// real CPU tensor, and an op whose tensors are all real runs for real unless
// it puts a tensor on the fake cuda device (optimizers keep step counters so).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include "meta/CpuKernelModel.h"
#include "meta/FakeCuda.h"
#include "meta/HostTensors.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace c10 {
class OperatorHandle;
}

namespace metamem {

// Identifies one allocation for the lifetime of the process (never reused).
using BufferId = std::uint64_t;

// Receives events from any thread: fake-CUDA backward runs on the autograd
// engine's device thread. Implementations synchronise themselves.
class MetaObserver {
 public:
  virtual ~MetaObserver() = default;
  virtual void on_alloc(BufferId id, std::size_t bytes) = 0;
  // An allocation on the default stream, whatever stream is current (CUDA's
  // generator makes a captured graph's seed and offset there, outside the
  // capture's pool).
  virtual void on_alloc_on_default_stream(BufferId id, std::size_t bytes) { on_alloc(id, bytes); }
  virtual void on_free(BufferId id) = 0;
  // A library call that needs the workspace its library makes at the first
  // call of a handle on a stream and keeps (cuBLAS's on a fake CUDA device):
  // reported at every call, for the observer to make it (a new_buffer_id())
  // once per handle and stream. `handle_thread` is the host thread whose
  // handle the call takes, std::thread::id() for autograd's device thread.
  virtual void on_workspace(std::size_t bytes, std::thread::id handle_thread) {}
  // The kernel running empties the caching allocator's cache, as
  // torch.cuda.empty_cache() does (cuDNN's benchmark after its search).
  virtual void on_empty_cache() {}
  // Of requests of `sizes` bytes tried in turn, each after the caching
  // allocator refused the last (and, as c10 does before it gives up, gave
  // its cached segments back), the index of the first it grants; nullopt
  // where it grants none. One that never runs short grants the first.
  virtual std::optional<std::size_t> first_granted(const std::vector<std::int64_t>& sizes) { return 0; }
  // After `op` ran; buffers it created were reported by on_alloc just before.
  // `arguments` and `returns` are the op's MetaTensors and other values.
  virtual void on_op(const c10::OperatorHandle& op, c10::ArrayRef<BufferId> inputs,
                     c10::ArrayRef<BufferId> outputs, c10::ArrayRef<c10::IValue> arguments,
                     c10::ArrayRef<c10::IValue> returns) = 0;
  // What the observer knows of the real CPU allocation at `data`, which it
  // hears of as it is made: the buffer it recorded (a fake cpu's real
  // tensors are the step's memory; 0 where not recorded), and whether it
  // was made before the trace (a model from before the block).
  struct RealAllocation {
    BufferId buffer = 0;
    bool made_before_trace = false;
  };
  virtual RealAllocation real_allocation(const void* data) { return {}; }
};

// An op has no meta kernel: tracing cannot continue. A NotImplementedError,
// so it keeps its kind through the TorchScript interpreter, which rethrows
// other errors as plain std::runtime_error.
class UnsupportedOpError : public c10::NotImplementedError {
 public:
  UnsupportedOpError(const std::string& op, const std::string& schema, const std::string& why);
  // `op`'s kernel needs values of its arguments that the trace does not
  // know (lengths that size its outputs): an error of reading values.
  static UnsupportedOpError values_unknown(const std::string& op, const std::string& why);
  const std::string& op() const { return op_; }
  // It stops where code reads a tensor's value (.item(), bool()) or a
  // kernel needs values.
  bool reads_value() const { return reads_value_; }

 private:
  struct Message {
    std::string text;
    bool reads_value;
  };
  UnsupportedOpError(const std::string& op, Message message);
  std::string op_;
  bool reads_value_;
};

// A traced tensor used after its trace ended (a module moved to the fake
// device inside the block and called after it): it has no data, and no
// trace records what it would do.
class TraceEndedError : public c10::Error {
 public:
  explicit TraceEndedError(const std::string& op);
};

// How metamem's errors (UnsupportedOpError, TraceEndedError) are reported,
// when set: it receives the error and throws (the Python module throws its
// own exception types, which torch's bindings pass on as they are).
// Otherwise the error is thrown.
using ErrorReporter = void (*)(const c10::Error& error);
void set_error_reporter(ErrorReporter reporter);

// Registers metamem's kernels with the dispatcher: for every op the first
// time (a tenth of a second or more), then for the ops defined since (a
// library's custom ops). Each MetaMode does it as it starts; a process
// that forks tracing workers does it first, for all of them.
void register_meta_kernels();

// torch's Python package registers meta functions at the Meta key above
// libtorch's C++ kernels of some 1,300 ops (meta kernels, or composites that
// serve the meta backend), for symbolic shapes. A trace runs the C++ kernel,
// as metamem's own programs do: a Python call per op made a traced step
// many times slower. While the C++ kernels of `ops` ("aten::mm",
// "aten::add.Tensor") are on top, this remembers them, calls `cover` (which
// registers the Python functions back over them), and puts a kernel above
// each that runs the C++ one inside metamem's meta calls (in_meta_call) and
// the one it covers for every other caller: entering and leaving a trace
// then changes no registration. A composite that reads a value on its way
// (linspace's start.item()) gives way to the Python function.
void run_cpp_meta_kernels_in_traces(const std::vector<std::string>& ops,
                                    const std::function<void()>& cover);

class MetaMode {
 public:
  // One MetaMode at a time in the process; a second throws std::logic_error.
  explicit MetaMode(c10::Device fake_device, MetaObserver* observer = nullptr,
                    HostTensors host = HostTensors::OnDevice);
  ~MetaMode();
  MetaMode(const MetaMode&) = delete;
  MetaMode& operator=(const MetaMode&) = delete;

 private:
  // Restores the thread's keys exactly: IncludeDispatchKeyGuard would leave
  // PrivateUse1's backend bit behind.
  c10::impl::ForceDispatchKeyGuard keys_;
  std::optional<FakeCudaScope> fake_cuda_;
};

bool meta_mode_active();
// The number of the MetaMode alive, or of the last: state a process keeps
// (cuDNN's dropout state) is a trace's own, as if each were a process.
std::uint64_t trace_number();

// While alive, ops dispatch as they would outside the active MetaMode: on
// plain meta tensors (a module loaded onto the meta device), whose ops
// libtorch 2.x runs at the Meta key, above metamem's, so that factories
// inside them would otherwise make MetaTensors.
class OutsideMetaMode {
 public:
  OutsideMetaMode();

 private:
  c10::impl::ForceDispatchKeyGuard keys_;
};

// While alive inside an OutsideMetaMode, ops dispatch as in the active
// MetaMode again: what a compile does on the device in a real run
// (Inductor benchmarking a padded matmul) is traced.
class InsideMetaMode {
 public:
  InsideMetaMode();

 private:
  c10::impl::ForceDispatchKeyGuard keys_;
};

// While alive, this thread counts as inside a meta call (in_meta_call):
// what it allocates on the CPU is a kernel's or the trace's own, not the
// step's.
class InsideMetaCall {
 public:
  InsideMetaCall();
  ~InsideMetaCall();
  InsideMetaCall(const InsideMetaCall&) = delete;
  InsideMetaCall& operator=(const InsideMetaCall&) = delete;
};

// While alive, reading a MetaTensor's value (aten::_local_scalar_dense:
// .item(), bool(), a branch on it) gives zero of its dtype (false, 0, 0.0)
// instead of an UnsupportedOpError, so that code that logs a loss or checks
// it goes on. What it read is not the run's value: a branch taken on it is
// the one zero takes.
class PlaceholderValues {
 public:
  // Whether one is alive: kernels that need values the trace does not know
  // take their bounds instead of stopping (ctc_loss's lengths).
  static bool active();
  PlaceholderValues();
  ~PlaceholderValues();
  PlaceholderValues(const PlaceholderValues&) = delete;
  PlaceholderValues& operator=(const PlaceholderValues&) = delete;

 private:
  bool previous_;
};

// Kernels whose temporaries a recording gives instead of metamem's models,
// on a fake cuda: for a call of one of `ops` ("aten::convolution"),
// `source` returns the plan real torch followed for those arguments (the
// caller's MetaTensors) on the fake GPU (estimator/FakeGpuRecordings.h), or nullopt
// to keep the models'. No ops stops it. It serves every trace of the
// process while set; a trace sets it as it starts and stops it as it ends.
using RecordedPlans =
    std::function<std::optional<ScratchPlan>(const std::string& op, c10::ArrayRef<c10::IValue> arguments)>;
void set_recorded_plans(const std::vector<std::string>& ops, RecordedPlans source);

// Whether the kernel running on this thread follows a recording: cuDNN's
// RNN kernels size their reserve space from it, oneDNN's its workspace, and
// they stop without one.
bool in_recorded_call();
// Stops such a kernel where it follows none: `op`, then `why` (whose
// recording it needs).
void check_recorded_call(const char* op, const char* why);

// Stops the trace where `op`'s kernel needs values of its arguments that
// the trace does not know, saying `why` (a ValueReadError in Python).
[[noreturn]] void report_unknown_values(const std::string& op, const std::string& why);

// A plain meta tensor made outside the trace as a MetaTensor of the active
// MetaMode's fake device, its buffer allocated now (once per storage: tied
// weights stay one buffer).
at::Tensor adopt_meta_tensor(const at::Tensor& meta);

// The fake device of the active MetaMode. Meta kernels ask it where the
// device's own kernels differ (the dtype of norm statistics).
c10::Device fake_device();

// The buffer behind a MetaTensor (shared by its views), or behind the meta
// tensor inside one as a kernel receives it, or 0 if it has none.
BufferId buffer_of(const at::Tensor& t);
// The same of a MetaTensor's storage. Precondition: is_meta_storage(storage).
BufferId buffer_of(const c10::Storage& storage);

// CUDA graph trees (torch.compile's mode="reduce-overhead") keep a graph's
// outputs as storages at addresses of its pool whose blocks the allocator
// may hold or not: a storage freed while Python still holds it, and one
// made at an address without allocating. Preconditions: is_meta_storage.
// The address a storage that owns no buffer says it lies at, if any.
std::optional<std::int64_t> claimed_address(const c10::Storage& storage);
// Frees the storage's buffer now, as its deleter would, and leaves it
// owning none at `address` (the block's): trees' _free_And_Remove_DeleterFn.
void free_buffer_now(const c10::Storage& storage, std::int64_t address);
// What reading the storage's address raises (torch's data_ptr access
// error: trees' _set_storage_data_ptr_access_error_msg), if anything.
void set_access_error(const c10::Storage& storage, std::string message);
std::optional<std::string> access_error(const c10::Storage& storage);
// A storage that owns no buffer comes to own buffer `id`, which the tracer
// recorded for it (a block a pool's restore gives back: trees'
// _cuda_setCheckpointPoolState). Throws for a storage that owns one.
void hold_buffer(const c10::Storage& storage, BufferId id);
// A MetaTensor on the trace's device whose buffer is allocated now on the
// default stream, which no capture's routing takes (MetaObserver::
// on_alloc_on_default_stream).
at::Tensor traced_empty_on_default_stream(at::IntArrayRef sizes, at::ScalarType dtype);
// A byte MetaTensor of `bytes` on the trace's device whose storage lies at
// `address` and owns no buffer: trees' _construct_storage_from_data_pointer.
at::Tensor storage_at(std::int64_t address, std::size_t bytes);

// Resizes the storage behind `t` to `bytes`, as FSDP frees (resize to 0) and
// re-allocates a parameter's storage while views of it stay saved: on a
// MetaTensor, the old buffer is freed and one of `bytes` made; a real CPU
// tensor's storage is reallocated.
void resize_storage(const at::Tensor& t, std::size_t bytes);
// The same through a MetaTensor's storage (untyped_storage().resize_(n),
// FSDP2's way). Precondition: is_meta_storage(storage).
void resize_storage(const c10::Storage& storage, std::size_t bytes);

// A buffer id no other buffer has, for an observer recording a buffer of
// its own (a real CPU allocation).
BufferId new_buffer_id();

// Whether this thread is inside an op run on the meta backend: real CPU
// allocations made there (a Scalar wrapped by a composite kernel) are the
// kernels' own, which meta/CpuKernelModel models; a fake cpu's observer
// records only those made outside.
bool in_meta_call();

}  // namespace metamem
