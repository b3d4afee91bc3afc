#include "meta/MetaMode.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/SmallVector.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "meta/CpuKernelModel.h"
#include "meta/FakeCuda.h"
#include "meta/MetaKernels.h"
#include "meta/MetaTensor.h"

namespace metamem {
namespace {

// The tag a traced storage carries as its DataPtr context. Its deleter runs
// when the storage dies, which is exactly when a real buffer would be freed.
struct BufferTag {
  BufferId id;
  std::size_t bytes;
};

struct ModeState {
  std::atomic<bool> active{false};
  std::atomic<MetaObserver*> observer{nullptr};
  c10::Device device{c10::kCPU};
};

ModeState g_mode;

// The autograd engine sizes its device queues at its first backward, so fake
// CUDA must be in place before any backward runs, traced or not.
const bool g_fake_cuda_installed = (install_fake_cuda(), true);
std::atomic<BufferId> g_next_buffer{1};

void release_tag(void* ctx) {
  auto* tag = static_cast<BufferTag*>(ctx);
  if (auto* observer = g_mode.observer.load(std::memory_order_acquire)) observer->on_free(tag->id);
  delete tag;
}

// Tags a storage the first time it is seen and reports it as allocated; a
// storage that grew (resize_ of an out= argument) is reported as a new buffer.
BufferId track_storage(const at::Tensor& inner) {
  const c10::Storage& storage = inner.unsafeGetTensorImpl()->unsafe_storage();
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  if (impl == nullptr) return 0;
  auto* tag = static_cast<BufferTag*>(impl->data_ptr().get_context());
  if (tag != nullptr && tag->bytes == impl->nbytes()) return tag->id;

  auto* fresh = new BufferTag{g_next_buffer.fetch_add(1), impl->nbytes()};
  if (auto* observer = g_mode.observer.load(std::memory_order_acquire))
    observer->on_alloc(fresh->id, fresh->bytes);
  // Swapping in the new DataPtr releases the old tag: alloc-then-free, as a
  // real reallocation does.
  impl->set_data_ptr_noswap(c10::DataPtr(nullptr, fresh, &release_tag, c10::Device(c10::kMeta)));
  return fresh->id;
}

using BufferList = c10::SmallVector<BufferId, 8>;

// CPU kernels' temporaries by op, filled when the kernel is registered and
// only read afterwards.
std::unordered_map<const c10::OperatorName*, CpuScratchModel> g_cpu_scratch;

// On a fake cpu, what the op's CPU kernel holds beside its outputs is made
// and freed after they exist, as it is live beside them.
void report_scratch(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments,
                    c10::ArrayRef<c10::IValue> returns, MetaObserver* observer) {
  if (observer == nullptr || !g_mode.device.is_cpu()) return;
  const auto model = g_cpu_scratch.find(&op.operator_name());
  if (model == g_cpu_scratch.end()) return;
  const std::int64_t bytes = model->second(arguments, returns);
  if (bytes <= 0) return;
  const BufferId id = g_next_buffer.fetch_add(1);
  observer->on_alloc(id, static_cast<std::size_t>(bytes));
  observer->on_free(id);
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

// A real tensor reaching the kernel (a 0-dim CPU scalar that a composite or
// autograd kernel made with scalar_to_tensor) becomes a plain meta tensor of
// its shape. On a fake CPU it is memory the real kernel allocates too.
at::Tensor to_inner(const at::Tensor& t, BufferList& buffers) {
  if (!t.defined()) return t;
  if (is_meta_tensor(t)) {
    const at::Tensor& inner = inner_tensor(t);
    buffers.push_back(track_storage(inner));
    return inner;
  }
  if (t.is_meta()) return t;
  at::Tensor copy;
  {
    c10::impl::ForceDispatchKeyGuard outside(keys_outside_meta_mode());
    copy = at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
  }
  if (t.is_cpu() && g_mode.device.is_cpu()) buffers.push_back(track_storage(copy));
  return copy;
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

at::Tensor wrap_output(const at::Tensor& inner, BufferList& outputs) {
  if (!inner.defined()) return inner;
  // An argument this kernel does not unwrap sent the op back through MetaMode,
  // which already wrapped and tracked the result.
  if (is_meta_tensor(inner)) return inner;
  outputs.push_back(track_storage(inner));
  return make_meta_tensor(inner, g_mode.device);
}

void wrap_outputs(const c10::FunctionSchema& schema, torch::jit::Stack& stack,
                  const std::vector<c10::IValue>& original_args, BufferList& outputs) {
  const std::size_t n = schema.returns().size();
  const std::size_t first = stack.size() - n;
  for (std::size_t r = 0; r < n; ++r) {
    c10::IValue& value = stack[first + r];
    if (auto arg = written_argument(schema, r)) {
      const at::Tensor& wrapper = original_args[*arg].toTensor();
      if (is_meta_tensor(wrapper)) {
        sync_meta_tensor(wrapper);
        outputs.push_back(track_storage(inner_tensor(wrapper)));
      }
      value = wrapper;
    } else if (value.isTensor()) {
      value = wrap_output(value.toTensor(), outputs);
    } else if (value.isTensorList()) {
      c10::List<at::Tensor> wrapped;
      for (const at::Tensor& t : value.toTensorList()) wrapped.push_back(wrap_output(t, outputs));
      value = std::move(wrapped);
    }
  }
}

// Runs the op on the inner meta tensors with the thread's keys as they were
// outside MetaMode.
void call_on_meta(const c10::OperatorHandle& op, torch::jit::Stack& stack) {
  c10::impl::ForceDispatchKeyGuard guard(keys_outside_meta_mode());
  const auto& schema = op.schema();
  try {
    op.callBoxed(&stack);
  } catch (const UnsupportedOpError&) {
    throw;
  } catch (const c10::NotImplementedError& e) {
    // The first sentence says which op could not run; the rest lists backends.
    const std::string why = e.what_without_backtrace();
    throw UnsupportedOpError(schema.name(), c10::toString(schema), why.substr(0, why.find(". ") + 1));
  }
}

void meta_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const std::size_t n_args = schema.arguments().size();
  // Written arguments must be returned as the caller's own MetaTensors.
  std::vector<c10::IValue> original_args(stack->end() - n_args, stack->end());

  BufferList inputs, outputs;
  unwrap_arguments(schema, *stack, inputs);
  call_on_meta(op, *stack);
  wrap_outputs(schema, *stack, original_args, outputs);
  auto* observer = g_mode.observer.load(std::memory_order_acquire);
  const std::size_t n_returns = schema.returns().size();
  const c10::ArrayRef<c10::IValue> returns(stack->data() + stack->size() - n_returns, n_returns);
  report_scratch(op, original_args, returns, observer);
  if (observer != nullptr) observer->on_op(op, inputs, outputs, original_args, returns);
}

// Ops with a CompositeImplicitAutograd kernel keep decomposing above us (that
// is where the fake device picks CUDA or CPU paths). A backend fallback alone
// loses to CompositeExplicitAutograd kernels, so those ops get the kernel
// directly. Registrations live as long as the process.
void register_meta_kernel() {
  auto& dispatcher = c10::Dispatcher::singleton();
  auto* handles = new std::vector<c10::RegistrationHandleRAII>();
  handles->push_back(dispatcher.registerFallback(
      c10::DispatchKey::PrivateUse1, c10::KernelFunction::makeFromBoxedFunction<&meta_kernel>(),
      "metamem fallback"));
  for (const auto& name : dispatcher.getAllOpNames()) {
    auto op = dispatcher.findSchema(name);
    if (!op) continue;
    const std::string qualified =
        name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
    if (CpuScratchModel model = cpu_scratch_model(qualified))
      g_cpu_scratch.emplace(&op->operator_name(), model);
    if (op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) continue;
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional))
      continue;
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

UnsupportedOpError::UnsupportedOpError(const std::string& op, const std::string& schema,
                                       const std::string& why)
    : c10::NotImplementedError({__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)},
                               "metamem: no meta kernel for " + op + " (" + schema + "): " + why),
      op_(op) {}

MetaMode::MetaMode(c10::Device fake_device, MetaObserver* observer) : keys_(meta_mode_keys()) {
  if (fake_device.type() != c10::kCPU && fake_device.type() != c10::kCUDA)
    throw std::invalid_argument("metamem: fake device must be cpu or cuda");
  if (g_mode.active.exchange(true)) throw std::logic_error("metamem: MetaMode is already active");
  static std::once_flag registered;
  std::call_once(registered, [] {
    register_meta_kernel();
    register_missing_meta_kernels();
  });
  // Autograd indexes CUDA devices: a fake one needs an index; CPU has none.
  g_mode.device = fake_device.type() == c10::kCUDA && !fake_device.has_index()
                      ? c10::Device(c10::kCUDA, 0)
                      : fake_device;
  g_mode.observer.store(observer, std::memory_order_release);
  set_fake_cuda_active(g_mode.device.is_cuda());
}

MetaMode::~MetaMode() {
  g_mode.observer.store(nullptr, std::memory_order_release);
  set_fake_cuda_active(false);
  g_mode.active.store(false);
}

bool meta_mode_active() { return g_mode.active.load(); }

c10::Device fake_device() { return g_mode.device; }

BufferId buffer_of(const at::Tensor& t) {
  if (!is_meta_tensor(t)) return 0;
  const c10::Storage& storage = inner_tensor(t).unsafeGetTensorImpl()->unsafe_storage();
  auto* tag = static_cast<BufferTag*>(storage.data_ptr().get_context());
  return tag == nullptr ? 0 : tag->id;
}

}  // namespace metamem
