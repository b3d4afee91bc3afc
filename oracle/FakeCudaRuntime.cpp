// A fake CUDA runtime for the calls PyTorch's caching allocator
// (libc10_cuda.so) and libtorch_cpu.so make, so that the real allocator
// runs on a machine without a GPU: built as libcudart.so.13 for the
// allocator oracle, and as a library that real torch preloads
// (docs/allocator-oracle.md), where kernel launches and copies succeed and
// do nothing. Memory is address space only: cudaMalloc and the driver's
// virtual-memory calls hand out addresses from a range reserved with no
// access (a stray dereference faults), bump-allocated and never reused,
// and count against the device's capacity, so cudaMalloc fails as a full
// GPU does. Streams and events complete at once; nothing captures a graph.
// What neither needs (peer access, IPC, stream-ordered pools) answers
// cudaErrorNotSupported.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "oracle/FakeCudaRuntime.h"

namespace {

constexpr std::uintptr_t kPage = 2 << 20;  // the GPU's allocation granularity

struct Device {
  std::string name = "NVIDIA H100 80GB HBM3";
  std::size_t total_memory = std::size_t{80} << 30;
  int major = 9, minor = 0;
  int multi_processor_count = 132;  // torch sizes kernels' grids, and some scratch, by it
  int l2_cache_size = 50 << 20;
  int max_threads_per_multi_processor = 2048;  // kernels' launch bounds, which torch reads to size grids
  int shared_memory_per_block_optin = 227 << 10;  // Triton's and Inductor's kernel configurations fit in it
  int shared_memory_per_multi_processor = 228 << 10;
  // cuDNN's heuristics weigh them in choosing an engine (docs/cuda-paths.md).
  int clock_rate = 0, memory_clock_rate = 0, memory_bus_width = 0;
  std::vector<int> max_active_clusters;  // of 1, 2, ... blocks

  int arch() const { return major * 10 + minor; }  // as kernels are built for it: 90 for sm90
};

// The device and its memory; one lock: c10 calls from several threads.
class FakeGpu {
 public:
  static FakeGpu& get() {
    static FakeGpu gpu;
    return gpu;
  }
  std::mutex mutex;
  Device device;
  std::size_t used = 0;                        // bytes of physical memory held
  std::map<std::uintptr_t, std::size_t> mallocs;  // cudaMalloc'd: address -> bytes
  std::map<CUmemGenericAllocationHandle, std::size_t> handles;  // cuMemCreate'd
  CUmemGenericAllocationHandle next_handle = 1;
  // metamem_fake_cuda_refuse_mallocs: cudaMalloc calls to let through, then
  // the bytes from which it refuses (0: it refuses none).
  std::size_t mallocs_to_grant = 0, refused_from = 0;

  // Address space for the device: a range no host code may touch, handed
  // out in pages from its start; a range given back is handed out again
  // for a request of its size (expandable segments reserve the GPU's
  // memory and an eighth each, and a process may make many).
  std::uintptr_t reserve(std::size_t bytes) {
    const std::uintptr_t rounded = (bytes + kPage - 1) / kPage * kPage;
    if (const auto again = given_back_.find(rounded); again != given_back_.end()) {
      const std::uintptr_t address = again->second;
      given_back_.erase(again);
      return address;
    }
    if (next_ + rounded > end_) return 0;
    const std::uintptr_t address = next_;
    next_ += rounded + kPage;  // a gap: neighbouring segments are not contiguous
    return address;
  }
  void give_back(std::uintptr_t address, std::size_t bytes) {
    given_back_.emplace((bytes + kPage - 1) / kPage * kPage, address);
  }
  bool on_device(const void* pointer) const {
    const auto address = reinterpret_cast<std::uintptr_t>(pointer);
    return address >= begin_ && address < end_;
  }
  std::map<std::uintptr_t, std::size_t> pinned;  // cudaHostAlloc'd: address -> bytes
  bool is_pinned(const void* pointer) const {
    const auto address = reinterpret_cast<std::uintptr_t>(pointer);
    auto after = pinned.upper_bound(address);
    return after != pinned.begin() && address < std::prev(after)->first + std::prev(after)->second;
  }

 private:
  FakeGpu() {
    // 64 TiB: room for every expandable segment's whole-GPU reservation.
    const std::size_t range = std::size_t{64} << 40;
    void* base = mmap(nullptr, range, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
      std::fprintf(stderr, "fake CUDA runtime: cannot reserve %zu bytes of address space\n", range);
      std::abort();
    }
    begin_ = next_ = (reinterpret_cast<std::uintptr_t>(base) + kPage - 1) / kPage * kPage;
    end_ = reinterpret_cast<std::uintptr_t>(base) + range;
  }
  std::uintptr_t begin_ = 0, next_ = 0, end_ = 0;
  std::multimap<std::size_t, std::uintptr_t> given_back_;  // by size
};

// As CUDA's: the last error of each host thread, until cudaGetLastError.
thread_local cudaError_t last_error = cudaSuccess;

cudaError_t fail(cudaError_t error) {
  last_error = error;
  return error;
}

// ---- stream capture: which streams capture into which graph, and what a
// capture forbids

struct Capture {
  unsigned long long id;
  cudaStream_t origin;  // the stream that began it and must end it
  cudaStreamCaptureMode mode;
  std::thread::id thread;
  std::size_t nodes = 0;  // kernels, copies and memsets launched into it
  bool invalidated = false;
};

// The calling thread's interaction mode (cudaThreadExchangeStreamCaptureMode).
thread_local cudaStreamCaptureMode thread_capture_mode = cudaStreamCaptureModeGlobal;

class Captures {
 public:
  static Captures& get() {
    static Captures captures;
    return captures;
  }

  cudaError_t begin(cudaStream_t stream, cudaStreamCaptureMode mode) {
    // The legacy default stream synchronizes with every other: it cannot capture.
    if (stream == nullptr || stream == cudaStreamLegacy) return cudaErrorStreamCaptureUnsupported;
    std::lock_guard<std::mutex> lock(mutex_);
    if (streams_.count(stream)) return cudaErrorIllegalState;
    streams_[stream] = std::make_shared<Capture>(Capture{next_id_++, stream, mode, std::this_thread::get_id()});
    return cudaSuccess;
  }

  cudaError_t end(cudaStream_t stream, cudaGraph_t* graph) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = streams_.find(stream);
    if (it == streams_.end()) return cudaErrorIllegalState;
    const std::shared_ptr<Capture> capture = it->second;
    if (capture->origin != stream) return cudaErrorStreamCaptureUnmatched;
    for (auto joined = streams_.begin(); joined != streams_.end();)
      joined = joined->second == capture ? streams_.erase(joined) : std::next(joined);
    *graph = nullptr;
    if (capture->invalidated) return cudaErrorStreamCaptureInvalidated;
    *graph = reinterpret_cast<cudaGraph_t>(next_graph_ += 0x10);
    graph_nodes_[*graph] = capture->nodes;
    return cudaSuccess;
  }

  // The status of the capture `stream` takes part in, and its id (0: none).
  cudaStreamCaptureStatus status(cudaStream_t stream, unsigned long long* id) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = streams_.find(stream);
    if (id) *id = it == streams_.end() ? 0 : it->second->id;
    if (it == streams_.end()) return cudaStreamCaptureStatusNone;
    return it->second->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  }

  // Invalidates the capture `stream` takes part in; whether there was one.
  bool invalidate(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = streams_.find(stream);
    if (it == streams_.end()) return false;
    it->second->invalidated = true;
    return true;
  }

  void launched(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = streams_.find(stream);
    if (it != streams_.end()) ++it->second->nodes;
  }

  // An event recorded on a capturing stream joins to its capture the streams
  // that wait on it (a fork); recorded elsewhere, it no longer does.
  void recorded(cudaEvent_t event, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = streams_.find(stream);
    if (it == streams_.end())
      events_.erase(event);
    else
      events_[event] = it->second;
  }
  void waited(cudaStream_t stream, cudaEvent_t event) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = events_.find(event);
    if (it != events_.end()) streams_[stream] = it->second;
  }

  // A call CUDA forbids while a capture it would break is under way (one
  // that is not stream-ordered: cudaMalloc, a synchronous copy): forbidden
  // to this thread unless its mode is relaxed, where this thread captures
  // in a mode other than relaxed or another thread captures in global
  // mode. It then fails, and invalidates those captures, as CUDA's does.
  cudaError_t unsafe_call() {
    if (thread_capture_mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
    std::lock_guard<std::mutex> lock(mutex_);
    cudaError_t error = cudaSuccess;
    for (auto& [stream, capture] : streams_) {
      const bool mine = capture->thread == std::this_thread::get_id();
      if ((mine && capture->mode != cudaStreamCaptureModeRelaxed) ||
          (!mine && capture->mode == cudaStreamCaptureModeGlobal)) {
        capture->invalidated = true;
        error = cudaErrorStreamCaptureUnsupported;
      }
    }
    return error;
  }

  cudaError_t graph_nodes(cudaGraph_t graph, std::size_t* nodes) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = graph_nodes_.find(graph);
    if (it == graph_nodes_.end()) return cudaErrorInvalidValue;
    *nodes = it->second;
    return cudaSuccess;
  }
  void destroy(cudaGraph_t graph) {
    std::lock_guard<std::mutex> lock(mutex_);
    graph_nodes_.erase(graph);
  }

 private:
  std::mutex mutex_;
  std::map<cudaStream_t, std::shared_ptr<Capture>> streams_;  // every stream in a capture
  std::map<cudaEvent_t, std::shared_ptr<Capture>> events_;
  std::map<cudaGraph_t, std::size_t> graph_nodes_;
  std::uintptr_t next_graph_ = 0x1000;
  unsigned long long next_id_ = 1;
};

// Opaque handles the allocator only compares and passes back.
template <typename Handle>
Handle new_handle() {
  static std::uintptr_t next = 0x1000;
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  return reinterpret_cast<Handle>(next += 0x10);
}

// ---- the driver calls of expandable segments, reached by entry point

CUresult fake_cuDeviceGet(CUdevice* device, int ordinal) {
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *device = 0;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp*,
                                            CUmemAllocationGranularity_flags) {
  *granularity = kPage;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t, CUdeviceptr, unsigned long long) {
  FakeGpu& gpu = FakeGpu::get();
  std::lock_guard<std::mutex> lock(gpu.mutex);
  const std::uintptr_t address = gpu.reserve(size);
  if (address == 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *ptr = address;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  FakeGpu& gpu = FakeGpu::get();
  std::lock_guard<std::mutex> lock(gpu.mutex);
  gpu.give_back(ptr, size);
  return CUDA_SUCCESS;
}

CUresult fake_cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp*,
                          unsigned long long) {
  FakeGpu& gpu = FakeGpu::get();
  std::lock_guard<std::mutex> lock(gpu.mutex);
  if (size > gpu.device.total_memory - gpu.used) return CUDA_ERROR_OUT_OF_MEMORY;
  gpu.used += size;
  *handle = gpu.next_handle++;
  gpu.handles[*handle] = size;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemRelease(CUmemGenericAllocationHandle handle) {
  FakeGpu& gpu = FakeGpu::get();
  std::lock_guard<std::mutex> lock(gpu.mutex);
  const auto it = gpu.handles.find(handle);
  if (it == gpu.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  gpu.used -= it->second;
  gpu.handles.erase(it);
  return CUDA_SUCCESS;
}

CUresult fake_cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) {
  return CUDA_SUCCESS;
}
CUresult fake_cuMemUnmap(CUdeviceptr, size_t) { return CUDA_SUCCESS; }
CUresult fake_cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) { return CUDA_SUCCESS; }

CUresult fake_cuGetErrorString(CUresult error, const char** text) {
  switch (error) {
    case CUDA_SUCCESS: *text = "no error"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *text = "out of memory"; break;
    case CUDA_ERROR_NOT_SUPPORTED: *text = "operation not supported (fake CUDA runtime)"; break;
    default: *text = "error (fake CUDA runtime)"; break;
  }
  return CUDA_SUCCESS;
}

// Every other driver entry point c10 asks for: there, and refusing.
CUresult fake_cuNotSupported() { return CUDA_ERROR_NOT_SUPPORTED; }

struct EntryPoint {
  const char* name;
  void* function;
};
const EntryPoint kEntryPoints[] = {
    {"cuDeviceGet", reinterpret_cast<void*>(&fake_cuDeviceGet)},
    {"cuDeviceGetAttribute", reinterpret_cast<void*>(&metamem_fake_cuda_device_attribute)},
    {"cuMemGetAllocationGranularity", reinterpret_cast<void*>(&fake_cuMemGetAllocationGranularity)},
    {"cuMemAddressReserve", reinterpret_cast<void*>(&fake_cuMemAddressReserve)},
    {"cuMemAddressFree", reinterpret_cast<void*>(&fake_cuMemAddressFree)},
    {"cuMemCreate", reinterpret_cast<void*>(&fake_cuMemCreate)},
    {"cuMemRelease", reinterpret_cast<void*>(&fake_cuMemRelease)},
    {"cuMemMap", reinterpret_cast<void*>(&fake_cuMemMap)},
    {"cuMemUnmap", reinterpret_cast<void*>(&fake_cuMemUnmap)},
    {"cuMemSetAccess", reinterpret_cast<void*>(&fake_cuMemSetAccess)},
    {"cuGetErrorString", reinterpret_cast<void*>(&fake_cuGetErrorString)},
};

// The architecture of the code a device runs of a kernel: the newest the
// wheel built of its major version, not above it. libtorch_cuda.so holds
// SASS for these (cuobjdump --list-elf; sm89 for one file alone), so an
// sm89 GPU (the L4, the L40S) runs sm86's, as cub's dispatch asks: it
// refuses a version it was not built for (cudaErrorInvalidDeviceFunction).
int kernel_arch(int device_arch) {
  static constexpr int kBuilt[] = {75, 80, 86, 90, 100, 103, 120, 121};
  int arch = device_arch;
  for (const int built : kBuilt)
    if (built / 10 == device_arch / 10 && built <= device_arch) arch = built;
  return arch;
}

}  // namespace

extern "C" {

void metamem_fake_cuda_set_device(const metamem_fake_gpu* device) {
  FakeGpu& gpu = FakeGpu::get();
  std::lock_guard<std::mutex> lock(gpu.mutex);
  gpu.device = {device->name,
                device->total_memory,
                device->major,
                device->minor,
                device->multi_processor_count,
                device->l2_cache_size,
                device->max_threads_per_multi_processor,
                device->shared_memory_per_block_optin,
                device->shared_memory_per_multi_processor,
                device->clock_rate,
                device->memory_clock_rate,
                device->memory_bus_width,
                {device->max_active_clusters, device->max_active_clusters + device->largest_cluster}};
}

CUresult metamem_fake_cuda_max_active_clusters(int* clusters, unsigned int blocks) {
  FakeGpu& gpu = FakeGpu::get();
  std::lock_guard<std::mutex> lock(gpu.mutex);
  const std::vector<int>& fitting = gpu.device.max_active_clusters;
  if (fitting.empty()) return CUDA_ERROR_NOT_SUPPORTED;
  // Past the largest cluster a GPC holds, none fit (a real H200 answers 0).
  *clusters = blocks >= 1 && blocks <= fitting.size() ? fitting[blocks - 1] : 0;
  return CUDA_SUCCESS;
}

CUresult metamem_fake_cuda_device_attribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  if (device != 0) return CUDA_ERROR_INVALID_DEVICE;
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = prop.major; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = prop.minor; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = prop.multiProcessorCount; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = prop.maxThreadsPerBlock; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *value = prop.maxThreadsPerMultiProcessor; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: *value = prop.maxBlocksPerMultiProcessor; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *value = prop.maxThreadsDim[0]; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *value = prop.maxThreadsDim[1]; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *value = prop.maxThreadsDim[2]; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *value = prop.maxGridSize[0]; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *value = prop.maxGridSize[1]; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *value = prop.maxGridSize[2]; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *value = prop.warpSize; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *value = prop.l2CacheSize; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *value = static_cast<int>(prop.sharedMemPerBlock); break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
      *value = static_cast<int>(prop.sharedMemPerBlockOptin);
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR:
      *value = static_cast<int>(prop.sharedMemPerMultiprocessor);
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *value = prop.regsPerBlock; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: *value = prop.regsPerMultiprocessor; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *value = prop.memoryBusWidth; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE:  // no longer in cudaDeviceProp
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: {
      FakeGpu& gpu = FakeGpu::get();
      std::lock_guard<std::mutex> lock(gpu.mutex);
      *value = attribute == CU_DEVICE_ATTRIBUTE_CLOCK_RATE ? gpu.device.clock_rate : gpu.device.memory_clock_rate;
      break;
    }
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
      *value = 1;
      break;
    default: *value = 0;  // texture sizes, PCI location, ...: nothing that sizes memory reads them
  }
  return CUDA_SUCCESS;
}

void metamem_fake_cuda_launched(CUstream stream) { Captures::get().launched(stream); }

void metamem_fake_cuda_refuse_mallocs(std::size_t calls, std::size_t bytes) {
  FakeGpu& gpu = FakeGpu::get();
  std::lock_guard<std::mutex> lock(gpu.mutex);
  gpu.mallocs_to_grant = calls;
  gpu.refused_from = bytes;
}

std::size_t metamem_fake_cuda_used_memory() {
  FakeGpu& gpu = FakeGpu::get();
  std::lock_guard<std::mutex> lock(gpu.mutex);
  return gpu.used;
}

// ---- devices

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice); }
cudaError_t cudaDeviceSynchronize() {
  const cudaError_t error = Captures::get().unsafe_call();
  return error == cudaSuccess ? cudaSuccess : fail(error);
}
cudaError_t cudaDriverGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice);
  FakeGpu& gpu = FakeGpu::get();
  std::lock_guard<std::mutex> lock(gpu.mutex);
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "%s", gpu.device.name.c_str());
  prop->totalGlobalMem = gpu.device.total_memory;
  prop->major = gpu.device.major;
  prop->minor = gpu.device.minor;
  prop->multiProcessorCount = gpu.device.multi_processor_count;
  prop->l2CacheSize = gpu.device.l2_cache_size;
  prop->memoryBusWidth = gpu.device.memory_bus_width;
  // What every GPU since Volta has.
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->maxThreadsPerMultiProcessor = gpu.device.max_threads_per_multi_processor;
  prop->maxBlocksPerMultiProcessor = 32;
  prop->sharedMemPerBlock = 48 << 10;
  prop->sharedMemPerBlockOptin = gpu.device.shared_memory_per_block_optin;
  prop->sharedMemPerMultiprocessor = gpu.device.shared_memory_per_multi_processor;
  prop->regsPerBlock = prop->regsPerMultiprocessor = 65536;
  prop->concurrentKernels = prop->unifiedAddressing = prop->managedMemory = 1;
  return cudaSuccess;
}

// The runtime's attributes are the driver's, numbered alike.
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
  return metamem_fake_cuda_device_attribute(value, static_cast<CUdevice_attribute>(attribute), device) == CUDA_SUCCESS
             ? cudaSuccess
             : fail(cudaErrorInvalidDevice);
}

// Either may be null (cuDNN asks for one).
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int* can, int, int) {
  *can = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceEnablePeerAccess(int, unsigned int) { return fail(cudaErrorNotSupported); }

// ---- memory

cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (const cudaError_t error = Captures::get().unsafe_call(); error != cudaSuccess) return fail(error);
  FakeGpu& gpu = FakeGpu::get();
  std::lock_guard<std::mutex> lock(gpu.mutex);
  *ptr = nullptr;
  if (gpu.refused_from > 0) {
    if (gpu.mallocs_to_grant > 0) {
      --gpu.mallocs_to_grant;
    } else if (size >= gpu.refused_from) {
      return fail(cudaErrorMemoryAllocation);
    } else {
      gpu.refused_from = 0;
    }
  }
  if (size > gpu.device.total_memory - gpu.used) return fail(cudaErrorMemoryAllocation);
  const std::uintptr_t address = gpu.reserve(size);
  if (address == 0) return fail(cudaErrorMemoryAllocation);
  gpu.used += size;
  gpu.mallocs[address] = size;
  *ptr = reinterpret_cast<void*>(address);
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  FakeGpu& gpu = FakeGpu::get();
  std::lock_guard<std::mutex> lock(gpu.mutex);
  const auto it = gpu.mallocs.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == gpu.mallocs.end()) return fail(cudaErrorInvalidValue);
  gpu.used -= it->second;
  gpu.mallocs.erase(it);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  FakeGpu& gpu = FakeGpu::get();
  std::lock_guard<std::mutex> lock(gpu.mutex);
  *total = gpu.device.total_memory;
  *free = gpu.device.total_memory - gpu.used;
  return cudaSuccess;
}

// Pinned host memory (an .item() stages its value there) is host memory.
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int) {
  *ptr = std::calloc(size == 0 ? 1 : size, 1);
  if (!*ptr) return fail(cudaErrorMemoryAllocation);
  FakeGpu& gpu = FakeGpu::get();
  std::lock_guard<std::mutex> lock(gpu.mutex);
  gpu.pinned.emplace(reinterpret_cast<std::uintptr_t>(*ptr), size);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** ptr, size_t size) { return cudaHostAlloc(ptr, size, 0); }
cudaError_t cudaFreeHost(void* ptr) {
  {
    FakeGpu& gpu = FakeGpu::get();
    std::lock_guard<std::mutex> lock(gpu.mutex);
    gpu.pinned.erase(reinterpret_cast<std::uintptr_t>(ptr));
  }
  std::free(ptr);
  return cudaSuccess;
}
// Asked of a host tensor copied to the device (is_pinned): device memory is
// the fake device's address range, pinned memory what cudaHostAlloc gave
// (any address inside it), the rest ordinary host memory, which CUDA
// answers as unregistered.
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* pointer) {
  FakeGpu& gpu = FakeGpu::get();
  std::lock_guard<std::mutex> lock(gpu.mutex);
  *attributes = {};
  if (gpu.on_device(pointer)) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->devicePointer = const_cast<void*>(pointer);
  } else if (gpu.is_pinned(pointer)) {
    attributes->type = cudaMemoryTypeHost;
    attributes->hostPointer = attributes->devicePointer = const_cast<void*>(pointer);
  } else {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;  // cudaInvalidDeviceId
  }
  return cudaSuccess;
}
cudaError_t cudaHostRegister(void*, size_t, unsigned int) { return cudaSuccess; }
cudaError_t cudaHostUnregister(void*) { return cudaSuccess; }

cudaError_t cudaMallocAsync(void**, size_t, cudaStream_t) { return fail(cudaErrorNotSupported); }
cudaError_t cudaFreeAsync(void*, cudaStream_t) { return fail(cudaErrorNotSupported); }
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t*, int) { return fail(cudaErrorNotSupported); }
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t, cudaMemPoolAttr, void*) { return fail(cudaErrorNotSupported); }
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, cudaMemPoolAttr, void*) { return fail(cudaErrorNotSupported); }
cudaError_t cudaMemPoolSetAccess(cudaMemPool_t, const cudaMemAccessDesc*, size_t) {
  return fail(cudaErrorNotSupported);
}
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t, size_t) { return fail(cudaErrorNotSupported); }
// ---- kernels and copies: done at once, doing nothing (a host destination
// reads zeros, as no kernel wrote anything)

cudaError_t cudaLaunchKernel(const void*, dim3, dim3, void**, size_t, cudaStream_t stream) {
  Captures::get().launched(stream);
  return cudaSuccess;
}
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void*, void**) {
  Captures::get().launched(config->stream);
  return cudaSuccess;
}
// What `kernel<<<...>>>` compiles to since CUDA 13.
cudaError_t __cudaLaunchKernel(cudaKernel_t, dim3, dim3, void**, size_t, cudaStream_t stream) {
  Captures::get().launched(stream);
  return cudaSuccess;
}
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void** args, size_t shared,
                                    cudaStream_t stream) {
  return __cudaLaunchKernel(kernel, grid, block, args, shared, stream);
}
cudaError_t cudaPeekAtLastError() { return last_error; }
// Every kernel was built for the device (torch's CUTLASS kernels check) and
// fits, as the fake driver's cuFuncGetAttribute says.
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attributes, const void*) {
  std::memset(attributes, 0, sizeof(*attributes));
  attributes->maxThreadsPerBlock = 1024;
  attributes->numRegs = kFakeKernelRegisters;
  FakeGpu& gpu = FakeGpu::get();
  std::lock_guard<std::mutex> lock(gpu.mutex);
  attributes->binaryVersion = attributes->ptxVersion = kernel_arch(gpu.device.arch());
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) { return cudaSuccess; }
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void*, int, size_t) {
  *blocks = 1;
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* blocks, const void* kernel, int threads,
                                                                    size_t shared, unsigned int) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, threads, shared);
}
cudaError_t cudaMemsetAsync(void*, int, size_t, cudaStream_t stream) {
  Captures::get().launched(stream);
  return cudaSuccess;
}
cudaError_t cudaMemset(void*, int, size_t) {
  const cudaError_t error = Captures::get().unsafe_call();
  return error == cudaSuccess ? cudaSuccess : fail(error);
}
cudaError_t cudaMemcpyAsync(void* to, const void*, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  Captures::get().launched(stream);
  if (kind == cudaMemcpyDeviceToHost) std::memset(to, 0, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* to, const void* from, size_t bytes, cudaMemcpyKind kind) {
  if (const cudaError_t error = Captures::get().unsafe_call(); error != cudaSuccess) return fail(error);
  return cudaMemcpyAsync(to, from, bytes, kind, nullptr);
}
cudaError_t cudaMemcpyPeerAsync(void*, int, const void*, int, size_t, cudaStream_t) {
  return fail(cudaErrorNotSupported);
}
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t*, void*) { return fail(cudaErrorNotSupported); }
cudaError_t cudaIpcOpenMemHandle(void**, cudaIpcMemHandle_t, unsigned int) { return fail(cudaErrorNotSupported); }
cudaError_t cudaIpcCloseMemHandle(void*) { return fail(cudaErrorNotSupported); }
cudaError_t cudaDeviceGetGraphMemAttribute(int, cudaGraphMemAttributeType, void*) {
  return fail(cudaErrorNotSupported);
}
cudaError_t cudaDeviceSetGraphMemAttribute(int, cudaGraphMemAttributeType, void*) {
  return fail(cudaErrorNotSupported);
}
cudaError_t cudaGraphNodeGetDependencies(cudaGraphNode_t, cudaGraphNode_t*, cudaGraphEdgeData*, size_t*) {
  return fail(cudaErrorNotSupported);
}

// ---- streams and events: everything has already completed

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int, int) {
  *stream = new_handle<cudaStream_t>();
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  return cudaStreamCreateWithPriority(stream, flags, 0);
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithPriority(stream, 0, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamGetPriority(cudaStream_t, int* priority) {
  *priority = 0;
  return cudaSuccess;
}
// Waiting on a capturing stream is waiting for work that will never run.
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  return Captures::get().status(stream, nullptr) != cudaStreamCaptureStatusNone
             ? fail(cudaErrorStreamCaptureUnsupported)
             : cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return Captures::get().invalidate(stream) ? fail(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  Captures::get().waited(stream, event);
  return cudaSuccess;
}
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, cudaStreamCaptureStatus* status, unsigned long long* id,
                                     cudaGraph_t* graph, const cudaGraphNode_t** dependencies,
                                     const cudaGraphEdgeData** edges, size_t* n_dependencies) {
  *status = Captures::get().status(stream, id);
  if (graph) *graph = nullptr;
  if (dependencies) *dependencies = nullptr;
  if (edges) *edges = nullptr;
  if (n_dependencies) *n_dependencies = 0;
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  return cudaStreamGetCaptureInfo(stream, status, nullptr, nullptr, nullptr, nullptr, nullptr);
}
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  std::swap(*mode, thread_capture_mode);
  return cudaSuccess;
}
cudaError_t cudaStreamUpdateCaptureDependencies(cudaStream_t stream, cudaGraphNode_t*, const cudaGraphEdgeData*,
                                                size_t, unsigned int) {
  return Captures::get().status(stream, nullptr) != cudaStreamCaptureStatusNone ? cudaSuccess
                                                                                 : fail(cudaErrorIllegalState);
}

// ---- graphs: captured, instantiated and launched; a launch does nothing

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  const cudaError_t error = Captures::get().begin(stream, mode);
  return error == cudaSuccess ? cudaSuccess : fail(error);
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  const cudaError_t error = Captures::get().end(stream, graph);
  return error == cudaSuccess ? cudaSuccess : fail(error);
}
// The nodes' handles stand for nothing: torch only counts them.
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* count) {
  std::size_t captured = 0;
  if (const cudaError_t error = Captures::get().graph_nodes(graph, &captured); error != cudaSuccess)
    return fail(error);
  if (nodes)
    for (std::size_t i = 0; i < std::min(*count, captured); ++i) nodes[i] = new_handle<cudaGraphNode_t>();
  *count = captured;
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  Captures::get().destroy(graph);
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t, unsigned long long) {
  *exec = new_handle<cudaGraphExec_t>();
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags) {
  return cudaGraphInstantiateWithFlags(exec, graph, flags);
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t) { return cudaSuccess; }
cudaError_t cudaGraphUpload(cudaGraphExec_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t stream) {
  Captures::get().launched(stream);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  *event = new_handle<cudaEvent_t>();
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Captures::get().recorded(event, stream);
  return cudaSuccess;
}
cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int) {
  return cudaEventRecord(event, stream);
}
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
// Every timed interval takes the same 1 ms: no kernel runs, and Inductor's
// autotuners then keep their first choice. Not 0: the coordinate-descent
// tuner divides by the best time.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 1;
  return cudaSuccess;
}

// ---- errors and the driver's entry points

cudaError_t cudaGetLastError() { return std::exchange(last_error, cudaSuccess); }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNotSupported: return "operation not supported (fake CUDA runtime)";
    // CUDA's own words, which torch's errors carry
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched: return "capture was not initiated in this stream";
    default: return cudaGetErrorName(error);
  }
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** function, unsigned int, unsigned long long,
                                             cudaDriverEntryPointQueryResult* status) {
  *function = reinterpret_cast<void*>(&fake_cuNotSupported);
  for (const EntryPoint& entry : kEntryPoints)
    if (std::strcmp(entry.name, symbol) == 0) *function = entry.function;
  if (status) *status = cudaDriverEntryPointSuccess;
  return cudaSuccess;
}

}  // extern "C"
