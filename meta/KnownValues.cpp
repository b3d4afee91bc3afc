#include "meta/KnownValues.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/enum_tag.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/WrapDimMinimal.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/anomaly_mode.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "meta/MetaTensor.h"
#include "meta/TensorBytes.h"

namespace metamem {
namespace {

// A buffer's values: a real CPU storage of its bytes.
std::mutex g_mutex;
std::unordered_map<BufferId, c10::Storage> g_values;
std::atomic<bool> g_any{false};

c10::Storage values_of(BufferId id) {
  if (id == 0 || !g_any.load(std::memory_order_relaxed)) return {};
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto it = g_values.find(id);
  return it == g_values.end() ? c10::Storage() : it->second;
}

// A fresh storage for `t`'s buffer (its values unwritten yet).
c10::Storage new_values(const at::Tensor& t) {
  const std::size_t bytes = inner_tensor(t).unsafeGetTensorImpl()->unsafe_storage().nbytes();
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, c10::GetCPUAllocator(), /*resizable=*/false);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_values[buffer_of(t)] = storage;
  g_any.store(true, std::memory_order_relaxed);
  return storage;
}

// A real CPU tensor over `storage` laid out as the MetaTensor `t` (or as
// the meta tensor inside one).
at::Tensor view_of(const c10::Storage& storage, const at::Tensor& t) {
  const at::Tensor& inner = is_meta_tensor(t) ? inner_tensor(t) : t;
  at::Tensor view = at::empty({0}, at::TensorOptions().dtype(inner.dtype()).device(c10::kCPU));
  view.set_(storage, inner.storage_offset(), inner.sizes(), inner.strides());
  return view;
}

bool is_random(const c10::OperatorHandle& op) { return op.hasTag(at::Tag::nondeterministic_seeded); }

// A collective's result holds the other ranks' values, which this rank's
// trace does not have; run on the values it knows, torch's own kernel
// would reach the trace's process group with host tensors.
bool is_collective(const std::string& name) {
  return name.rfind("c10d::", 0) == 0 || name.rfind("_c10d_functional", 0) == 0 || name.rfind("_dtensor::", 0) == 0;
}

// An uninitialised buffer's values are whatever it held. A random op that
// learn_values runs draws from torch's CPU generator (or the CPU generator
// it is given), as the real run's host code does: values the run could have
// drawn, as good for memory as its own. The trace puts the CPU generator
// back when it ends.
bool makes_run_values(const c10::OperatorHandle& op) {
  const std::string& name = op.schema().name();
  return name.find("empty") == std::string::npos && name.find("resize") == std::string::npos &&
         !is_collective(name);
}

bool is_written(const c10::FunctionSchema& schema, std::size_t argument) {
  const c10::AliasInfo* alias = schema.arguments()[argument].alias_info();
  return alias != nullptr && alias->isWrite();
}

// Ops that write an argument without reading what it held: out= variants,
// fills, copies and random fills (random_, uniform_). Only these give a
// buffer of unknown values known ones.
bool overwrites(const c10::OperatorHandle& op, std::size_t argument) {
  const c10::FunctionSchema& schema = op.schema();
  if (schema.arguments()[argument].is_out() || (is_random(op) && is_written(schema, argument))) return true;
  static const std::unordered_map<std::string_view, bool> fills = {
      {"aten::fill_", true}, {"aten::zero_", true}, {"aten::copy_", true}};
  return fills.count(schema.name()) != 0 && argument == 0;
}

bool covers_its_buffer(const at::Tensor& t) {
  const at::Tensor& inner = inner_tensor(t);
  return inner.storage_offset() == 0 && inner.is_non_overlapping_and_dense() &&
         static_cast<std::size_t>(bytes_of(inner)) == inner.unsafeGetTensorImpl()->unsafe_storage().nbytes();
}

void forget_written(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> arguments) {
  if (!g_any.load(std::memory_order_relaxed)) return;
  auto forget = [](const at::Tensor& t) {
    if (t.defined() && is_meta_tensor(t)) forget_values(buffer_of(t));
  };
  for (std::size_t i = 0; i < arguments.size(); ++i) {
    if (!is_written(schema, i)) continue;
    if (arguments[i].isTensor()) forget(arguments[i].toTensor());
    if (arguments[i].isTensorList())  // a foreach op's
      for (const at::Tensor& t : arguments[i].toTensorList()) forget(t);
  }
}

// The bytes an op may touch, at most twice its limit: its outputs and its
// inputs' buffers, each buffer once (torch.diff's two views of one buffer)
// and no more than the buffer holds (position ids expanded over the batch
// read one row).
class Budget {
 public:
  explicit Budget(std::int64_t limit) : left_(2 * limit) {}
  void spend(std::int64_t bytes) { left_ -= bytes; }
  bool within() const { return left_ >= 0; }
  // Spends what `t` reads, unless its buffer was counted; whether still within.
  bool spend_on(const at::Tensor& t) {
    const BufferId id = buffer_of(t);
    if (std::find(counted_.begin(), counted_.end(), id) == counted_.end()) {
      counted_.push_back(id);
      const auto buffer = static_cast<std::int64_t>(inner_tensor(t).unsafeGetTensorImpl()->unsafe_storage().nbytes());
      spend(std::min(bytes_of(t), buffer));
    }
    return within();
  }

 private:
  std::int64_t left_;
  c10::SmallVector<BufferId, 4> counted_;
};

// The argument as the real op takes it, or nullopt when its values are
// unknown or the op would touch more than its budget.
std::optional<at::Tensor> real_tensor(const at::Tensor& t, bool overwritten, Budget& budget) {
  if (!t.defined() || !is_meta_tensor(t)) return t;
  if (!budget.spend_on(t)) return std::nullopt;
  if (c10::Storage values = values_of(buffer_of(t)); values) return view_of(values, t);
  if (overwritten && covers_its_buffer(t)) return view_of(new_values(t), t);
  return std::nullopt;
}

std::optional<c10::IValue> real_argument(const c10::IValue& value, bool overwritten, Budget& budget) {
  if (value.isTensor()) {
    auto t = real_tensor(value.toTensor(), overwritten, budget);
    return t ? std::optional<c10::IValue>(*t) : std::nullopt;
  }
  if (value.isTensorList()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& element : value.toTensorList()) {
      auto t = real_tensor(element, overwritten, budget);
      if (!t) return std::nullopt;
      list.push_back(*t);
    }
    return c10::IValue(std::move(list));
  }
  if (value.isList() && !value.toListRef().empty() && (value.toListRef()[0].isTensor() || value.toListRef()[0].isNone())) {
    c10::List<std::optional<at::Tensor>> list;
    for (const c10::IValue& element : value.toListRef()) {
      if (element.isNone()) {
        list.push_back(std::nullopt);
        continue;
      }
      auto t = real_tensor(element.toTensor(), overwritten, budget);
      if (!t) return std::nullopt;
      list.push_back(*t);
    }
    return c10::IValue(std::move(list));
  }
  if (value.isDevice()) return c10::IValue(c10::Device(c10::kCPU));
  return value;
}

bool holds_buffer_of(c10::ArrayRef<c10::IValue> arguments, BufferId id) {
  for (const c10::IValue& value : arguments) {
    if (value.isTensor() && is_meta_tensor(value.toTensor()) && buffer_of(value.toTensor()) == id) return true;
    if (value.isTensorList())
      for (const at::Tensor& t : value.toTensorList())
        if (is_meta_tensor(t) && buffer_of(t) == id) return true;
  }
  return false;
}

// Keeps a new buffer's values: the real result's own storage when it is
// laid out as the MetaTensor (the kernels agree) and no other tensor's, else
// a copy in its layout.
void keep(const at::Tensor& traced, const at::Tensor& real, c10::ArrayRef<c10::IValue> arguments) {
  if (!traced.defined() || !is_meta_tensor(traced) || !real.defined()) return;
  const BufferId id = buffer_of(traced);
  if (id == 0 || holds_buffer_of(arguments, id)) return;  // a view, or an argument written in place
  const at::Tensor& inner = inner_tensor(traced);
  if (real.sizes() != inner.sizes() || real.dtype() != inner.dtype()) return;  // kernels that disagree: unknown
  if (real.storage().use_count() == 1 &&
      real.storage().nbytes() == inner.unsafeGetTensorImpl()->unsafe_storage().nbytes() &&
      real.storage_offset() == inner.storage_offset() && real.sizes() == inner.sizes() &&
      real.strides() == inner.strides()) {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_values[id] = real.storage();
    g_any.store(true, std::memory_order_relaxed);
    return;
  }
  view_of(new_values(traced), traced).copy_(real);
}

// Two ops torch calls to check a condition, on values a trace does not
// know, answered as the healthy step a trace stands for answers them (the
// fault they hunt is in values, which a trace has not): anomaly mode's
// check of every gradient backward makes for NaN,
// isnan(grad)._is_any_true().item(), finds none; _is_all_true, which
// torch.distributions' checks of their arguments and samples and
// torch._check_tensor_all read, holds.
std::optional<bool> healthy_check(const c10::FunctionSchema& schema) {
  if (schema.name() == "aten::_is_all_true") return true;
  if (schema.name() == "aten::_is_any_true" && torch::autograd::AnomalyMode::is_enabled() &&
      torch::autograd::AnomalyMode::should_check_nan())
    return false;
  return std::nullopt;
}

bool is_integer(const at::Tensor& t) { return c10::isIntegralType(t.scalar_type(), /*includeBool=*/false); }

// Index arithmetic: a comparison of integer tensors (`position_diff != 1`).
bool compares_integers(c10::ArrayRef<c10::IValue> arguments) {
  bool any = false;
  for (const c10::IValue& value : arguments)
    if (value.isTensor()) {
      if (!is_integer(value.toTensor())) return false;
      any = true;
    }
  return any;
}

// An integer tensor's values as the host reads them: a real host tensor's
// own, or those the trace knows of a traced one.
std::optional<at::Tensor> host_values(const at::Tensor& t) {
  const bool traced = is_meta_tensor(t) || t.is_meta();
  return traced ? known_values(t) : t;
}

// Real integer `values`, flattened in order.
std::vector<std::int64_t> flattened(const at::Tensor& values) {
  OutsideMetaMode outside;
  InsideMetaCall inside;  // the read's tensors are not the step's
  const at::Tensor flat = values.to(at::kLong).contiguous().view(-1);
  const std::int64_t* data = flat.const_data_ptr<std::int64_t>();
  return std::vector<std::int64_t>(data, data + flat.numel());
}

// Real `values` without the repeats along the dimensions they are broadcast
// along (stride 0), each of those one long.
at::Tensor unrepeated(const at::Tensor& values) {
  c10::SmallVector<std::int64_t, 6> sizes(values.sizes().begin(), values.sizes().end());
  for (std::int64_t d = 0; d < values.dim(); ++d)
    if (values.stride(d) == 0) sizes[d] = std::min<std::int64_t>(sizes[d], 1);
  OutsideMetaMode outside;
  InsideMetaCall inside;
  return values.as_strided(sizes, values.strides(), values.storage_offset());
}

// The first of `index`'s known values outside [lowest, size), if any. An
// index broadcast along a dimension repeats its values there, and the first
// out of range lies where that coordinate is 0: the repeats are not read.
// (torchtitan's RoPE gathers with its 16,384 positions expanded over 64
// rotary features: reading every repeat cost a 405B rank's trace 1 to 2 s.)
std::optional<std::int64_t> first_outside(const at::Tensor& index, std::int64_t lowest, std::int64_t size) {
  if (!index.defined() || !is_integer(index)) return std::nullopt;
  if (const auto values = host_values(index))
    for (const std::int64_t value : flattened(unrepeated(*values)))
      if (value < lowest || value >= size) return value;
  return std::nullopt;
}

std::int64_t size_at(const at::Tensor& self, std::int64_t dim) {
  return self.dim() == 0 ? 1 : self.size(c10::maybe_wrap_dim(dim, self.dim()));
}

// The indexing ops check_known_indices looks at, found once: it is asked
// about every op a trace runs.
struct IndexingOps {
  const c10::OperatorName *embedding, *index_select, *gather, *index;
};

const IndexingOps& indexing_ops() {
  static const IndexingOps ops = [] {
    auto find = [](const char* name, const char* overload) -> const c10::OperatorName* {
      const auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
      return handle ? &handle->operator_name() : nullptr;
    };
    return IndexingOps{find("aten::embedding", ""), find("aten::index_select", ""), find("aten::gather", ""),
                       find("aten::index", "Tensor")};
  }();
  return ops;
}

}  // namespace

void check_known_indices(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments) {
  const IndexingOps& ops = indexing_ops();
  const c10::OperatorName* name = &op.operator_name();
  if (name == ops.embedding || name == ops.index_select) {
    const bool embedding = name == ops.embedding;
    const at::Tensor& self = arguments[0].toTensor();
    const std::int64_t dim = embedding ? 0 : arguments[1].toInt();
    TORCH_CHECK_INDEX(!first_outside(arguments[embedding ? 1 : 2].toTensor(), 0, size_at(self, dim)),
                      "index out of range in self");
  } else if (name == ops.gather) {
    const at::Tensor& self = arguments[0].toTensor();
    const std::int64_t dim = arguments[1].toInt(), size = size_at(self, dim);
    if (const auto bad = first_outside(arguments[2].toTensor(), 0, size))
      TORCH_CHECK(false, "index ", *bad, " is out of bounds for dimension ", dim, " with size ", size);
  } else if (name == ops.index) {
    const at::Tensor& self = arguments[0].toTensor();
    const auto indices = arguments[1].toListRef();
    // Masks take several dimensions each: positions then say nothing.
    for (const c10::IValue& index : indices)
      if (index.isTensor() && !is_integer(index.toTensor())) return;
    for (std::size_t k = 0; k < indices.size() && static_cast<std::int64_t>(k) < self.dim(); ++k) {
      if (!indices[k].isTensor()) continue;
      const std::int64_t size = self.size(static_cast<std::int64_t>(k));
      if (const auto bad = first_outside(indices[k].toTensor(), -size, size))
        TORCH_CHECK_INDEX(false, "index ", *bad, " is out of bounds for dimension ", k, " with size ", size);
    }
  }
}

void learn_values(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments,
                  c10::ArrayRef<c10::IValue> returns, c10::function_ref<void()> before_running) {
  const c10::FunctionSchema& schema = op.schema();
  // set_ points a tensor at another buffer and writes no bytes: the values
  // stay with their buffers (copy.deepcopy sets a tensor on a copied one).
  if (schema.name() == "aten::set_") return;
  std::int64_t made = 0;
  bool integers = true, bools = true, numbers = true;
  for (const c10::IValue& value : returns)
    if (value.isTensor()) {
      made += bytes_of(value.toTensor());
      integers = integers && is_integer(value.toTensor());
      bools = bools && value.toTensor().scalar_type() == at::kBool;
      numbers = numbers && value.toTensor().numel() <= 1;
    }
  const std::int64_t limit = integers || (bools && compares_integers(arguments)) ? kKnownIndicesLimit
                                                                                : kKnownValuesLimit;
  // The host's draws (seeds, a sampler's permutation, token ids, a
  // transform's coin flip) are integers or single numbers; a model's random
  // weights and inputs stay without values, costing the trace nothing.
  const bool host_draw = integers || numbers;
  if (made > limit || !makes_run_values(op) || (is_random(op) && !host_draw))
    return forget_written(schema, arguments);
  Budget budget(limit);
  budget.spend(made);

  OutsideMetaMode outside;
  InsideMetaCall inside;  // the values' buffers are not the step's
  torch::jit::Stack stack;
  for (std::size_t i = 0; i < arguments.size(); ++i) {
    auto value = real_argument(arguments[i], overwrites(op, i), budget);
    if (!value) {
      if (const std::optional<bool> healthy = healthy_check(schema))
        return keep(returns[0].toTensor(), at::zeros({}, at::kBool).fill_(*healthy), arguments);
      return forget_written(schema, arguments);
    }
    stack.push_back(std::move(*value));
  }
  before_running();
  try {
    op.callBoxed(stack);
  } catch (const std::exception&) {  // a kernel refusing what the meta kernel took
    return forget_written(schema, arguments);
  }
  for (std::size_t r = 0; r < returns.size() && r < stack.size(); ++r) {
    if (returns[r].isTensor() && stack[r].isTensor()) {
      keep(returns[r].toTensor(), stack[r].toTensor(), arguments);
    } else if (returns[r].isTensorList() && stack[r].isTensorList()) {
      const auto traced = returns[r].toTensorList();
      const auto real = stack[r].toTensorList();
      for (std::size_t i = 0; i < traced.size() && i < real.size(); ++i) keep(traced[i], real[i], arguments);
    }
  }
}

std::optional<at::Tensor> known_values(const at::Tensor& t) {
  c10::Storage values = values_of(buffer_of(t));
  if (!values) return std::nullopt;
  OutsideMetaMode outside;
  return view_of(values, t);
}

std::optional<std::vector<std::int64_t>> known_integers(const at::Tensor& t) {
  const std::optional<at::Tensor> values = host_values(t);
  if (!values) return std::nullopt;
  return flattened(*values);
}

void forget_values(BufferId id) {
  if (!g_any.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_values.erase(id);
}

void forget_all_values() {
  std::unordered_map<BufferId, c10::Storage> values;  // freed once the lock is released
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    values.swap(g_values);
    g_any.store(false, std::memory_order_relaxed);
  }
}

}  // namespace metamem
