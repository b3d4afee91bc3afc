#include "meta/FakeCuda.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <memory>
#include <mutex>

namespace metamem {
namespace {

// One fake CUDA device with one stream; events are no-ops because nothing
// ever runs asynchronously.
class FakeCudaGuard final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return c10::kCUDA; }
  c10::Device exchangeDevice(c10::Device) const override { return device(); }
  c10::Device getDevice() const override { return device(); }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const noexcept override { return stream(); }
  c10::Stream getDefaultStream(c10::Device) const override { return stream(); }
  c10::Stream getStreamFromGlobalPool(c10::Device, bool) const override { return stream(); }
  c10::Stream exchangeStream(c10::Stream) const noexcept override { return stream(); }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  void record(void**, const c10::Stream&, const c10::DeviceIndex,
              const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}

 private:
  static c10::Device device() { return c10::Device(c10::kCUDA, 0); }
  static c10::Stream stream() { return c10::Stream(c10::Stream::DEFAULT, device()); }
};

std::atomic<bool> g_fake_cuda_active{false};

// Autograd stashes the caller's CUDA streams only when hasCUDA() is true, and
// later reads them for every CUDA leaf: without these hooks it reads past the
// end of an empty vector and crashes after the last backward op.
class FakeCudaHooks final : public at::CUDAHooksInterface {
 public:
  bool hasCUDA() const override { return g_fake_cuda_active.load(); }
  // torch::manual_seed initialises and seeds every CUDA device it sees: the
  // fake one has nothing to initialise and a generator of its own (nothing
  // draws from it; meta kernels draw nothing).
  void initCUDA() const override {}
  const at::Generator& getDefaultCUDAGenerator(c10::DeviceIndex) const override {
    static const at::Generator generator = at::detail::createCPUGenerator();
    return generator;
  }
  bool hasPrimaryContext(int64_t) const override { return g_fake_cuda_active.load(); }
  int getNumGPUs() const override { return g_fake_cuda_active.load() ? 1 : 0; }
};

}  // namespace

void install_fake_cuda() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (!c10::impl::hasDeviceGuardImpl(c10::kCUDA)) {
      static FakeCudaGuard guard;
      static c10::impl::DeviceGuardImplRegistrar registrar(c10::kCUDA, &guard);
    }
    if (!at::CUDAHooksRegistry()->Has("CUDAHooks")) {
      at::CUDAHooksRegistry()->Register("CUDAHooks", [](at::CUDAHooksArgs) {
        return std::unique_ptr<at::CUDAHooksInterface>(new FakeCudaHooks());
      });
    }
  });
}

void set_fake_cuda_active(bool active) { g_fake_cuda_active.store(active); }

}  // namespace metamem
