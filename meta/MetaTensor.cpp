#include "meta/MetaTensor.h"

#include <c10/core/TensorImpl.h>

namespace metamem {
namespace {

constexpr c10::DispatchKeySet kMetaTensorKeys{c10::DispatchKey::PrivateUse1,
                                              c10::DispatchKey::AutogradPrivateUse1};

class MetaTensorImpl final : public c10::TensorImpl {
 public:
  MetaTensorImpl(at::Tensor inner, c10::Device fake_device)
      : TensorImpl(kMetaTensorKeys, inner.dtype(), fake_device), inner_(std::move(inner)) {
    // libtorch 1.13 gives PrivateUse1 tensors no autocast key: take the one
    // a real tensor of the fake device has, so autocast casts as it would.
    key_set_ = key_set_.add(fake_device.is_cuda() ? c10::DispatchKey::AutocastCUDA : c10::DispatchKey::AutocastCPU);
    set_storage_access_should_throw();
    sync();
  }

  const at::Tensor& inner() const { return inner_; }

  void sync() {
    set_sizes_and_strides(inner_.sizes(), inner_.strides());
    storage_offset_ = inner_.storage_offset();
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
        c10::VariableVersion(0), true);
    auto impl = c10::make_intrusive<MetaTensorImpl>(at::Tensor(std::move(inner_copy)),
                                                    *device_opt_);
    copy_tensor_metadata(this, impl.get(), std::forward<Version>(version_counter),
                         allow_tensor_metadata_change);
    impl->refresh_numel();
    impl->refresh_contiguous();
    return impl;
  }

  at::Tensor inner_;
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

}  // namespace metamem
