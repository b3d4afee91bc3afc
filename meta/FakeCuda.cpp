#include "meta/FakeCuda.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/AutogradState.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <cstring>
#include <exception>
#include <memory>

#include "meta/CudaAttention.h"
#include "meta/CudnnRnnCall.h"

namespace metamem {
namespace {

// What libtorch's CUDA library says of itself without asking a device (the
// versions of cuDNN and the CUDA runtime it was built with and loads):
// torch.backends.cudnn asks it. Read from the hooks libtorch registered,
// before the fake's answers replace them; where they cannot say (metamem's
// own programs do not load that library), the fake cannot either.
// An answer of the real hooks: its value, or the error they gave.
template <typename T>
class Answer {
 public:
  template <typename Query>
  explicit Answer(Query&& query) {
    try {
      value_ = query();
    } catch (const c10::Error&) {
      error_ = std::current_exception();
    }
  }
  T get() const {
    if (error_) std::rethrow_exception(error_);
    return value_;
  }

 private:
  T value_{};
  std::exception_ptr error_;
};

// The answer of a build, where no hooks are asked.
template <typename T>
Answer<T> answered(T value) {
  return Answer<T>([value] { return value; });
}

struct CudaLibraryFacts {
  explicit CudaLibraryFacts(const at::CUDAHooksInterface& hooks)
      : has_cudnn(hooks.hasCuDNN()),
        has_cudart(hooks.hasCUDART()),
        has_cublaslt(hooks.hasCuBLASLt()),
        compiled_with_cudnn(hooks.compiledWithCuDNN()),
        dilated_cudnn(hooks.supportsDilatedConvolutionWithCuDNN()),
        depthwise_cudnn(hooks.supportsDepthwiseConvolutionWithCuDNN()),
        cudnn([&] { return hooks.versionCuDNN(); }),
        cudnn_runtime([&] { return hooks.versionRuntimeCuDNN(); }),
        cudnn_frontend([&] { return hooks.versionCuDNNFrontend(); }),
        cudart([&] { return hooks.versionCUDART(); }),
        batchnorm_min_epsilon([&] { return hooks.batchnormMinEpsilonCuDNN(); }) {}

  // A CUDA build with cuDNN, as the hooks of the wheel's CUDA library answer
  // without asking a device: cuDNN 9's CUDNN_BN_MIN_EPSILON is 0 (cudnn_ops.h),
  // and the frontend's version is not known outside that library.
  CudaLibraryFacts(CudnnBuild build, const CudaLibraryFacts& loaded)
      : has_cudnn(true),
        has_cudart(true),
        has_cublaslt(true),
        compiled_with_cudnn(true),
        dilated_cudnn(true),
        depthwise_cudnn(true),
        cudnn(answered(build.cudnn_version)),
        cudnn_runtime(answered(build.cudnn_runtime_version)),
        cudnn_frontend(loaded.cudnn_frontend),
        cudart(answered(build.cudart_version)),
        batchnorm_min_epsilon(answered(0.0)) {}

  bool has_cudnn, has_cudart, has_cublaslt, compiled_with_cudnn, dilated_cudnn, depthwise_cudnn;
  Answer<long> cudnn, cudnn_runtime, cudnn_frontend, cudart;
  Answer<double> batchnorm_min_epsilon;
};

const CudaLibraryFacts& loaded_cuda_library_facts() {
  static const CudaLibraryFacts facts(at::detail::getCUDAHooks());
  return facts;
}

// A CudnnBuildScope's facts.
std::atomic<const CudaLibraryFacts*> g_cudnn_build{nullptr};

const CudaLibraryFacts& cuda_library_facts() {
  const CudaLibraryFacts* build = g_cudnn_build.load();
  return build ? *build : loaded_cuda_library_facts();
}

// One fake CUDA device with one stream; events are no-ops because nothing
// ever runs asynchronously.
class FakeCudaGuard final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return c10::kCUDA; }
  c10::Device exchangeDevice(c10::Device) const override { return device(); }
  c10::Device getDevice() const override { return device(); }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const override { return stream(); }
  c10::Stream getDefaultStream(c10::Device) const override { return stream(); }
  c10::Stream getStreamFromGlobalPool(c10::Device, bool) const override { return stream(); }
  c10::Stream getNewStream(c10::Device, int) const override { return stream(); }
  c10::Stream exchangeStream(c10::Stream) const override { return stream(); }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  void record(void**, const c10::Stream&, const c10::DeviceIndex,
              const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}

 private:
  static c10::Device device() { return c10::Device(c10::kCUDA, 0); }
  static c10::Stream stream() { return c10::Stream(c10::Stream::DEFAULT, device()); }
};

// What libtorch asks the CUDA hooks during a step: whether there is CUDA
// (at::getAccelerator(), which autograd asks for the streams it syncs
// gradients on), a device and its context, and the generator
// torch::manual_seed seeds (the fake device's own; meta kernels draw
// nothing from it); what the CUDA library says of itself stays its answer.
class FakeCudaHooks final : public at::CUDAHooksInterface {
 public:
  bool hasCuDNN() const override { return cuda_library_facts().has_cudnn; }
  bool hasCUDART() const override { return cuda_library_facts().has_cudart; }
  bool hasCuBLASLt() const override { return cuda_library_facts().has_cublaslt; }
  bool compiledWithCuDNN() const override { return cuda_library_facts().compiled_with_cudnn; }
  bool supportsDilatedConvolutionWithCuDNN() const override { return cuda_library_facts().dilated_cudnn; }
  bool supportsDepthwiseConvolutionWithCuDNN() const override { return cuda_library_facts().depthwise_cudnn; }
  long versionCuDNN() const override { return cuda_library_facts().cudnn.get(); }
  long versionRuntimeCuDNN() const override { return cuda_library_facts().cudnn_runtime.get(); }
  long versionCuDNNFrontend() const override { return cuda_library_facts().cudnn_frontend.get(); }
  long versionCUDART() const override { return cuda_library_facts().cudart.get(); }
  double batchnormMinEpsilonCuDNN() const override { return cuda_library_facts().batchnorm_min_epsilon.get(); }
  void deviceSynchronize(c10::DeviceIndex) const override {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasCUDA() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override { return 1; }
  int getNumGPUs() const override { return 1; }
  c10::DeviceIndex current_device() const override { return 0; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  void setCurrentDevice(c10::DeviceIndex) const override {}
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex) const override { return 0; }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex) const override { return 0; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    static const at::Generator generator = at::detail::createCPUGenerator();
    return generator;
  }
};

// libtorch makes its CUDA hooks object once and keeps it for the process:
// the real one where its CUDA library is loaded (it reports no CUDA without
// a GPU), a stub otherwise. Neither adds members to the interface, so the
// scope gives the object the fake's virtual table and later its own back.
static_assert(sizeof(FakeCudaHooks) == sizeof(at::CUDAHooksInterface));

void* virtual_table(const at::CUDAHooksInterface& hooks) {
  void* table = nullptr;
  std::memcpy(&table, static_cast<const void*>(&hooks), sizeof table);
  return table;
}

void* exchange_cuda_hooks_table(void* table) {
  auto& hooks = const_cast<at::CUDAHooksInterface&>(at::detail::getCUDAHooks());
  void* previous = virtual_table(hooks);
  std::memcpy(static_cast<void*>(&hooks), &table, sizeof table);
  return previous;
}

// Returns the real hooks' table, read before the fake answers in its place.
void* install_fake_cuda_hooks() {
  loaded_cuda_library_facts();
  return exchange_cuda_hooks_table(virtual_table(FakeCudaHooks()));
}

// The registry holds its guards forever: this one is never destroyed.
const FakeCudaGuard* fake_guard() {
  static const auto* guard = new FakeCudaGuard();
  return guard;
}

std::atomic<bool> g_traced_multithreading{true};

auto& cuda_guard_slot() {
  return c10::impl::device_guard_impl_registry[static_cast<std::size_t>(c10::DeviceType::CUDA)];
}

}  // namespace

FakeCudaScope::FakeCudaScope()
    : previous_guard_(cuda_guard_slot().exchange(fake_guard())),
      previous_hooks_table_(install_fake_cuda_hooks()),
      previous_multithreading_(c10::AutogradState::get_tls_state().get_multithreading_enabled()),
      previous_sdpa_choice_(install_sdpa_choice()) {
  g_traced_multithreading = previous_multithreading_;
  c10::AutogradState::get_tls_state().set_multithreading_enabled(false);
}

FakeCudaScope::~FakeCudaScope() {
  restore_sdpa_choice(previous_sdpa_choice_);
  c10::AutogradState::get_tls_state().set_multithreading_enabled(previous_multithreading_);
  exchange_cuda_hooks_table(previous_hooks_table_);
  cuda_guard_slot().store(previous_guard_);
}

CudnnBuildScope::CudnnBuildScope(const std::function<CudnnBuild()>& build) {
  if (loaded_cuda_library_facts().compiled_with_cudnn) return;
  auto facts = std::make_unique<CudaLibraryFacts>(build(), loaded_cuda_library_facts());
  const CudaLibraryFacts* none = nullptr;
  TORCH_CHECK(g_cudnn_build.compare_exchange_strong(none, facts.get()), "metamem: a CudnnBuildScope is already alive");
  facts.release();
  rnn_stubs_ = std::make_unique<CudnnRnnStubsScope>();
}

CudnnBuildScope::~CudnnBuildScope() {
  if (!rnn_stubs_) return;
  rnn_stubs_.reset();
  delete g_cudnn_build.exchange(nullptr);
}

bool traced_autograd_multithreading() { return g_traced_multithreading; }
void set_traced_autograd_multithreading(bool enabled) { g_traced_multithreading = enabled; }

}  // namespace metamem
