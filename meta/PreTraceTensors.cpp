#include "meta/PreTraceTensors.h"

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace metamem {
namespace {

struct KeptBytes {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  std::vector<char> bytes;  // plain host memory: no allocation the trace hears
};

struct KeptGrad {
  c10::weak_intrusive_ptr<c10::TensorImpl> leaf;
  at::Tensor grad;  // undefined where it had none
};

// Backward runs on autograd's threads as well as the caller's.
std::mutex g_mutex;
std::unordered_map<const c10::StorageImpl*, KeptBytes> g_bytes;
std::unordered_map<const c10::TensorImpl*, KeptGrad> g_grads;

}  // namespace

void keep_before_real_write(const at::Tensor& t) {
  const c10::Storage& storage = t.storage();
  if (!storage || storage.nbytes() == 0 || storage.data() == nullptr) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_bytes.count(storage.unsafeGetStorageImpl()) != 0) return;
  const char* data = static_cast<const char*>(storage.data());
  g_bytes.emplace(storage.unsafeGetStorageImpl(),
                  KeptBytes{storage.getWeakStorageImpl(), std::vector<char>(data, data + storage.nbytes())});
}

void keep_grad_of_leaf(const at::Tensor& t) {
  if (!t.requires_grad()) return;
  const at::Tensor leaf = t.is_view() ? at::Tensor(t._base()) : t;
  if (!leaf.is_leaf()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_grads.count(leaf.unsafeGetTensorImpl()) != 0) return;
  g_grads.emplace(leaf.unsafeGetTensorImpl(),
                  KeptGrad{c10::weak_intrusive_ptr<c10::TensorImpl>(leaf.getIntrusivePtr()), leaf.grad()});
}

void restore_pre_trace_tensors() {
  std::unordered_map<const c10::StorageImpl*, KeptBytes> bytes;
  std::unordered_map<const c10::TensorImpl*, KeptGrad> grads;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    bytes.swap(g_bytes);
    grads.swap(g_grads);
  }
  for (auto& [_, kept] : bytes)
    if (const auto storage = kept.storage.lock(); storage && storage->data() != nullptr)
      // A storage the block resized keeps its new size; the bytes both sizes hold are put back.
      std::memcpy(storage->mutable_data(), kept.bytes.data(), std::min(kept.bytes.size(), storage->nbytes()));
  // The traced gradients replaced here die with the trace's other tensors.
  for (auto& [_, kept] : grads)
    if (auto leaf = kept.leaf.lock()) at::Tensor(std::move(leaf)).mutable_grad() = std::move(kept.grad);
}

}  // namespace metamem
