#include "meta/MetaTensor.h"

#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace metamem {
namespace {

// A real tensor's storage is shared by its views and counted by them, and
// torch reads that count: autograd adds a gradient into the one it holds
// only when nothing else holds its storage (InputBuffer's
// can_accumulate_inplace), and Python compares storages (untyped_storage(),
// is_alias_of). The inner meta storage is counted by the inner tensors, one
// per MetaTensor, so a MetaTensor carries an outer storage instead: one per
// inner storage, shared by every MetaTensor whose inner tensor uses it, so
// its use count is theirs. It keeps its inner storage, and with it the
// traced buffer, alive: a Python storage object keeps memory as a real one
// does. It holds no data: reading its address stops with kNoDataMessage, where a
// null pointer would let numpy() read address zero.
struct OuterStorageLink {
  c10::Storage inner;
  const c10::StorageImpl* outer;
};

std::mutex g_outer_mutex;
std::unordered_map<const c10::StorageImpl*, c10::weak_intrusive_ptr<c10::StorageImpl>> g_outer;

// The outer storage's deleter: it runs when the last MetaTensor (or Python
// storage object) holding the outer storage lets it go.
void forget_outer(void* context) {
  std::unique_ptr<OuterStorageLink> link(static_cast<OuterStorageLink*>(context));
  std::lock_guard<std::mutex> lock(g_outer_mutex);
  const auto found = g_outer.find(link->inner.unsafeGetStorageImpl());
  // A lookup that found this one dying has already replaced it.
  if (found != g_outer.end() && found->second._unsafe_get_target() == link->outer) g_outer.erase(found);
  // The link dies after the lock: releasing the inner storage may free the
  // traced buffer, which reports to the observer.
}

c10::Storage outer_storage(const at::Tensor& inner, c10::Device fake_device) {
  const c10::Storage& storage = inner.unsafeGetTensorImpl()->unsafe_storage();
  c10::StorageImpl* key = storage.unsafeGetStorageImpl();
  if (key == nullptr) return {};
  std::lock_guard<std::mutex> lock(g_outer_mutex);
  const auto found = g_outer.find(key);
  if (found != g_outer.end())
    if (c10::intrusive_ptr<c10::StorageImpl> alive = found->second.lock()) return c10::Storage(std::move(alive));
  auto link = std::make_unique<OuterStorageLink>(OuterStorageLink{storage, nullptr});
  auto outer = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), key->nbytes(),
      c10::DataPtr(nullptr, link.get(), &forget_outer, fake_device), /*allocator=*/nullptr,
      /*resizable=*/false);
  outer->release_data_and_set_meta_custom_data_ptr_error_msg_(std::string(kNoDataMessage));
  link.release()->outer = outer.get();
  c10::weak_intrusive_ptr<c10::StorageImpl> weak(outer);
  if (found != g_outer.end())
    found->second = std::move(weak);
  else
    g_outer.emplace(key, std::move(weak));
  return c10::Storage(std::move(outer));
}

constexpr c10::DispatchKeySet kMetaTensorKeys{c10::DispatchKey::PrivateUse1,
                                              c10::DispatchKey::AutogradPrivateUse1};

class MetaTensorImpl;

std::atomic<bool> g_host_beside_gpu{false};

// Every MetaTensorImpl alive, linked through themselves (a trace makes and
// frees them by the million): retire_meta_tensors() walks them.
std::mutex g_alive_mutex;
MetaTensorImpl* g_alive = nullptr;

class MetaTensorImpl final : public c10::TensorImpl {
 public:
  MetaTensorImpl(at::Tensor inner, c10::Device fake_device)
      : TensorImpl(kMetaTensorKeys, inner.dtype(), fake_device), inner_(std::move(inner)) {
    {
      std::lock_guard<std::mutex> lock(g_alive_mutex);
      next_ = g_alive;
      if (next_ != nullptr) next_->previous_ = this;
      g_alive = this;
    }
    // A PrivateUse1 tensor gets PrivateUse1's autocast key, which
    // autocast("cuda") and autocast("cpu") do not enable: add the one a real
    // tensor of the fake device has, so autocast casts as it would. Beside
    // host tensors, a tensor of either device has both, so that host and
    // GPU tensors are of one kind, as a real CPU and CUDA tensor are:
    // `param.data = moved` and Module._apply move a parameter in place
    // across them (a head tied to its embedding stays tied). Each autocast
    // casts only tensors of its own device, so the other key changes no cast.
    key_set_ = key_set_ | (g_host_beside_gpu.load(std::memory_order_relaxed)
                               ? c10::DispatchKeySet({c10::DispatchKey::AutocastCPU, c10::DispatchKey::AutocastCUDA})
                               : c10::DispatchKeySet(fake_device.is_cuda() ? c10::DispatchKey::AutocastCUDA
                                                                           : c10::DispatchKey::AutocastCPU));
    follow_inference(inner_.is_inference());
    sync();
  }

  ~MetaTensorImpl() override {
    std::lock_guard<std::mutex> lock(g_alive_mutex);
    (previous_ != nullptr ? previous_->next_ : g_alive) = next_;
    if (next_ != nullptr) next_->previous_ = previous_;
  }

  const at::Tensor& inner() const { return inner_; }

  // TensorImpl's constructor makes every tensor made in inference mode an
  // inference tensor (no autograd keys, no version counter). torch makes a
  // view of a normal tensor with its base's keys even there, and autograd
  // then gives it the base's version counter, which an inference tensor
  // refuses. The op made the inner tensor as torch makes it: be what it is.
  void follow_inference(bool inference) {
    if (inference == is_inference()) return;
    const c10::DispatchKeySet autograd = c10::autograd_dispatch_keyset_with_ADInplaceOrView;
    if (inference) {
      key_set_ = key_set_ - autograd;
      version_counter_ = c10::VariableVersion(c10::VariableVersion::DISABLED);
    } else {
      key_set_ = key_set_ | c10::getAutogradRelatedKeySetFromBackend(c10::BackendComponent::PrivateUse1Bit);
      version_counter_ = c10::VariableVersion(0);
    }
  }

  static void retire_all() {
    std::lock_guard<std::mutex> lock(g_alive_mutex);
    for (MetaTensorImpl* impl = g_alive; impl != nullptr; impl = impl->next_) impl->device_opt_ = c10::Device(c10::kMeta);
  }

  void sync() {
    set_sizes_and_strides(inner_.sizes(), inner_.strides());
    storage_offset_ = inner_.storage_offset();
    // set_ and out= arguments may have moved the inner tensor onto another
    // storage, resize_ may have grown it.
    const c10::StorageImpl* current = inner_.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
    if (!storage_ || inner_storage(storage_) != current) storage_ = outer_storage(inner_, *device_opt_);
    if (storage_) storage_.set_nbytes(current->nbytes());
  }

  // tensor_data(), variable_data() and detach() come here; the base version
  // would drop inner_.
  c10::intrusive_ptr<TensorImpl> shallow_copy_and_detach(
      const c10::VariableVersion& version_counter,
      bool allow_tensor_metadata_change) const override {
    return detached_copy(version_counter, allow_tensor_metadata_change);
  }
  c10::intrusive_ptr<TensorImpl> shallow_copy_and_detach(
      c10::VariableVersion&& version_counter,
      bool allow_tensor_metadata_change) const override {
    return detached_copy(std::move(version_counter), allow_tensor_metadata_change);
  }

  // Tensor::set_data() comes here.
  void shallow_copy_from(const c10::intrusive_ptr<TensorImpl>& impl) override {
    auto* other = static_cast<MetaTensorImpl*>(impl.get());
    copy_tensor_metadata(other, this, version_counter(), allow_tensor_metadata_change());
    inner_ = other->inner_;
    refresh_numel();
    refresh_contiguous();
  }

  // A tensor kept only by weak references (e.g. autograd's grad accumulator)
  // must free its buffer as a real one would.
  void release_resources() override {
    TensorImpl::release_resources();
    inner_.reset();
  }

 private:
  template <typename Version>
  c10::intrusive_ptr<TensorImpl> detached_copy(Version&& version_counter,
                                               bool allow_tensor_metadata_change) const {
    auto inner_copy = inner_.unsafeGetTensorImpl()->shallow_copy_and_detach(
        inner_.is_inference() ? c10::VariableVersion(c10::VariableVersion::DISABLED) : c10::VariableVersion(0),
        true);
    auto impl = c10::make_intrusive<MetaTensorImpl>(at::Tensor(std::move(inner_copy)),
                                                    *device_opt_);
    copy_tensor_metadata(this, impl.get(), std::forward<Version>(version_counter),
                         allow_tensor_metadata_change);
    impl->refresh_numel();
    impl->refresh_contiguous();
    return impl;
  }

  at::Tensor inner_;
  MetaTensorImpl* previous_ = nullptr;
  MetaTensorImpl* next_ = nullptr;
};

MetaTensorImpl* impl_of(const at::Tensor& t) {
  return static_cast<MetaTensorImpl*>(t.unsafeGetTensorImpl());
}

}  // namespace

at::Tensor make_meta_tensor(at::Tensor inner, c10::Device fake_device) {
  return at::Tensor(c10::make_intrusive<MetaTensorImpl>(std::move(inner), fake_device));
}

// The PrivateUse1 backend is metamem's alone, so its bit identifies a MetaTensor.
bool is_meta_tensor(const at::Tensor& t) {
  return t.defined() &&
         t.unsafeGetTensorImpl()->key_set().has_backend(c10::BackendComponent::PrivateUse1Bit);
}

const at::Tensor& inner_tensor(const at::Tensor& t) { return impl_of(t)->inner(); }

void sync_meta_tensor(const at::Tensor& t) { impl_of(t)->sync(); }

void retire_meta_tensors() { MetaTensorImpl::retire_all(); }

void set_host_beside_gpu(bool on) { g_host_beside_gpu.store(on, std::memory_order_relaxed); }

bool is_meta_storage(const c10::Storage& storage) {
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  return impl != nullptr && impl->_mutable_data_ptr_no_checks().get_deleter() == &forget_outer;
}

c10::StorageImpl* inner_storage(const c10::Storage& storage) {
  const auto& data = storage.unsafeGetStorageImpl()->_mutable_data_ptr_no_checks();
  return static_cast<const OuterStorageLink*>(data.get_context())->inner.unsafeGetStorageImpl();
}

}  // namespace metamem
