#include "profiler/KeptOutputs.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>

namespace metamem {
namespace {

struct ThreadState {
  KeptOutputs* outputs = nullptr;
  KeptOutputs::Mode mode = KeptOutputs::Mode::Record;
};
thread_local ThreadState t_state;

std::string qualified(const c10::OperatorName& name) {
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

// The thread's keys without metamem's selective key, backend bit included.
c10::impl::LocalDispatchKeySet without_key() {
  c10::impl::LocalDispatchKeySet keys = c10::impl::tls_local_dispatch_key_set();
  keys.included_ = keys.included_.remove(c10::DispatchKey::PrivateUse2)
                       .remove_backend(c10::BackendComponent::PrivateUse2Bit);
  return keys;
}

void kept_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const std::string name = qualified(op.operator_name());
  KeptOutputs* outputs = t_state.outputs;
  const auto below = keys.remove_backend(c10::BackendComponent::PrivateUse2Bit);
  if (outputs == nullptr || !outputs->keeps(name)) {
    c10::impl::ForceDispatchKeyGuard guard(without_key());
    op.redispatchBoxed(below, stack);
    return;
  }
  const std::size_t n_returns = op.schema().returns().size();
  if (t_state.mode == KeptOutputs::Mode::Replay) {
    auto& entries = outputs->entries();
    if (entries.empty() || entries.front().op != name)
      throw std::runtime_error("selective checkpointing: the recomputation ran " + name +
                               " where the forward ran " + (entries.empty() ? "nothing" : entries.front().op));
    KeptOutputs::Entry entry = std::move(entries.front());
    entries.pop_front();
    for (std::size_t i = 0; i < entry.outputs.size(); ++i)
      if (entry.outputs[i].defined() && entry.outputs[i]._version() != entry.versions[i])
        throw std::runtime_error("selective checkpointing: " + name +
                                 "'s kept output was changed in place after the op; keep another op");
    torch::jit::drop(*stack, op.schema().arguments().size());
    for (at::Tensor& t : entry.outputs) stack->emplace_back(std::move(t));
    return;
  }
  {
    c10::impl::ForceDispatchKeyGuard guard(without_key());
    op.redispatchBoxed(below, stack);
  }
  KeptOutputs::Entry entry{name, {}, {}};
  for (std::size_t i = stack->size() - n_returns; i < stack->size(); ++i) {
    const at::Tensor t = (*stack)[i].isTensor() ? (*stack)[i].toTensor() : at::Tensor();
    entry.outputs.push_back(t);
    entry.versions.push_back(t.defined() ? t._version() : 0);
  }
  outputs->entries().push_back(std::move(entry));
}

// Every op reaches the kernel, which passes on all but kept ops: as the
// key's fallback, and registered on ops with composite kernels, which a
// fallback loses to. (A fallthrough fallback is not skipped when the key's
// backend bit joins a tensor's in 1.13.)
void register_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto& dispatcher = c10::Dispatcher::singleton();
    auto* handles = new std::vector<c10::RegistrationHandleRAII>();
    handles->push_back(dispatcher.registerFallback(
        c10::DispatchKey::PrivateUse2, c10::KernelFunction::makeFromBoxedFunction<&kept_kernel>(),
        "metamem selective"));
    const auto& keepable = keepable_ops();
    for (const auto& name : dispatcher.getAllOpNames()) {
      auto op = dispatcher.findSchema(name);
      if (!op) continue;
      const bool keep = std::find(keepable.begin(), keepable.end(), qualified(name)) != keepable.end();
      const bool composite =
          op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
          op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional);
      if (keep || composite)
        handles->push_back(dispatcher.registerImpl(
            name, c10::DispatchKey::PrivateUse2,
            c10::KernelFunction::makeFromBoxedFunction<&kept_kernel>(), c10::nullopt, nullptr,
            "metamem selective"));
    }
  });
}

}  // namespace

const std::vector<std::string>& keepable_ops() {
  static const std::vector<std::string> ops = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
                                               "aten::convolution"};
  return ops;
}

void validate_keep(const std::vector<std::string>& ops) {
  const auto& keepable = keepable_ops();
  for (const std::string& op : ops)
    if (std::find(keepable.begin(), keepable.end(), op) == keepable.end()) {
      std::string known;
      for (const std::string& k : keepable) known += (known.empty() ? "" : ", ") + k;
      throw std::invalid_argument("selective checkpointing cannot keep " + op + " (it keeps " + known + ")");
    }
}

KeptOutputs::KeptOutputs(std::vector<std::string> ops) : ops_(std::move(ops)) {
  validate_keep(ops_);
  register_kernels();
}

bool KeptOutputs::keeps(const std::string& op) const {
  return std::find(ops_.begin(), ops_.end(), op) != ops_.end();
}

struct KeptOutputs::Scope::Saved {
  ThreadState state;
  c10::impl::ForceDispatchKeyGuard keys;
  explicit Saved(c10::impl::LocalDispatchKeySet k) : state(t_state), keys(k) {}
};

KeptOutputs::Scope::Scope(KeptOutputs& outputs, Mode mode) {
  c10::impl::LocalDispatchKeySet keys = c10::impl::tls_local_dispatch_key_set();
  keys.included_ = keys.included_.add(c10::DispatchKey::PrivateUse2);
  saved_ = std::make_unique<Saved>(keys);
  t_state = {&outputs, mode};
}

KeptOutputs::Scope::~Scope() { t_state = saved_->state; }

}  // namespace metamem
