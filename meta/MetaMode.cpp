#include "meta/MetaMode.h"

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/graph_task.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "meta/CpuKernelModel.h"
#include "meta/CpuKernelRecording.h"
#include "meta/CublasWorkspace.h"
#include "meta/CudaAttention.h"
#include "meta/CudaKernelPlans.h"
#include "meta/CudaReduction.h"
#include "meta/CudaGraphCapture.h"
#include "meta/DeviceCheck.h"
#include "meta/KnownValues.h"
#include "meta/MetaKernels.h"
#include "meta/MetaTensor.h"
#include "meta/OwnKernel.h"
#include "meta/PreTraceTensors.h"
#include "meta/TensorArguments.h"

namespace metamem {
namespace {

// The tag a traced storage carries as its DataPtr context. Its deleter runs
// when the storage dies, which is exactly when a real buffer would be freed.
struct BufferTag {
  BufferId id;
  std::size_t bytes;
  // Where a storage that owns no buffer says it lies (CUDA graph trees'
  // storages over a graph's pool, and those whose buffer they freed); -1
  // for none.
  std::int64_t claimed_address = -1;
  // What reading its address raises, once CUDA graph trees freed the block
  // under it (torch's data_ptr access error); none where null.
  std::shared_ptr<const std::string> access_error{};
  // Host memory in a trace that keeps host tensors on the host
  // (HostTensors::OnHost): not the device's, so not reported.
  bool host = false;
};

struct ModeState {
  std::atomic<bool> active{false};
  std::atomic<MetaObserver*> observer{nullptr};
  c10::Device device{c10::kCPU};
  // A fake-cuda trace whose host tensors stay on the host (HostTensors::OnHost).
  bool keeps_host = false;
  // cuBLAS's workspace on the traced GPU, read at the first product (after
  // the trace's GPU is set) rather than at every one; -1 until then.
  std::atomic<std::int64_t> cublas_workspace_bytes{-1};
  // The meta kernel as PrivateUse1 kernel of the ops a GPU runs fused and a
  // CPU decomposes (cuda_only_ops), for a fake-cuda trace's length.
  std::vector<c10::RegistrationHandleRAII> cuda_only_kernels;
  // MetaModes begun in the process.
  std::atomic<std::uint64_t> traces{0};
};

ModeState g_mode;

std::atomic<BufferId> g_next_buffer{1};
// Host buffers (HostTensors::OnHost) are numbered apart: the observer
// numbers its buffers in the order their ids were handed out, each reported.
std::atomic<BufferId> g_next_host_buffer{BufferId{1} << 63};

void release_tag(void* ctx) {
  auto* tag = static_cast<BufferTag*>(ctx);
  auto* observer = g_mode.observer.load(std::memory_order_acquire);
  if (observer != nullptr && tag->id != 0 && !tag->host) observer->on_free(tag->id);
  if (tag->id != 0) forget_values(tag->id);
  delete tag;
}

// An efficient zero tensor (autograd's gradient where a derivative is zero:
// sgn's, a masked-out branch's) has the storage of its size and no memory:
// its allocator hands out nothing. Its tag holds buffer 0, none. The op is
// found once, when the kernel is registered.
const c10::OperatorName* g_zero_tensor = nullptr;

// The op through which .item(), bool() and a branch read a tensor's value,
// likewise found once.
const c10::OperatorName* g_value_read = nullptr;

void hold_no_memory(const at::Tensor& inner) {
  c10::StorageImpl* impl = inner.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(
      c10::DataPtr(nullptr, new BufferTag{0, impl->nbytes()}, &release_tag, c10::Device(c10::kMeta)));
}

// Tags a storage the first time it is seen and reports it as allocated; a
// storage that grew (resize_ of an out= argument) is reported as a new buffer.
// An empty storage holds no buffer: allocators hand out nothing for zero
// bytes (a released ZeRO-3 parameter keeps one). A host storage (`host`, or
// tagged so) gets a buffer id, which known values are kept by, and is not
// reported.
BufferId track_storage(c10::StorageImpl* impl, bool on_default_stream = false, bool host = false) {
  if (impl == nullptr) return 0;
  auto* tag = static_cast<BufferTag*>(impl->data_ptr().get_context());
  if (tag != nullptr && tag->bytes == impl->nbytes()) return tag->id;
  if (impl->nbytes() == 0) {
    if (tag != nullptr) impl->set_data_ptr_noswap(c10::DataPtr(nullptr, c10::Device(c10::kMeta)));
    return 0;
  }

  host = host || (tag != nullptr && tag->host);
  auto fresh = std::make_unique<BufferTag>(
      BufferTag{(host ? g_next_host_buffer : g_next_buffer).fetch_add(1), impl->nbytes()});
  fresh->host = host;
  if (auto* observer = g_mode.observer.load(std::memory_order_acquire); observer != nullptr && !fresh->host) {
    // may throw (a tracer told to stop)
    if (on_default_stream)
      observer->on_alloc_on_default_stream(fresh->id, fresh->bytes);
    else
      observer->on_alloc(fresh->id, fresh->bytes);
  }
  const BufferId id = fresh->id;
  // Swapping in the new DataPtr releases the old tag: alloc-then-free, as a
  // real reallocation does.
  impl->set_data_ptr_noswap(c10::DataPtr(nullptr, fresh.release(), &release_tag, c10::Device(c10::kMeta)));
  return id;
}

BufferId track_storage(const at::Tensor& inner, bool host = false) {
  return track_storage(inner.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl(), false, host);
}

// Whether a MetaTensor claiming `device` stands in host memory beside the
// traced GPU (HostTensors::OnHost).
bool on_host(c10::Device device) { return g_mode.keeps_host && device.is_cpu(); }

using BufferList = c10::SmallVector<BufferId, 8>;

// Kernels' temporaries by op on each fake device, filled when the kernel is
// registered and only read afterwards.
std::unordered_map<const c10::OperatorName*, ScratchModel> g_cpu_scratch, g_cuda_scratch;
std::unordered_map<const c10::OperatorName*, ScratchPlanModel> g_cuda_scratch_plans;
std::unordered_map<const c10::OperatorName*, ReductionStagingModel> g_cuda_staging;

// The ops that call cuBLAS on CUDA, likewise.
std::unordered_map<const c10::OperatorName*, CublasCall> g_cublas_ops;

// Ops whose kernels make their returns in another order than they return
// them, with that order: the memory-efficient and cuDNN attentions' Philox
// seed and offset come before their output, dropout's mask before its output.
std::unordered_map<const c10::OperatorName*, c10::SmallVector<std::size_t, 8>> g_allocation_orders;

// The ops whose plans a recording gives, and its source (set_recorded_plans).
std::unordered_map<const c10::OperatorName*, std::string> g_recorded_ops;
RecordedPlans g_recorded_plans;

// The ops a CPU trace may take from recordings of the real CPU kernel
// (meta/CpuKernelRecording.h), likewise: each op's name and test of a call.
struct CpuRecordedOp {
  std::string name;
  RecordedCpuCall records;
};
std::unordered_map<const c10::OperatorName*, CpuRecordedOp> g_cpu_recorded_ops;

// metamem's own meta kernels by op, likewise.
std::unordered_map<const c10::OperatorName*, const c10::KernelFunction*> g_own_kernels;

// The temporaries of an op's kernel, by their plan (ScratchPlan): the
// steps before its outputs as it is constructed, before the kernel runs;
// the rest by make_the_rest(), after the outputs the plan does not place
// exist; what is left freed by free(), the last made first. Kernels with
// one temporary beside their outputs (ScratchModel) make it in
// make_the_rest().
class KernelScratch {
 public:
  // `device`: where the op runs (the host's kernels are the CPU's, also in
  // a fake-cuda trace that keeps host tensors there).
  KernelScratch(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments, MetaObserver* observer,
                c10::Device device)
      : observer_(observer) {
    if (device.is_cpu()) {
      const auto recorded = g_cpu_recorded_ops.find(&op.operator_name());
      if (recorded != g_cpu_recorded_ops.end() && recorded->second.records(arguments)) {
        plan_ = recorded_cpu_plan(recorded->second.name, arguments);
        if (observer_ == nullptr) plan_.steps.clear();  // untraced host memory: the returns' sizes alone
      }
      return;
    }
    if (observer_ == nullptr) return;
    if (const auto recorded = g_recorded_ops.find(&op.operator_name()); recorded != g_recorded_ops.end())
      if (std::optional<ScratchPlan> plan = g_recorded_plans(recorded->second, arguments)) {
        plan_ = std::move(*plan);
        return;
      }
    const auto model = g_cuda_scratch_plans.find(&op.operator_name());
    if (model == g_cuda_scratch_plans.end()) return;
    plan_ = model->second(arguments);
    for (std::size_t i = 0; i < plan_.before_outputs; ++i) take(plan_.steps[i]);
  }

  // A recorded kernel's returns laid out as it laid them out (cuDNN's
  // convolutions answer channels-last where torch's own do not) and sized
  // as it sized them (cuDNN's RNN reserve space), before they are wrapped:
  // the inner tensors on the stack remade.
  void lay_out_returns(torch::jit::Stack& stack, std::size_t n_returns) const {
    const std::size_t first = stack.size() - n_returns;
    for (std::size_t r = 0; r < plan_.return_strides.size() && r < n_returns; ++r) {
      const auto& strides = plan_.return_strides[r];
      if (strides.empty() || !stack[first + r].isTensor()) continue;
      const at::Tensor& made = stack[first + r].toTensor();
      const at::IntArrayRef sizes = r < plan_.return_sizes.size() && !plan_.return_sizes[r].empty()
                                        ? at::IntArrayRef(plan_.return_sizes[r])
                                        : made.sizes();
      if (!made.defined() || (made.sizes() == sizes && made.strides() == at::IntArrayRef(strides))) continue;
      OutsideMetaMode outside;
      stack[first + r] = at::empty_strided(sizes, strides, made.options());
    }
  }

  bool recorded() const { return plan_.recorded; }

  // Whether the plan makes the op's return `r` among its steps.
  bool places_output(std::size_t r) const { return has(ScratchPlan::Step::Kind::Output, r); }
  // Whether the plan says when the kernel first calls cuBLAS.
  bool places_cublas_call() const { return plan_.recorded || has(ScratchPlan::Step::Kind::CublasCall, 0); }

  // `make_output(r)` makes return r; `call_cublas()` reports the kernel's
  // first cuBLAS call.
  template <class MakeOutput, class CallCublas>
  void make_the_rest(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments,
                     c10::ArrayRef<c10::IValue> returns, MakeOutput make_output, CallCublas call_cublas) {
    if (observer_ == nullptr) return;
    for (std::size_t i = plan_.before_outputs; i < plan_.steps.size(); ++i) {
      const ScratchPlan::Step& step = plan_.steps[i];
      if (step.kind == ScratchPlan::Step::Kind::Output) {
        make_output(step.index);
      } else if (step.kind == ScratchPlan::Step::Kind::CublasCall) {
        call_cublas();
      } else {
        take(step);
      }
    }
    const auto& models = g_mode.device.is_cpu() ? g_cpu_scratch : g_cuda_scratch;
    if (plan_.recorded) return;
    if (const auto model = models.find(&op.operator_name()); model != models.end())
      take({ScratchPlan::Step::Kind::Make, model->second(arguments, returns), 0});
  }

  void free() {
    for (auto id = made_.rbegin(); id != made_.rend(); ++id)
      if (*id != kNone) observer_->on_free(*id);
    made_.clear();
  }

  // An op that fails frees what it made.
  ~KernelScratch() { free(); }
  KernelScratch(const KernelScratch&) = delete;
  KernelScratch& operator=(const KernelScratch&) = delete;

 private:
  // A piece of no bytes, or one freed already.
  static constexpr BufferId kNone = 0;

  bool has(ScratchPlan::Step::Kind kind, std::size_t index) const {
    return std::any_of(plan_.steps.begin(), plan_.steps.end(),
                       [&](const ScratchPlan::Step& step) { return step.kind == kind && step.index == index; });
  }

  void take(const ScratchPlan::Step& step) {
    if (step.kind == ScratchPlan::Step::Kind::EmptyCache) {
      observer_->on_empty_cache();
    } else if (step.kind == ScratchPlan::Step::Kind::Free) {
      BufferId& id = made_[step.index];
      if (id != kNone) observer_->on_free(id);
      id = kNone;
    } else {
      make(plan_.engines && step.bytes > 0 ? granted_bytes(made_.size(), step.bytes) : step.bytes);
    }
  }

  void make(std::int64_t bytes) {
    if (bytes <= 0) {
      made_.push_back(kNone);
      return;
    }
    made_.push_back(g_next_buffer.fetch_add(1));
    observer_->on_alloc(made_.back(), static_cast<std::size_t>(bytes));
  }

  // torch runs the engine a cuDNN call last ran; where the caching
  // allocator cannot hold its workspace, torch catches the out-of-memory
  // error and tries cuDNN's engines from the first (Conv_v8.cpp), each
  // workspace the fake GPU gives, until the allocator grants one; the
  // first refusal gave its cached segments back. Where it grants none,
  // real torch runs out of memory: the trace goes on with the first, as on
  // a GPU with room, with the engine it would run there.
  std::int64_t granted_bytes(std::size_t piece, std::int64_t first) {
    WorkspaceEngines& engines = *plan_.engines;
    const std::optional<std::int64_t> kept = engines.kept(piece);
    std::vector<std::int64_t> in_order{first};
    std::int64_t bytes = kept.value_or(first);
    for (;;) {
      std::vector<std::int64_t> tried;
      if (kept) tried.push_back(*kept);
      tried.insert(tried.end(), in_order.begin(), in_order.end());
      if (const std::optional<std::size_t> granted = observer_->first_granted(tried)) {
        if (*granted > 0) observer_->on_empty_cache();
        bytes = tried[*granted];
        break;
      }
      const std::optional<std::int64_t> next = engines.next(piece, in_order);
      if (!next) break;
      in_order.push_back(*next);
    }
    engines.ran(piece, bytes);
    return bytes;
  }

  MetaObserver* observer_;
  ScratchPlan plan_;
  BufferList made_;  // by piece number
};

// A CUDA reduction's cast input, staging buffer and semaphores, made in
// that order after its output and freed in the reverse order.
void report_reduction_staging(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments,
                              c10::ArrayRef<c10::IValue> returns, MetaObserver* observer) {
  if (observer == nullptr || !g_mode.device.is_cuda()) return;
  const auto model = g_cuda_staging.find(&op.operator_name());
  if (model == g_cuda_staging.end()) return;
  const ReductionStaging staging = model->second(arguments, returns);
  c10::SmallVector<BufferId, 3> made;
  for (const std::int64_t bytes : {staging.cast, staging.buffer, staging.semaphores}) {
    if (bytes <= 0) continue;
    made.push_back(g_next_buffer.fetch_add(1));
    observer->on_alloc(made.back(), static_cast<std::size_t>(bytes));
  }
  for (auto it = made.rbegin(); it != made.rend(); ++it) observer->on_free(*it);
}

// A fake CUDA device's cuBLAS calls need the workspace torch makes at the
// first call of a handle on a stream and keeps, after the op's outputs
// exist, as the kernel asks for its handle then. An empty product calls no
// cuBLAS. torch's handle pool gives each host thread a handle of its own,
// and CUDA backward runs on autograd's device thread: in a trace it may run
// on the calling thread, so a call inside a graph task takes that thread's.
// A handle is keyed by its thread's id. The pool gives an ended thread's
// handle to the next thread (a real H200 showed it), and glibc usually
// gives that thread the ended one's id, so the two agree there.
void report_cublas_workspace(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments,
                             c10::ArrayRef<c10::IValue> returns, MetaObserver* observer) {
  if (observer == nullptr || !g_mode.device.is_cuda()) return;
  const auto calls = g_cublas_ops.find(&op.operator_name());
  if (calls == g_cublas_ops.end() || !calls->second(arguments)) return;
  for (const c10::IValue& value : returns)  // a gradient not asked for is undefined
    if (value.isTensor() && value.toTensor().defined() && value.toTensor().numel() == 0) return;
  std::int64_t bytes = g_mode.cublas_workspace_bytes.load(std::memory_order_relaxed);
  if (bytes < 0) {
    const GpuTraits gpu = traced_gpu();
    bytes = cublas_workspace_bytes(gpu.major, gpu.minor);
    g_mode.cublas_workspace_bytes.store(bytes, std::memory_order_relaxed);
  }
  const bool on_device_thread =
      torch::autograd::get_current_graph_task_id() != -1 && traced_autograd_multithreading();
  observer->on_workspace(static_cast<std::size_t>(bytes),
                         on_device_thread ? std::thread::id() : std::this_thread::get_id());
}

// cuBLASLt's float8 products run from compute capability 8.9 (Ada, Hopper
// and later). torch refuses them on an older GPU, and a trace for one
// refuses them with torch's words.
std::unordered_set<const c10::OperatorName*> g_float8_products;

void check_the_traced_gpu_runs(const c10::OperatorHandle& op) {
  if (!g_mode.device.is_cuda() || g_float8_products.count(&op.operator_name()) == 0) return;
  const GpuTraits gpu = traced_gpu();
  TORCH_CHECK(gpu.major > 8 || (gpu.major == 8 && gpu.minor >= 9),
              "torch._scaled_mm is only supported on CUDA devices with compute capability >= 9.0 or 8.9, or ROCm "
              "MI300+ (metamem: the traced GPU's is ", gpu.major, ".", gpu.minor, ")");
}

// The thread's keys as they were outside MetaMode, and without metamem's
// other key (selective checkpointing, handled above). A private key must
// lose both its functionality bit and its backend bit, or a call made
// under them would come straight back.
c10::impl::LocalDispatchKeySet keys_outside_meta_mode() {
  c10::impl::LocalDispatchKeySet keys = c10::impl::tls_local_dispatch_key_set();
  keys.included_ = keys.included_.remove(c10::DispatchKey::PrivateUse1)
                       .remove_backend(c10::BackendComponent::PrivateUse1Bit)
                       .remove(c10::DispatchKey::PrivateUse2)
                       .remove_backend(c10::BackendComponent::PrivateUse2Bit);
  keys.excluded_ = keys.excluded_.remove(c10::DispatchKey::BackendSelect);
  return keys;
}

// A real tensor reaching the kernel beside MetaTensors (a 0-dim CPU scalar
// an autograd formula made with scalar_to_tensor) becomes a plain meta
// tensor of its shape; its own buffer is the one the observer recorded for
// it, if any (a fake cpu's). A wrapped Python number stays as it is: meta
// kernels take a CPU scalar beside meta tensors, and those written in
// Python (torch 2.x registers some) take no other.
at::Tensor to_inner(const at::Tensor& t, BufferList& buffers) {
  if (!t.defined()) return t;
  if (is_meta_tensor(t)) {
    const at::Tensor& inner = inner_tensor(t);
    buffers.push_back(track_storage(inner, on_host(t.device())));
    return inner;
  }
  if (t.is_meta()) return t;
  if (auto* observer = g_mode.observer.load(std::memory_order_acquire); observer != nullptr && t.is_cpu()) {
    const auto real = observer->real_allocation(t.storage().data());
    if (real.buffer != 0) buffers.push_back(real.buffer);
    else if (real.made_before_trace && t.requires_grad()) keep_grad_of_leaf(t);
  }
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) return t;
  OutsideMetaMode outside;
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
}

bool is_optional_device(const c10::Argument& arg) {
  const auto& type = arg.type();
  return type->kind() == c10::TypeKind::OptionalType &&
         type->expectRef<c10::OptionalType>().getElementType()->kind() ==
             c10::TypeKind::DeviceObjType;
}

void unwrap_arguments(const c10::FunctionSchema& schema, torch::jit::Stack& stack,
                      BufferList& inputs) {
  const auto& args = schema.arguments();
  const std::size_t first = stack.size() - args.size();
  for (std::size_t i = 0; i < args.size(); ++i) {
    c10::IValue& value = stack[first + i];
    if (value.isTensor()) {
      value = to_inner(value.toTensor(), inputs);
    } else if (value.isTensorList()) {
      // Lists are shared with the caller: build new ones.
      c10::List<at::Tensor> inner;
      for (const at::Tensor& t : value.toTensorList()) inner.push_back(to_inner(t, inputs));
      value = std::move(inner);
    } else if (value.isList() && args[i].type()->containedType(0)->kind() ==
                                     c10::TypeKind::OptionalType) {
      c10::List<c10::optional<at::Tensor>> inner;
      for (const c10::IValue& element : value.toListRef())
        inner.push_back(element.isTensor() ? c10::optional<at::Tensor>(to_inner(element.toTensor(), inputs))
                                           : c10::nullopt);
      value = std::move(inner);
    } else if (value.isStorage() && is_meta_storage(value.toStorage())) {
      // set_(storage): a traced tensor's storage stands for the meta one,
      // on which the kernel sets the inner tensor (copy.deepcopy does).
      value = c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(inner_storage(value.toStorage())));
    } else if (value.isDevice() || (value.isNone() && is_optional_device(args[i]))) {
      value = c10::Device(c10::kMeta);
    }
  }
}

// The argument a returned tensor aliases and writes (in-place and out=), if any.
c10::optional<std::size_t> written_argument(const c10::FunctionSchema& schema,
                                            std::size_t return_index) {
  const c10::AliasInfo* ret = schema.returns()[return_index].alias_info();
  if (ret == nullptr || !ret->isWrite()) return c10::nullopt;
  const auto& args = schema.arguments();
  for (std::size_t i = 0; i < args.size(); ++i) {
    const c10::AliasInfo* arg = args[i].alias_info();
    if (arg != nullptr && arg->isWrite() && arg->beforeSets() == ret->beforeSets()) return i;
  }
  return c10::nullopt;
}

std::atomic<ErrorReporter> g_reporter{nullptr};

template <typename Error>
[[noreturn]] void report(const Error& error) {
  if (ErrorReporter reporter = g_reporter.load()) reporter(error);
  throw error;
}

[[noreturn]] void unsupported(const c10::FunctionSchema& schema, const std::string& why) {
  report(UnsupportedOpError(schema.name(), c10::toString(schema), why));
}

at::Tensor wrap_output(const at::Tensor& inner, c10::Device device, BufferList& outputs) {
  if (!inner.defined()) return inner;
  // An argument this kernel does not unwrap sent the op back through MetaMode,
  // which already wrapped and tracked the result.
  if (is_meta_tensor(inner)) return inner;
  // A host tensor a kernel returns as the GPU's does (the memory-efficient
  // kernel's Philox seed with dropout) is real, and holds no device memory.
  if (!inner.is_meta()) return inner;
  outputs.push_back(track_storage(inner, on_host(device)));
  return make_meta_tensor(inner, device);
}

// The order in which the op's kernel allocates its returns, or nullptr
// where it is the order it returns them (every op but g_allocation_orders').
const c10::SmallVector<std::size_t, 8>* allocation_order(const c10::OperatorHandle& op) {
  const auto it = g_allocation_orders.find(&op.operator_name());
  return it == g_allocation_orders.end() ? nullptr : &it->second;
}

// A MetaTensor is strided: one that stood for a sparse tensor (the gradient
// of nn.Embedding(sparse=True)) would be read as one by the ops after it,
// which look for a sparse tensor's indices where it has none.
void refuse_sparse(const c10::FunctionSchema& schema, const at::Tensor& t) {
  if (t.defined() && t.is_meta() && t.layout() != c10::kStrided)
    unsupported(schema, "it returns a " + c10::str(t.layout()) + " tensor, and a trace follows strided ones only "
                        "(nn.Embedding(sparse=True) and nn.EmbeddingBag(sparse=True) make sparse gradients)");
}

// Return r on the stack becomes the caller's MetaTensor on `device`, its
// storage tracked.
void wrap_return(const c10::FunctionSchema& schema, torch::jit::Stack& stack,
                 const std::vector<c10::IValue>& original_args, std::size_t r, c10::Device device,
                 BufferList& outputs) {
  c10::IValue& value = stack[stack.size() - schema.returns().size() + r];
  if (auto arg = written_argument(schema, r)) {
    const at::Tensor& wrapper = original_args[*arg].toTensor();
    if (is_meta_tensor(wrapper)) {
      sync_meta_tensor(wrapper);
      outputs.push_back(track_storage(inner_tensor(wrapper), on_host(wrapper.device())));
    }
    value = wrapper;
  } else if (value.isTensor()) {
    refuse_sparse(schema, value.toTensor());
    value = wrap_output(value.toTensor(), device, outputs);
  } else if (value.isTensorList()) {
    c10::List<at::Tensor> wrapped;
    for (const at::Tensor& t : value.toTensorList()) {
      refuse_sparse(schema, t);
      wrapped.push_back(wrap_output(t, device, outputs));
    }
    value = std::move(wrapped);
  }
}

thread_local int t_meta_calls = 0;

// Whether the kernel running on this thread follows a recording.
thread_local bool t_recorded_call = false;
class RecordedCall {
 public:
  explicit RecordedCall(bool recorded) : previous_(std::exchange(t_recorded_call, recorded)) {}
  ~RecordedCall() { t_recorded_call = previous_; }
  RecordedCall(const RecordedCall&) = delete;
  RecordedCall& operator=(const RecordedCall&) = delete;

 private:
  bool previous_;
};

// The op through which .item(), bool() and a branch read a tensor's value.
constexpr std::string_view kValueRead = "aten::_local_scalar_dense";

std::atomic<bool> g_placeholder_values{false};

// Zero as the dtype reads: false, 0 or 0.0.
c10::Scalar placeholder_value(at::ScalarType dtype) {
  if (dtype == at::kBool) return c10::Scalar(false);
  if (c10::isIntegralType(dtype, /*includeBool=*/false)) return c10::Scalar(std::int64_t{0});
  if (c10::isComplexType(dtype)) return c10::Scalar(c10::complex<double>(0.0, 0.0));
  return c10::Scalar(0.0);
}

void call_on_meta(const c10::OperatorHandle& op, torch::jit::Stack& stack) {
  OutsideMetaMode outside;
  InsideMetaCall inside;
  const auto& schema = op.schema();
  if (schema.name() == kValueRead) {
    if (!g_placeholder_values.load())
      unsupported(schema, "reading a tensor's value (.item(), bool(), a branch on it) needs its data, "
                          "which a trace does not have.");
    const at::ScalarType dtype = stack.back().toTensor().scalar_type();
    stack.back() = placeholder_value(dtype);
    return;
  }
  try {
    const auto own = g_own_kernels.find(&op.operator_name());
    if (own != g_own_kernels.end())
      own->second->callBoxed(op, c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
    else
      op.callBoxed(&stack);
  } catch (const UnsupportedOpError&) {
    throw;
  } catch (const c10::NotImplementedError& e) {
    // The first sentence says which op could not run; the rest lists backends.
    const std::string why = e.what_without_backtrace();
    unsupported(schema, why.substr(0, why.find(". ") + 1));
  }
}

// The profiler's record_function ops (torch.optim wraps step() in one) keep
// a pointer in a small CPU tensor they write to: they run for real, outside
// MetaMode, and their handles reach them untouched.
void run_for_real(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OutsideMetaMode outside;
  op.callBoxed(stack);
}

// torch.tensor(data) writes Python data into a CPU tensor it makes with
// the mode keys excluded (so that modes do not see it), then lifts it onto
// its device, through this kernel: that tensor is made for real.
bool holds_python_data(const c10::FunctionSchema& schema) {
  const c10::DispatchKeySet excluded = c10::impl::tls_local_dispatch_key_set().excluded_;
  return schema.name() == "aten::empty" && excluded.has(c10::DispatchKey::Python) &&
         excluded.has(c10::DispatchKey::FuncTorchDynamicLayerFrontMode);
}

// Whether `value` holds only real tensors (at least one) and no device
// but the CPU: an op on it runs for real.
void scan_real(const c10::IValue& value, bool& any, bool& all) {
  for_each_tensor(value, [&](const at::Tensor& t) {
    if (!t.defined()) return;
    any = true;
    all = all && !is_meta_tensor(t) && !t.is_meta();
  });
  if (value.isDevice()) all = all && value.toDevice().is_cpu();
}

// A factory asked for the meta device (a model built under
// `with torch.device("meta")`, to be materialized after sharding) makes a
// plain meta tensor, as it does outside: no memory, on no device.
bool makes_plain_meta(const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
  bool meta = false;
  const std::size_t n = schema.arguments().size();
  for (std::size_t i = stack.size() - n; i < stack.size(); ++i) {
    const c10::IValue& value = stack[i];
    if (value.isDevice()) meta = meta || value.toDevice().is_meta();
    bool any = false, real = true;
    scan_real(value, any, real);
    if (any) return false;  // tensors decide where an op runs
  }
  return meta;
}

// Where an op's returns stand: on the traced device, unless host tensors
// stay on the host (HostTensors::OnHost). There a device the op names
// decides (a factory's, .to()'s), else a tensor on the device among its
// arguments (a 0-dim host tensor goes with one, as torch allows), else the
// host (a factory naming none, an op on host tensors alone).
c10::Device output_device(const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
  if (!g_mode.keeps_host) return g_mode.device;
  const auto on_device = [](const at::Tensor& t) { return is_meta_tensor(t) && !t.device().is_cpu(); };
  bool any_on_device = false;
  const std::size_t n = schema.arguments().size();
  for (std::size_t i = stack.size() - n; i < stack.size(); ++i) {
    const c10::IValue& value = stack[i];
    if (value.isDevice()) return value.toDevice().is_cpu() ? c10::Device(c10::kCPU) : g_mode.device;
    for_each_tensor(value, [&](const at::Tensor& t) { any_on_device = any_on_device || on_device(t); });
  }
  return any_on_device ? g_mode.device : c10::Device(c10::kCPU);
}

bool all_real(const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
  bool any = false, all = true;
  const std::size_t n = schema.arguments().size();
  for (std::size_t i = stack.size() - n; i < stack.size(); ++i) scan_real(stack[i], any, all);
  return any && all;
}

// An op is about to run for real: on real tensors alone, or on a real one
// beside traced ones whose values the trace knows (learn_values: `h.add_(g)`
// writes into h; where g's values are unknown nothing runs, and a real
// model's parameters are not copied for nothing). What it writes of the
// real tensors from before the trace is kept, to be put back as it ends.
void keep_real_writes(const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
  auto* observer = g_mode.observer.load(std::memory_order_acquire);
  if (observer == nullptr) return;
  const auto& args = schema.arguments();
  const std::size_t first = stack.size() - args.size();
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i].alias_info() == nullptr || !args[i].alias_info()->isWrite()) continue;
    for_each_tensor(stack[first + i], [&](const at::Tensor& t) {
      if (t.defined() && t.is_cpu() && !is_meta_tensor(t) && t.has_storage() &&
          observer->real_allocation(t.storage().data()).made_before_trace)
        keep_before_real_write(t);
    });
  }
}

void meta_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  if (!g_mode.active.load(std::memory_order_acquire)) report(TraceEndedError(schema.name()));
  if (holds_python_data(schema) || makes_plain_meta(schema, *stack)) {
    run_for_real(op, stack);
    return;
  }
  if (all_real(schema, *stack)) {
    keep_real_writes(schema, *stack);
    run_for_real(op, stack);
    return;
  }
  if (&op.operator_name() == g_value_read)
    if (auto values = known_values(stack->back().toTensor())) {
      OutsideMetaMode outside;
      const c10::Scalar value = values->item();
      stack->back() = value;
      return;
    }
  const std::size_t n_args = schema.arguments().size();
  // Written arguments must be returned as the caller's own MetaTensors.
  std::vector<c10::IValue> original_args(stack->end() - n_args, stack->end());

  check_known_indices(op, original_args);
  if (g_mode.keeps_host) check_devices(op, *stack);
  const c10::Device device = output_device(schema, *stack);
  if (!on_host(device)) check_the_traced_gpu_runs(op);
  BufferList inputs, outputs;
  unwrap_arguments(schema, *stack, inputs);
  auto* observer = g_mode.observer.load(std::memory_order_acquire);
  // A host op's temporaries are host memory: none of the device's.
  auto* device_observer = on_host(device) ? nullptr : observer;
  KernelScratch scratch(op, original_args, device_observer, device);
  const bool first_draw = first_draw_of_capture(op, original_args);
  if (first_draw && draws_before_outputs(op)) make_draw_state();
  {
    const RecordedCall recorded(scratch.recorded());
    call_on_meta(op, *stack);
  }
  scratch.lay_out_returns(*stack, schema.returns().size());
  if (&op.operator_name() == g_zero_tensor) hold_no_memory(stack->back().toTensor());
  const std::size_t n_returns = schema.returns().size();
  const auto* order = allocation_order(op);
  for (std::size_t i = 0; i < n_returns; ++i) {
    const std::size_t r = order != nullptr ? (*order)[i] : i;
    if (!scratch.places_output(r)) wrap_return(schema, *stack, original_args, r, device, outputs);
  }
  if (first_draw && !draws_before_outputs(op)) make_draw_state();
  const c10::ArrayRef<c10::IValue> returns(stack->data() + stack->size() - n_returns, n_returns);
  // A kernel's cuBLAS call comes after its temporaries are made (a
  // convolution's columns) and before they are freed, unless its plan
  // places it.
  const auto call_cublas = [&] { report_cublas_workspace(op, original_args, returns, device_observer); };
  scratch.make_the_rest(
      op, original_args, returns,
      [&](std::size_t r) { wrap_return(schema, *stack, original_args, r, device, outputs); }, call_cublas);
  if (!scratch.places_cublas_call()) call_cublas();
  scratch.free();
  report_reduction_staging(op, original_args, returns, device_observer);
  if (observer != nullptr) observer->on_op(op, inputs, outputs, original_args, returns);
  learn_values(op, original_args, returns, [&] { keep_real_writes(schema, original_args); });
}

// Whether an op gets the meta kernel as its own PrivateUse1 kernel, beside
// the fallback, which loses to composite kernels. Ops with only a
// CompositeImplicitAutograd kernel keep decomposing above us (that is where
// the fake device picks CUDA or CPU paths); with a native kernel as well they
// run fused, as on the device. CompositeExplicitAutograd kernels often pick a
// backend (convolution) or read data: they run as one op, except a few whose
// decomposition is plain arithmetic, whose temporaries we then trace as the
// device makes them.
bool runs_as_one_op(const c10::OperatorHandle& op, const std::string& qualified) {
  static const std::unordered_set<std::string> decomposed = {
      "aten::isinf",           "aten::rot90",
      "aten::mv",              "aten::binary_cross_entropy_with_logits",
      "aten::_trilinear",      "aten::linalg_pinv.atol_rtol_tensor",
      "aten::soft_margin_loss", "aten::soft_margin_loss.out",
      "aten::soft_margin_loss_backward", "aten::soft_margin_loss_backward.grad_input",
      "aten::_safe_softmax",   "aten::_unsafe_masked_index",
      "aten::_unsafe_masked_index_put_accumulate", "aten::allclose",
      "aten::logsumexp",       "aten::logsumexp.out",
      "aten::_euclidean_dist"};
  if (op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd))
    return op.hasKernelForDispatchKey(c10::DispatchKey::CPU);
  // Functional collectives (DTensor's redistributions) run their own code,
  // which reaches the trace's process group as the real run's reaches its
  // backend: gloo's staging on a fake cpu, the group's first collective.
  if (decomposed.count(qualified) != 0 || qualified.rfind("_c10d_functional", 0) == 0) return false;
  return op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
         op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional);
}

// Ops whose CUDA kernel is native and which decompose elsewhere
// (CompositeImplicitAutograd, no CPU kernel: _fused_rms_norm). On a GPU
// they run fused under their own autograd formula, which saves less than
// the decomposition's; on a CPU they decompose. So a fake-cuda trace gives
// them the meta kernel as their PrivateUse1 kernel for its length, and a
// fake-cpu trace lets them decompose.
std::vector<c10::OperatorName>& cuda_only_ops() {
  static std::vector<c10::OperatorName> ops;
  return ops;
}

bool runs_fused_on_cuda_only(const c10::OperatorHandle& op) {
  return op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) &&
         op.hasKernelForDispatchKey(c10::DispatchKey::CUDA) && !op.hasKernelForDispatchKey(c10::DispatchKey::CPU);
}

std::vector<c10::RegistrationHandleRAII> register_cuda_only_kernels() {
  std::vector<c10::RegistrationHandleRAII> handles;
  for (const auto& name : cuda_only_ops())
    handles.push_back(c10::Dispatcher::singleton().registerImpl(
        name, c10::DispatchKey::PrivateUse1, c10::KernelFunction::makeFromBoxedFunction<&meta_kernel>(),
        c10::nullopt, nullptr, "metamem: fused on a GPU"));
  return handles;
}

// Ops whose CPU and CUDA kernels are one function written in at:: ops,
// reading no data: a trace runs that function on MetaTensors, so that its
// temporaries are traced as either device makes them.
bool runs_shared_backend_code(const std::string& qualified) {
  return qualified == "aten::_embedding_bag_backward";
}

void run_shared_backend_code(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
}

// A traced tensor counts as pinned: pinned host memory is not the
// device's, so pin_memory() (a DataLoader's, a script's) returns the tensor
// itself, whether host tensors stand on the fake device or on the host. One
// on the device while host tensors stay on the host is not pinned.
void is_pinned(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  const bool on_device = g_mode.keeps_host && !(*stack)[stack->size() - 2].toTensor().device().is_cpu();
  torch::jit::drop(*stack, 2);
  stack->emplace_back(!on_device);
}

// The ops defined in the process that no trace has registered kernels for
// yet: all of them at the first trace, then those a library defines later
// (transformers' MoE fallback, a custom op, when its module is imported).
// A composite kernel wins over the PrivateUse1 fallback, so an op defined
// after the first trace without its own kernel there would run its real
// implementation on MetaTensors.
class NewOperators final : public c10::OpRegistrationListener {
 public:
  void onOperatorRegistered(const c10::OperatorHandle& op) override {
    std::lock_guard<std::mutex> hold(lock_);
    pending_.push_back(op.operator_name());
  }
  void onOperatorDeregistered(const c10::OperatorHandle&) override {}

  std::vector<c10::OperatorName> take() {
    std::lock_guard<std::mutex> hold(lock_);
    return std::exchange(pending_, {});
  }

 private:
  std::mutex lock_;
  std::vector<c10::OperatorName> pending_;
};

// Registrations live as long as the process. Called as each trace starts
// (one at a time), for the ops defined since the last.
void register_meta_kernel() {
  auto& dispatcher = c10::Dispatcher::singleton();
  static auto* handles = new std::vector<c10::RegistrationHandleRAII>();
  static NewOperators* new_operators = [] {
    auto listener = std::make_unique<NewOperators>();
    NewOperators* operators = listener.get();  // told of every op defined so far, then of each new one
    handles->push_back(c10::Dispatcher::singleton().addRegistrationListener(std::move(listener)));
    handles->push_back(c10::Dispatcher::singleton().registerFallback(
        c10::DispatchKey::PrivateUse1, c10::KernelFunction::makeFromBoxedFunction<&meta_kernel>(),
        "metamem fallback"));
    return operators;
  }();
  // Composites that read values through data_ptr, replaced for MetaTensors.
  static const auto composites = [] {
    std::unordered_map<std::string, c10::KernelFunction> composites;
    for (auto& [op, kernel] : ctc_loss_composites()) composites.emplace("aten::" + op, std::move(kernel));
    for (auto& [op, kernel] : packed_sequence_composites()) composites.emplace("aten::" + op, std::move(kernel));
    return composites;
  }();
  // Kernels that run below autograd on the caller's tensors: those that
  // read values through data_ptr, and _convolution as convolution.
  static const auto below_autograd = [] {
    std::unordered_map<std::string, c10::KernelFunction> kernels;
    for (auto& [op, kernel] : packed_sequence_kernels()) kernels.emplace("aten::" + op, std::move(kernel));
    for (auto& [op, kernel] : traced_convolution_kernels()) kernels.emplace("aten::" + op, std::move(kernel));
    return kernels;
  }();
  // An op defined again (a test's scoped library) keeps the kernels it got.
  static std::unordered_set<c10::OperatorName> registered;
  for (const auto& name : new_operators->take()) {
    auto op = dispatcher.findSchema(name);
    if (!op || !registered.insert(name).second) continue;
    const std::string qualified =
        name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
    if (ScratchModel model = cpu_scratch_model(qualified))
      g_cpu_scratch.emplace(&op->operator_name(), model);
    if (ScratchModel model = cuda_scratch_model(qualified)) g_cuda_scratch.emplace(&op->operator_name(), model);
    for (auto plans : {&cuda_attention_plan_model, &cuda_convolution_plan_model, &cuda_ctc_loss_plan_model,
                       &cuda_embedding_plan_model, &cuda_indexing_plan_model, &cuda_matmul_plan_model,
                       &cuda_normalization_plan_model, &cuda_pooling_plan_model, &cuda_reduction_plan_model,
                       &cuda_roll_plan_model, &cuda_scan_plan_model, &cuda_sort_plan_model})
      if (ScratchPlanModel model = plans(qualified)) g_cuda_scratch_plans.emplace(&op->operator_name(), model);
    if (ScratchModel model = cuda_native_scratch_model(qualified)) g_cuda_scratch.emplace(&op->operator_name(), model);
    if (ReductionStagingModel model = cuda_reduction_staging_model(qualified))
      g_cuda_staging.emplace(&op->operator_name(), model);
    if (ScratchModel model = device_scratch_model(qualified)) {
      g_cpu_scratch.emplace(&op->operator_name(), model);
      g_cuda_scratch.emplace(&op->operator_name(), model);
    }
    if (CublasCall calls = cublas_call(name.name)) g_cublas_ops.emplace(&op->operator_name(), calls);
    if (name.name == "aten::_scaled_mm" || name.name == "aten::_scaled_mm_v2")
      g_float8_products.insert(&op->operator_name());
    if (qualified == "aten::_efficientzerotensor") g_zero_tensor = &op->operator_name();
    if (qualified == "aten::_scaled_dot_product_efficient_attention")
      g_allocation_orders.emplace(&op->operator_name(), c10::SmallVector<std::size_t, 8>{2, 3, 0, 1});
    // cuDNN attention's likewise (its returns: output, log-sum-exp, four
    // sequence bounds, seed, offset, debug mask).
    if (qualified == "aten::_scaled_dot_product_cudnn_attention")
      g_allocation_orders.emplace(&op->operator_name(), c10::SmallVector<std::size_t, 8>{6, 7, 0, 1, 2, 3, 4, 5, 8});
    if (qualified == "aten::native_dropout")
      g_allocation_orders.emplace(&op->operator_name(), c10::SmallVector<std::size_t, 8>{1, 0});
    // CUDA's fused LSTM and GRU cells make their workspace (the gates
    // backward reads) before the states they return first.
    if (qualified == "aten::_thnn_fused_lstm_cell")
      g_allocation_orders.emplace(&op->operator_name(), c10::SmallVector<std::size_t, 8>{2, 0, 1});
    if (qualified == "aten::_thnn_fused_gru_cell")
      g_allocation_orders.emplace(&op->operator_name(), c10::SmallVector<std::size_t, 8>{1, 0});
    if (qualified == kValueRead) g_value_read = &op->operator_name();
    if (RecordedCpuCall records = recorded_cpu_call(qualified))
      g_cpu_recorded_ops.emplace(&op->operator_name(), CpuRecordedOp{qualified, records});
    if (const c10::KernelFunction* kernel = own_meta_kernel(qualified))
      g_own_kernels.emplace(&op->operator_name(), kernel);
    if (qualified.rfind("profiler::", 0) == 0) {
      for (auto key : {c10::DispatchKey::PrivateUse1, c10::DispatchKey::AutogradPrivateUse1})
        handles->push_back(dispatcher.registerImpl(
            name, key, c10::KernelFunction::makeFromBoxedFunction<&run_for_real>(), c10::nullopt,
            nullptr, "metamem: runs for real"));
      continue;
    }
    if (qualified == "aten::is_pinned") {
      handles->push_back(dispatcher.registerImpl(name, c10::DispatchKey::PrivateUse1,
                                                 c10::KernelFunction::makeFromBoxedFunction<&is_pinned>(),
                                                 c10::nullopt, nullptr, "metamem: pinned"));
      continue;
    }
    if (const auto composite = composites.find(qualified); composite != composites.end()) {
      for (auto key : {c10::DispatchKey::PrivateUse1, c10::DispatchKey::AutogradPrivateUse1})
        handles->push_back(dispatcher.registerImpl(name, key, composite->second, c10::nullopt, nullptr,
                                                   "metamem: a composite as traced"));
      continue;
    }
    if (const auto kernel = below_autograd.find(qualified); kernel != below_autograd.end()) {
      handles->push_back(dispatcher.registerImpl(name, c10::DispatchKey::PrivateUse1, kernel->second, c10::nullopt,
                                                 nullptr, "metamem: a kernel below autograd"));
      continue;
    }
    if (runs_shared_backend_code(qualified)) {
      handles->push_back(dispatcher.registerImpl(
          name, c10::DispatchKey::PrivateUse1, c10::KernelFunction::makeFromBoxedFunction<&run_shared_backend_code>(),
          c10::nullopt, nullptr, "metamem: the backends' shared code"));
      continue;
    }
    if (runs_fused_on_cuda_only(*op)) cuda_only_ops().push_back(name);
    if (!runs_as_one_op(*op, qualified)) continue;
    handles->push_back(dispatcher.registerImpl(
        name, c10::DispatchKey::PrivateUse1,
        c10::KernelFunction::makeFromBoxedFunction<&meta_kernel>(), c10::nullopt, nullptr,
        "metamem"));
  }
}

// PrivateUse1 joins the thread's included keys so that factories called with
// a MetaTensor's options reach the kernel. Factories without tensor arguments
// go through BackendSelect, which picks the kernel from the device argument
// alone; with BackendSelect skipped they dispatch on PrivateUse1 too.
c10::impl::LocalDispatchKeySet meta_mode_keys() {
  c10::impl::LocalDispatchKeySet keys = c10::impl::tls_local_dispatch_key_set();
  keys.included_ = keys.included_.add(c10::DispatchKey::PrivateUse1);
  keys.excluded_ = keys.excluded_.add(c10::DispatchKey::BackendSelect);
  return keys;
}

}  // namespace

UnsupportedOpError::UnsupportedOpError(const std::string& op, Message message)
    : c10::NotImplementedError({__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)}, std::move(message.text)),
      op_(op),
      reads_value_(message.reads_value) {}

UnsupportedOpError::UnsupportedOpError(const std::string& op, const std::string& schema,
                                       const std::string& why)
    : UnsupportedOpError(op, {"metamem: no meta kernel for " + op + " (" + schema + "): " + why, op == kValueRead}) {}

UnsupportedOpError UnsupportedOpError::values_unknown(const std::string& op, const std::string& why) {
  return UnsupportedOpError(op, {"metamem: " + op + " reads values the trace does not know: " + why, true});
}

TraceEndedError::TraceEndedError(const std::string& op)
    : c10::Error({__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)},
                 "metamem: " + op + " on a tensor of a trace that has ended: tensors made or moved to the fake "
                 "device inside a metamem.trace block hold no data and cannot run after it (move the module "
                 "or tensor inside the block, or build it again)") {}

MetaMode::MetaMode(c10::Device fake_device, MetaObserver* observer, HostTensors host) : keys_(meta_mode_keys()) {
  if (fake_device.type() != c10::kCPU && fake_device.type() != c10::kCUDA)
    throw std::invalid_argument("metamem: fake device must be cpu or cuda");
  if (g_mode.active.exchange(true)) throw std::logic_error("metamem: MetaMode is already active");
  register_meta_kernels();
  g_mode.traces.fetch_add(1);
  // Autograd indexes CUDA devices: a fake one needs an index; CPU has none.
  g_mode.device = fake_device.type() == c10::kCUDA && !fake_device.has_index()
                      ? c10::Device(c10::kCUDA, 0)
                      : fake_device;
  g_mode.keeps_host = g_mode.device.is_cuda() && host == HostTensors::OnHost;
  set_host_beside_gpu(g_mode.keeps_host);
  g_mode.observer.store(observer, std::memory_order_release);
  g_mode.cublas_workspace_bytes.store(-1, std::memory_order_relaxed);
  if (g_mode.device.is_cuda()) {
    fake_cuda_.emplace();
    g_mode.cuda_only_kernels = register_cuda_only_kernels();
  }
}

MetaMode::~MetaMode() {
  g_mode.observer.store(nullptr, std::memory_order_release);
  restore_pre_trace_tensors();
  g_mode.cuda_only_kernels.clear();
  fake_cuda_.reset();
  g_mode.active.store(false);
  set_host_beside_gpu(false);
  retire_meta_tensors();
  forget_all_values();
}

namespace {

// Above an op's Python meta function: libtorch's C++ kernel for metamem's
// meta calls, the Python function (torch's, as registered) for the rest. A
// composite C++ kernel (zeros_like's, linspace's) may read a value on its
// way (start.item()), which a meta tensor does not have: the Python
// function, written for meta tensors, then runs instead, on the arguments
// kept for it.
class CppKernelInTraces final : public c10::OperatorKernel {
 public:
  CppKernelInTraces(c10::SafeKernelFunction cpp, bool composite, c10::SafeKernelFunction covered)
      : cpp_(std::move(cpp)), composite_(composite), covered_(std::move(covered)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    if (!in_meta_call()) return covered_.callBoxed(op, keys, stack);
    if (!composite_) return cpp_.callBoxed(op, keys, stack);
    const std::size_t base = stack->size() - op.schema().arguments().size();
    const std::vector<c10::IValue> arguments(stack->begin() + base, stack->end());
    try {
      cpp_.callBoxed(op, keys, stack);
    } catch (const std::exception&) {  // c10::Error, or a Python meta function's error
      stack->resize(base);  // the failed call may have moved its arguments out
      stack->insert(stack->end(), arguments.begin(), arguments.end());
      covered_.callBoxed(op, keys, stack);
    }
  }

 private:
  c10::SafeKernelFunction cpp_;
  bool composite_;
  c10::SafeKernelFunction covered_;
};

c10::OperatorHandle operator_named(const std::string& qualified) {
  const std::size_t dot = qualified.find('.');
  return c10::Dispatcher::singleton().findSchemaOrThrow(
      qualified.substr(0, dot).c_str(), dot == std::string::npos ? "" : qualified.substr(dot + 1).c_str());
}

}  // namespace

void run_cpp_meta_kernels_in_traces(const std::vector<std::string>& ops,
                                    const std::function<void()>& cover) {
  std::vector<c10::OperatorHandle> handles;
  std::vector<c10::SafeKernelFunction> cpp;
  std::vector<bool> composite;
  for (const std::string& name : ops) {
    handles.push_back(operator_named(name));
    cpp.push_back(handles.back().getComputedKernelForDispatchKey(c10::DispatchKey::Meta));
    composite.push_back(!handles.back().hasKernelForDispatchKey(c10::DispatchKey::Meta));
  }
  cover();
  static auto* registrations = new std::vector<c10::RegistrationHandleRAII>();
  for (std::size_t i = 0; i < handles.size(); ++i) {
    auto kernel = std::make_unique<CppKernelInTraces>(
        std::move(cpp[i]), composite[i], handles[i].getComputedKernelForDispatchKey(c10::DispatchKey::Meta));
    registrations->push_back(c10::Dispatcher::singleton().registerImpl(
        handles[i].operator_name(), c10::DispatchKey::Meta,
        c10::KernelFunction::makeFromBoxedFunctor(std::move(kernel)), c10::nullopt, nullptr,
        "metamem: the C++ meta kernel in traces"));
  }
}

void register_meta_kernels() {
  static std::once_flag registered;
  std::call_once(registered, register_missing_meta_kernels);
  register_meta_kernel();
}

bool meta_mode_active() { return g_mode.active.load(); }
std::uint64_t trace_number() { return g_mode.traces.load(); }

OutsideMetaMode::OutsideMetaMode() : keys_(keys_outside_meta_mode()) {}
InsideMetaMode::InsideMetaMode() : keys_(meta_mode_keys()) {}

PlaceholderValues::PlaceholderValues() : previous_(g_placeholder_values.exchange(true)) {}
bool PlaceholderValues::active() { return g_placeholder_values.load(); }

bool in_recorded_call() { return t_recorded_call; }

void check_recorded_call(const char* op, const char* why) {
  TORCH_CHECK_NOT_IMPLEMENTED(in_recorded_call(), op, why);
}

void set_recorded_plans(const std::vector<std::string>& ops, RecordedPlans source) {
  g_recorded_ops.clear();
  g_recorded_plans = std::move(source);
  for (const std::string& qualified : ops) {
    const std::size_t dot = qualified.find('.');
    const c10::OperatorName name{qualified.substr(0, dot),
                                 dot == std::string::npos ? "" : qualified.substr(dot + 1)};
    if (const auto op = c10::Dispatcher::singleton().findSchema(name))
      g_recorded_ops.emplace(&op->operator_name(), qualified);
  }
}

void report_unknown_values(const std::string& op, const std::string& why) {
  report(UnsupportedOpError::values_unknown(op, why));
}
PlaceholderValues::~PlaceholderValues() { g_placeholder_values.store(previous_); }

at::Tensor adopt_meta_tensor(const at::Tensor& meta) {
  TORCH_CHECK(meta.is_meta(), "adopt_meta_tensor: expected a meta tensor, got one on ", meta.device());
  track_storage(meta);
  return make_meta_tensor(meta, g_mode.device);
}

void set_error_reporter(ErrorReporter reporter) { g_reporter.store(reporter); }

BufferId new_buffer_id() { return g_next_buffer.fetch_add(1); }

bool in_meta_call() { return t_meta_calls > 0; }

InsideMetaCall::InsideMetaCall() { ++t_meta_calls; }
InsideMetaCall::~InsideMetaCall() { --t_meta_calls; }

c10::Device fake_device() { return g_mode.device; }

void resize_storage(const at::Tensor& t, std::size_t bytes) {
  if (!is_meta_tensor(t)) {
    at::native::resize_bytes_cpu(t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl(), bytes);
    return;
  }
  resize_storage(t.unsafeGetTensorImpl()->unsafe_storage(), bytes);
}

void resize_storage(const c10::Storage& storage, std::size_t bytes) {
  c10::StorageImpl* inner = inner_storage(storage);
  inner->set_nbytes(bytes);
  track_storage(inner);
  // Shared by every MetaTensor on the storage: their sizes stay theirs, as
  // a real tensor's do when its storage is resized under it.
  storage.unsafeGetStorageImpl()->set_nbytes(bytes);
}

namespace {
BufferTag* tag_of(const c10::Storage& storage) {
  return static_cast<BufferTag*>(inner_storage(storage)->data_ptr().get_context());
}
}  // namespace

BufferId buffer_of(const c10::Storage& storage) {
  const BufferTag* tag = tag_of(storage);
  return tag == nullptr ? 0 : tag->id;
}

std::optional<std::int64_t> claimed_address(const c10::Storage& storage) {
  const BufferTag* tag = tag_of(storage);
  if (tag == nullptr || tag->claimed_address < 0) return std::nullopt;
  return tag->claimed_address;
}

void free_buffer_now(const c10::Storage& storage, std::int64_t address) {
  BufferTag* tag = tag_of(storage);
  if (tag == nullptr || tag->id == 0) return;
  const BufferId id = tag->id;
  tag->id = 0;
  tag->claimed_address = address;
  if (auto* observer = g_mode.observer.load(std::memory_order_acquire)) observer->on_free(id);
  forget_values(id);
}

void set_access_error(const c10::Storage& storage, std::string message) {
  if (BufferTag* tag = tag_of(storage)) tag->access_error = std::make_shared<const std::string>(std::move(message));
}

std::optional<std::string> access_error(const c10::Storage& storage) {
  const BufferTag* tag = tag_of(storage);
  if (tag == nullptr || tag->access_error == nullptr) return std::nullopt;
  return *tag->access_error;
}

void hold_buffer(const c10::Storage& storage, BufferId id) {
  BufferTag* tag = tag_of(storage);
  TORCH_CHECK(tag != nullptr && tag->id == 0, "metamem: a storage that owns a buffer cannot hold another");
  tag->id = id;
  tag->claimed_address = -1;
}

at::Tensor traced_empty_on_default_stream(at::IntArrayRef sizes, at::ScalarType dtype) {
  at::Tensor inner = at::empty(sizes, at::TensorOptions(c10::kMeta).dtype(dtype));
  track_storage(inner.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl(), /*on_default_stream=*/true);
  return make_meta_tensor(std::move(inner), g_mode.device);
}

at::Tensor storage_at(std::int64_t address, std::size_t bytes) {
  at::Tensor inner = at::empty({static_cast<std::int64_t>(bytes)}, at::TensorOptions(c10::kMeta).dtype(at::kByte));
  c10::StorageImpl* impl = inner.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(c10::DataPtr(nullptr, new BufferTag{0, bytes, address}, &release_tag,
                                         c10::Device(c10::kMeta)));
  return make_meta_tensor(std::move(inner), g_mode.device);
}

BufferId buffer_of(const at::Tensor& t) {
  if (!t.defined() || !(is_meta_tensor(t) || t.is_meta())) return 0;
  const at::Tensor& inner = is_meta_tensor(t) ? inner_tensor(t) : t;
  const c10::Storage& storage = inner.unsafeGetTensorImpl()->unsafe_storage();
  auto* tag = static_cast<BufferTag*>(storage.data_ptr().get_context());
  return tag == nullptr ? 0 : tag->id;
}

}  // namespace metamem
