// A fake CUDA driver (libcuda.so.1) for real torch on the fake runtime:
// torch's CUDA initialisation loads libcaffe2_nvrtc.so, which links these
// driver calls, and Triton's launcher and Inductor's static launcher load
// and launch compiled kernels through them. There is one context, the
// fake runtime's device (its attributes come from there), modules load and
// kernels launch without running; what compiles or links code at run time
// (NVRTC's jit) answers CUDA_ERROR_NOT_SUPPORTED. Libraries that link the
// runtime statically (cuDNN) run their runtime on this driver: memory,
// streams, events and graph capture are the fake runtime's, called here;
// that runtime finds these functions by name and version
// (FakeCudaEntryPoints.cpp) and asks for the driver's private tables
// (FakeCudaExportTables.cpp).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "oracle/FakeCudaRuntime.h"

// The runtime is preloaded beside this driver (docs/allocator-oracle.md):
// weak, so that the driver still loads, and answers no attribute, alone.
extern "C" __attribute__((weak)) CUresult metamem_fake_cuda_device_attribute(int*, CUdevice_attribute, CUdevice);
extern "C" __attribute__((weak)) void metamem_fake_cuda_launched(CUstream);
extern "C" __attribute__((weak)) CUresult metamem_fake_cuda_max_active_clusters(int*, unsigned int);

namespace {
int token;  // what contexts, modules, libraries, kernels and functions point to

// The fake runtime's answer as the driver's.
CUresult from_runtime(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return CUDA_SUCCESS;
    case cudaErrorMemoryAllocation: return CUDA_ERROR_OUT_OF_MEMORY;
    case cudaErrorInvalidValue: return CUDA_ERROR_INVALID_VALUE;
    case cudaErrorStreamCaptureUnsupported: return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    case cudaErrorStreamCaptureInvalidated: return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    case cudaErrorIllegalState: return CUDA_ERROR_ILLEGAL_STATE;
    default: return CUDA_ERROR_NOT_SUPPORTED;
  }
}

// A launch on a stream that captures a graph is one of its nodes.
CUresult launched(CUstream stream) {
  if (metamem_fake_cuda_launched) metamem_fake_cuda_launched(stream);
  return CUDA_SUCCESS;
}
// A module's __device__ variables: the runtime copies to them (constant
// tables) and from them. Every one is the same megabyte, which no kernel
// reads; a copy to the device writes nothing, one from it zeros.
CUresult global_variable(CUdeviceptr* pointer, size_t* bytes) {
  static unsigned char variables[1 << 20];
  if (pointer) *pointer = reinterpret_cast<CUdeviceptr>(variables);
  if (bytes) *bytes = sizeof variables;
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

CUresult cuInit(unsigned int) { return CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int* version) {
  *version = CUDA_VERSION;
  return CUDA_SUCCESS;
}
CUresult cuCtxGetCurrent(CUcontext* context) {
  *context = reinterpret_cast<CUcontext>(&token);
  return CUDA_SUCCESS;
}
CUresult cuCtxSetCurrent(CUcontext) { return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  *device = 0;
  return ordinal == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}
CUresult cuDeviceGetCount(int* count) {
  *count = 1;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  if (!metamem_fake_cuda_device_attribute) return CUDA_ERROR_NOT_INITIALIZED;
  return metamem_fake_cuda_device_attribute(value, attribute, device);
}
CUresult cuCtxGetDevice(CUdevice* device) {
  *device = 0;
  return CUDA_SUCCESS;
}
// Triton sizes printf's buffer; nothing prints.
CUresult cuCtxGetLimit(size_t* value, CUlimit) {
  *value = 0;
  return CUDA_SUCCESS;
}
CUresult cuCtxSetLimit(CUlimit, size_t) { return CUDA_SUCCESS; }
// The one context maps host memory (the runtime refuses mapped host
// allocations in a context without the flag: cuDNN's RNNs make one).
constexpr unsigned int kContextFlags = CU_CTX_MAP_HOST;
CUresult cuDevicePrimaryCtxGetState(CUdevice, unsigned int* flags, int* active) {
  *flags = kContextFlags;
  *active = 1;
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice) { return cuCtxGetCurrent(context); }
// Every kernel fits: a block may have all of a device's threads (Triton
// checks its warps against this), the registers of the header's
// kFakeKernelRegisters, and no spills or static shared memory worth
// counting.
CUresult cuFuncGetAttribute(int* value, CUfunction_attribute attribute, CUfunction) {
  *value = attribute == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK ? 1024
           : attribute == CU_FUNC_ATTRIBUTE_NUM_REGS            ? kFakeKernelRegisters
                                                                : 0;
  return CUDA_SUCCESS;
}
CUresult cuFuncSetAttribute(CUfunction, CUfunction_attribute, int) { return CUDA_SUCCESS; }
CUresult cuFuncSetCacheConfig(CUfunction, CUfunc_cache) { return CUDA_SUCCESS; }
CUresult cuGetErrorString(CUresult, const char** text) {
  *text = "metamem's fake CUDA driver does not do this";
  return CUDA_SUCCESS;
}
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        CUstream stream, void**, void**) {
  return launched(stream);
}
CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction, void**, void**) {
  return launched(config->hStream);
}
CUresult cuLaunchCooperativeKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   CUstream stream, void**) {
  return launched(stream);
}
CUresult cuModuleLoadData(CUmodule* module, const void*) {
  *module = reinterpret_cast<CUmodule>(&token);
  return CUDA_SUCCESS;
}
CUresult cuModuleLoad(CUmodule* module, const char*) { return cuModuleLoadData(module, nullptr); }
CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int, CUjit_option*, void**) {
  return cuModuleLoadData(module, image);
}
CUresult cuModuleGetFunction(CUfunction* function, CUmodule, const char*) {
  *function = reinterpret_cast<CUfunction>(&token);
  return CUDA_SUCCESS;
}
CUresult cuModuleUnload(CUmodule) { return CUDA_SUCCESS; }
// Each kernel fits once per SM: the driver knows no kernel's registers or
// shared memory.
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, CUfunction, int, size_t) {
  *blocks = 1;
  return CUDA_SUCCESS;
}
// Every block may have the opt-in shared memory of an SM.
CUresult cuOccupancyAvailableDynamicSMemPerBlock(size_t* bytes, CUfunction, int, int) {
  int optin = 0;
  const CUresult result = cuDeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 0);
  *bytes = optin;
  return result;
}
// The GPU's own answer for a cluster of the configuration's size, each
// block on an SM of its own (as above). cuDNN probes clusters of 1 to 32
// blocks and sizes some sm90 engines' workspaces by the answers: answered
// 1, the weight gradient of a 3x3 convolution took 13,287,635 B where a
// real H200 takes 15,057,575 (docs/cuda-paths.md).
CUresult cuOccupancyMaxActiveClusters(int* clusters, CUfunction, const CUlaunchConfig* config) {
  if (!metamem_fake_cuda_max_active_clusters) return CUDA_ERROR_NOT_INITIALIZED;
  unsigned int blocks = 1;
  for (unsigned int i = 0; i < config->numAttrs; ++i)
    if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
      const auto& dim = config->attrs[i].value.clusterDim;
      blocks = dim.x * dim.y * dim.z;
    }
  return metamem_fake_cuda_max_active_clusters(clusters, blocks);
}
CUresult cuLinkCreate_v2(unsigned int, CUjit_option*, void**, CUlinkState*) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuLinkAddData_v2(CUlinkState, CUjitInputType, void*, size_t, const char*, unsigned int, CUjit_option*,
                          void**) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult cuLinkComplete(CUlinkState, void**, size_t*) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuLinkDestroy(CUlinkState) { return CUDA_SUCCESS; }
CUresult cuLibraryLoadFromFile(CUlibrary* library, const char*, CUjit_option*, void**, unsigned int, CUlibraryOption*,
                               void**, unsigned int) {
  return cuLibraryLoadData(library, nullptr, nullptr, nullptr, 0, nullptr, nullptr, 0);
}
CUresult cuOccupancyMaxPotentialClusterSize(int* size, CUfunction, const CUlaunchConfig*) {
  *size = 1;
  return CUDA_SUCCESS;
}
CUresult cuGetErrorName(CUresult, const char** name) {
  *name = "CUDA_ERROR (metamem's fake CUDA driver)";
  return CUDA_SUCCESS;
}
// Triton's launcher asks each pointer argument's device address: the
// fake runtime's addresses are the device's.
CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr pointer) {
  if (attribute != CU_POINTER_ATTRIBUTE_DEVICE_POINTER) return CUDA_ERROR_NOT_SUPPORTED;
  *static_cast<CUdeviceptr*>(data) = pointer;
  return CUDA_SUCCESS;
}
// Hopper's kernels (cuDNN's, Triton's) read global memory through tensor
// maps that the host encodes before each launch: encoded, as nothing reads them.
CUresult cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  std::memset(map, 0, sizeof *map);
  return CUDA_SUCCESS;
}
CUresult cuTensorMapEncodeIm2col(CUtensorMap* map, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const int*, const int*, cuuint32_t, cuuint32_t,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  std::memset(map, 0, sizeof *map);
  return CUDA_SUCCESS;
}
CUresult cuTensorMapReplaceAddress(CUtensorMap*, void*) { return CUDA_SUCCESS; }

// ---- what a statically linked runtime starts and runs with

CUresult cuDeviceGetName(char* name, int length, CUdevice device) {
  cudaDeviceProp prop;
  if (const cudaError_t error = cudaGetDeviceProperties(&prop, device); error != cudaSuccess)
    return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, length, "%s", prop.name);
  return CUDA_SUCCESS;
}
CUresult cuDeviceTotalMem(size_t* bytes, CUdevice device) {
  cudaDeviceProp prop;
  if (const cudaError_t error = cudaGetDeviceProperties(&prop, device); error != cudaSuccess)
    return CUDA_ERROR_INVALID_DEVICE;
  *bytes = prop.totalGlobalMem;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice) {
  std::memset(uuid->bytes, 0x6d, sizeof uuid->bytes);
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetLuid(char* luid, unsigned int* node_mask, CUdevice) {
  std::memset(luid, 0, 8);
  *node_mask = 1;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetPCIBusId(char* id, int length, CUdevice) {
  std::snprintf(id, length, "0000:00:00.0");
  return CUDA_SUCCESS;
}
CUresult cuDeviceCanAccessPeer(int* can, CUdevice, CUdevice) {
  *can = 0;
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease(CUdevice) { return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxSetFlags(CUdevice, unsigned int) { return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxReset(CUdevice) { return CUDA_SUCCESS; }
CUresult cuCtxPushCurrent(CUcontext) { return CUDA_SUCCESS; }
CUresult cuCtxPopCurrent(CUcontext* context) {
  if (context) cuCtxGetCurrent(context);
  return CUDA_SUCCESS;
}
CUresult cuCtxGetFlags(unsigned int* flags) {
  *flags = kContextFlags;
  return CUDA_SUCCESS;
}
CUresult cuCtxGetApiVersion(CUcontext, unsigned int* version) {
  *version = 3020;  // what every context since CUDA 3.2 reports
  return CUDA_SUCCESS;
}
CUresult cuCtxGetId(CUcontext, unsigned long long* id) {
  *id = 1;
  return CUDA_SUCCESS;
}
CUresult cuCtxGetStreamPriorityRange(int* least, int* greatest) {
  return from_runtime(cudaDeviceGetStreamPriorityRange(least, greatest));
}
CUresult cuCtxGetCacheConfig(CUfunc_cache* config) {
  *config = CU_FUNC_CACHE_PREFER_NONE;
  return CUDA_SUCCESS;
}
CUresult cuCtxSetCacheConfig(CUfunc_cache) { return CUDA_SUCCESS; }
CUresult cuCtxSynchronize() { return from_runtime(cudaDeviceSynchronize()); }

// Memory: the fake runtime's device, so that what a library allocates by
// itself is used memory as on a GPU (outside torch's allocator).
CUresult cuMemAlloc(CUdeviceptr* pointer, size_t bytes) {
  return from_runtime(cudaMalloc(reinterpret_cast<void**>(pointer), bytes));
}
CUresult cuMemFree(CUdeviceptr pointer) { return from_runtime(cudaFree(reinterpret_cast<void*>(pointer))); }
CUresult cuMemGetInfo(size_t* free, size_t* total) { return from_runtime(cudaMemGetInfo(free, total)); }
CUresult cuMemAllocHost(void** pointer, size_t bytes) { return from_runtime(cudaMallocHost(pointer, bytes)); }
CUresult cuMemHostAlloc(void** pointer, size_t bytes, unsigned int flags) {
  return from_runtime(cudaHostAlloc(pointer, bytes, flags));
}
CUresult cuMemFreeHost(void* pointer) { return from_runtime(cudaFreeHost(pointer)); }
// Mapped host memory (cuDNN's RNNs keep a status word there): under unified
// addressing its device address is its host address.
CUresult cuMemHostGetDevicePointer(CUdeviceptr* device, void* host, unsigned int) {
  *device = reinterpret_cast<CUdeviceptr>(host);
  return CUDA_SUCCESS;
}
CUresult cuMemHostGetFlags(unsigned int* flags, void*) {
  *flags = CU_MEMHOSTALLOC_DEVICEMAP;
  return CUDA_SUCCESS;
}
CUresult cuMemHostRegister(void* pointer, size_t bytes, unsigned int flags) {
  return from_runtime(cudaHostRegister(pointer, bytes, flags));
}
CUresult cuMemHostUnregister(void* pointer) { return from_runtime(cudaHostUnregister(pointer)); }
CUresult cuMemsetD8Async(CUdeviceptr pointer, unsigned char value, size_t count, CUstream stream) {
  return from_runtime(cudaMemsetAsync(reinterpret_cast<void*>(pointer), value, count, stream));
}
CUresult cuMemsetD32Async(CUdeviceptr pointer, unsigned int, size_t count, CUstream stream) {
  return from_runtime(cudaMemsetAsync(reinterpret_cast<void*>(pointer), 0, 4 * count, stream));
}
CUresult cuMemsetD8(CUdeviceptr pointer, unsigned char value, size_t count) {
  return cuMemsetD8Async(pointer, value, count, nullptr);
}
CUresult cuMemsetD32(CUdeviceptr pointer, unsigned int value, size_t count) {
  return cuMemsetD32Async(pointer, value, count, nullptr);
}
CUresult cuMemcpyAsync(CUdeviceptr to, CUdeviceptr from, size_t bytes, CUstream stream) {
  return from_runtime(cudaMemcpyAsync(reinterpret_cast<void*>(to), reinterpret_cast<void*>(from), bytes,
                                      cudaMemcpyDefault, stream));
}
CUresult cuMemcpyHtoDAsync(CUdeviceptr to, const void* from, size_t bytes, CUstream stream) {
  return from_runtime(cudaMemcpyAsync(reinterpret_cast<void*>(to), from, bytes, cudaMemcpyHostToDevice, stream));
}
CUresult cuMemcpyDtoHAsync(void* to, CUdeviceptr from, size_t bytes, CUstream stream) {
  return from_runtime(cudaMemcpyAsync(to, reinterpret_cast<void*>(from), bytes, cudaMemcpyDeviceToHost, stream));
}
CUresult cuMemcpyDtoDAsync(CUdeviceptr to, CUdeviceptr from, size_t bytes, CUstream stream) {
  return cuMemcpyAsync(to, from, bytes, stream);
}
CUresult cuMemcpyHtoD(CUdeviceptr to, const void* from, size_t bytes) {
  return cuMemcpyHtoDAsync(to, from, bytes, nullptr);
}
CUresult cuMemcpyDtoH(void* to, CUdeviceptr from, size_t bytes) { return cuMemcpyDtoHAsync(to, from, bytes, nullptr); }


// Streams, events and capture: the fake runtime's (a CUstream is a
// cudaStream_t), so that a library's kernels join the graph torch captures.
CUresult cuStreamCreate(CUstream* stream, unsigned int flags) {
  return from_runtime(cudaStreamCreateWithFlags(stream, flags));
}
CUresult cuStreamCreateWithPriority(CUstream* stream, unsigned int flags, int priority) {
  return from_runtime(cudaStreamCreateWithPriority(stream, flags, priority));
}
CUresult cuStreamDestroy(CUstream stream) { return from_runtime(cudaStreamDestroy(stream)); }
CUresult cuStreamSynchronize(CUstream stream) { return from_runtime(cudaStreamSynchronize(stream)); }
CUresult cuStreamQuery(CUstream stream) { return from_runtime(cudaStreamQuery(stream)); }
CUresult cuStreamGetCtx(CUstream, CUcontext* context) { return cuCtxGetCurrent(context); }
CUresult cuStreamGetFlags(CUstream, unsigned int* flags) {
  *flags = 0;
  return CUDA_SUCCESS;
}
CUresult cuStreamGetPriority(CUstream stream, int* priority) {
  return from_runtime(cudaStreamGetPriority(stream, priority));
}
CUresult cuStreamGetId(CUstream stream, unsigned long long* id) {
  *id = reinterpret_cast<std::uintptr_t>(stream);
  return CUDA_SUCCESS;
}
CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  return from_runtime(cudaStreamWaitEvent(stream, event, flags));
}
CUresult cuStreamGetCaptureInfo(CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                                const CUgraphNode** dependencies, const CUgraphEdgeData** edges, size_t* count) {
  cudaStreamCaptureStatus captured;
  unsigned long long captured_id = 0;
  const cudaError_t error =
      cudaStreamGetCaptureInfo(stream, &captured, &captured_id, nullptr, nullptr, nullptr, nullptr);
  *status = static_cast<CUstreamCaptureStatus>(captured);
  if (id) *id = captured_id;
  if (graph) *graph = nullptr;
  if (dependencies) *dependencies = nullptr;
  if (edges) *edges = nullptr;
  if (count) *count = 0;
  return from_runtime(error);
}
CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus* status) {
  return cuStreamGetCaptureInfo(stream, status, nullptr, nullptr, nullptr, nullptr, nullptr);
}
CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  return from_runtime(cudaThreadExchangeStreamCaptureMode(reinterpret_cast<cudaStreamCaptureMode*>(mode)));
}
CUresult cuEventCreate(CUevent* event, unsigned int flags) {
  return from_runtime(cudaEventCreateWithFlags(event, flags));
}
CUresult cuEventDestroy(CUevent event) { return from_runtime(cudaEventDestroy(event)); }
CUresult cuEventRecord(CUevent event, CUstream stream) { return from_runtime(cudaEventRecord(event, stream)); }
CUresult cuEventRecordWithFlags(CUevent event, CUstream stream, unsigned int flags) {
  return from_runtime(cudaEventRecordWithFlags(event, stream, flags));
}
CUresult cuEventQuery(CUevent event) { return from_runtime(cudaEventQuery(event)); }
CUresult cuEventSynchronize(CUevent event) { return from_runtime(cudaEventSynchronize(event)); }
CUresult cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  return from_runtime(cudaEventElapsedTime(ms, start, end));
}

// Libraries and kernels (CUDA 12's loading API, which the runtime loads
// fat binaries with): loaded, found and launched as modules are.
CUresult cuLibraryLoadData(CUlibrary* library, const void*, CUjit_option*, void**, unsigned int,
                           CUlibraryOption*, void**, unsigned int) {
  *library = reinterpret_cast<CUlibrary>(&token);
  return CUDA_SUCCESS;
}
CUresult cuLibraryUnload(CUlibrary) { return CUDA_SUCCESS; }
CUresult cuLibraryGetKernel(CUkernel* kernel, CUlibrary, const char*) {
  *kernel = reinterpret_cast<CUkernel>(&token);
  return CUDA_SUCCESS;
}
CUresult cuLibraryGetModule(CUmodule* module, CUlibrary) { return cuModuleLoadData(module, nullptr); }
CUresult cuLibraryGetGlobal(CUdeviceptr* pointer, size_t* bytes, CUlibrary, const char*) {
  return global_variable(pointer, bytes);
}
CUresult cuModuleGetGlobal(CUdeviceptr* pointer, size_t* bytes, CUmodule, const char*) {
  return global_variable(pointer, bytes);
}
CUresult cuKernelGetFunction(CUfunction* function, CUkernel) { return cuModuleGetFunction(function, nullptr, nullptr); }
CUresult cuKernelGetAttribute(int* value, CUfunction_attribute attribute, CUkernel, CUdevice) {
  return cuFuncGetAttribute(value, attribute, nullptr);
}
CUresult cuKernelSetAttribute(CUfunction_attribute, int, CUkernel, CUdevice) { return CUDA_SUCCESS; }
CUresult cuKernelSetCacheConfig(CUkernel, CUfunc_cache, CUdevice) { return CUDA_SUCCESS; }
CUresult cuFuncGetModule(CUmodule* module, CUfunction) { return cuModuleLoadData(module, nullptr); }
CUresult cuFuncLoad(CUfunction) { return CUDA_SUCCESS; }
CUresult cuFuncIsLoaded(CUfunctionLoadingState* state, CUfunction) {
  *state = CU_FUNCTION_LOADING_STATE_LOADED;
  return CUDA_SUCCESS;
}
CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode* mode) {
  *mode = CU_MODULE_LAZY_LOADING;
  return CUDA_SUCCESS;
}
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* blocks, CUfunction function, int threads,
                                                              size_t shared, unsigned int) {
  return cuOccupancyMaxActiveBlocksPerMultiprocessor(blocks, function, threads, shared);
}

// ---- what a library that opens this driver itself finds by name

// cuBLASLt (which cuDNN's RNNs create a handle of) opens libcuda.so.1 with
// dlopen and looks up some sixty functions with dlsym, by the names the
// driver exports. It refuses to start when one is missing ("Driver API
// initialization failed"), and cuDNN then fails in cudnnGetRNNTempSpaceSizes
// with CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED. So each is here,
// with the older ABI's names (asm labels: cuda.h maps each plain name to
// its newest version).
CUresult cuKernelGetLibrary(CUlibrary* library, CUkernel) {
  *library = reinterpret_cast<CUlibrary>(&token);
  return CUDA_SUCCESS;
}
CUresult legacy_event_elapsed_time(float* ms, CUevent start, CUevent end) __asm__("cuEventElapsedTime");
CUresult legacy_event_elapsed_time(float* ms, CUevent start, CUevent end) { return cuEventElapsedTime(ms, start, end); }
CUresult legacy_primary_context_release(CUdevice device) __asm__("cuDevicePrimaryCtxRelease");
CUresult legacy_primary_context_release(CUdevice device) { return cuDevicePrimaryCtxRelease(device); }
CUresult legacy_capture_info(CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                             const CUgraphNode** dependencies, size_t* count) __asm__("cuStreamGetCaptureInfo_v2");
CUresult legacy_capture_info(CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                             const CUgraphNode** dependencies, size_t* count) {
  return cuStreamGetCaptureInfo(stream, status, id, graph, dependencies, nullptr, count);
}
CUresult cuStreamBeginCapture(CUstream stream, CUstreamCaptureMode mode) {
  return from_runtime(cudaStreamBeginCapture(stream, static_cast<cudaStreamCaptureMode>(mode)));
}
CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  return from_runtime(cudaStreamEndCapture(stream, reinterpret_cast<cudaGraph_t*>(graph)));
}
CUresult cuGraphDestroy(CUgraph graph) { return from_runtime(cudaGraphDestroy(reinterpret_cast<cudaGraph_t>(graph))); }
CUresult cuGraphExecDestroy(CUgraphExec exec) {
  return from_runtime(cudaGraphExecDestroy(reinterpret_cast<cudaGraphExec_t>(exec)));
}
CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  return from_runtime(cudaGraphLaunch(reinterpret_cast<cudaGraphExec_t>(exec), stream));
}
// The fake runtime's graphs are tokens without nodes: what reads or
// rewrites nodes is not done.
CUresult legacy_graph_instantiate(CUgraphExec*, CUgraph, CUgraphNode*, char*, size_t) __asm__("cuGraphInstantiate");
CUresult legacy_graph_instantiate(CUgraphExec*, CUgraph, CUgraphNode*, char*, size_t) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult legacy_kernel_node_params(CUgraphNode, CUDA_KERNEL_NODE_PARAMS*) __asm__("cuGraphKernelNodeGetParams");
CUresult legacy_kernel_node_params(CUgraphNode, CUDA_KERNEL_NODE_PARAMS*) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult legacy_set_kernel_node_params(CUgraphExec, CUgraphNode, const CUDA_KERNEL_NODE_PARAMS*) __asm__(
    "cuGraphExecKernelNodeSetParams");
CUresult legacy_set_kernel_node_params(CUgraphExec, CUgraphNode, const CUDA_KERNEL_NODE_PARAMS*) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult cuGraphGetNodes(CUgraph, CUgraphNode*, size_t*) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuGraphNodeGetType(CUgraphNode, CUgraphNodeType*) { return CUDA_ERROR_NOT_SUPPORTED; }
// Kernels return at once: a wait on a value is met, a batch of memory
// operations done.
CUresult legacy_wait_value(CUstream stream, CUdeviceptr, cuuint32_t, unsigned int) __asm__("cuStreamWaitValue32");
CUresult legacy_wait_value(CUstream stream, CUdeviceptr, cuuint32_t, unsigned int) { return launched(stream); }
CUresult legacy_batch_memory_operations(CUstream stream, unsigned int, CUstreamBatchMemOpParams*, unsigned int) __asm__(
    "cuStreamBatchMemOp");
CUresult legacy_batch_memory_operations(CUstream stream, unsigned int, CUstreamBatchMemOpParams*, unsigned int) {
  return launched(stream);
}
CUresult legacy_prefetch(CUdeviceptr, size_t, CUdevice, CUstream stream) __asm__("cuMemPrefetchAsync");
CUresult legacy_prefetch(CUdeviceptr, size_t, CUdevice, CUstream stream) { return launched(stream); }
CUresult cuMemcpy(CUdeviceptr to, CUdeviceptr from, size_t bytes) {
  return from_runtime(
      cudaMemcpy(reinterpret_cast<void*>(to), reinterpret_cast<const void*>(from), bytes, cudaMemcpyDefault));
}
// A copy from the device to the host zeros each row, as the runtime's does.
CUresult cuMemcpy2DAsync(const CUDA_MEMCPY2D* copy, CUstream stream) {
  if (copy->srcMemoryType == CU_MEMORYTYPE_DEVICE && copy->dstMemoryType == CU_MEMORYTYPE_HOST)
    for (size_t row = 0; row < copy->Height; ++row)
      std::memset(static_cast<char*>(copy->dstHost) + (copy->dstY + row) * copy->dstPitch + copy->dstXInBytes, 0,
                  copy->WidthInBytes);
  return launched(stream);
}
CUresult cuMemcpy2D(const CUDA_MEMCPY2D* copy) { return cuMemcpy2DAsync(copy, nullptr); }
CUresult cuPointerGetAttributes(unsigned int count, CUpointer_attribute* attributes, void** data, CUdeviceptr pointer) {
  for (unsigned int i = 0; i < count; ++i)
    if (const CUresult result = cuPointerGetAttribute(data[i], attributes[i], pointer); result != CUDA_SUCCESS)
      return result;
  return CUDA_SUCCESS;
}
// One device: no peers.
CUresult cuCtxEnablePeerAccess(CUcontext, unsigned int) { return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED; }
CUresult cuCtxDisablePeerAccess(CUcontext) { return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED; }

}  // extern "C"

// cuDNN's run-time compiled engines look these up by their first names,
// which cuda.h's macros turn into their newest, of the same signatures.
#define METAMEM_FIRST_NAME(name, newest) \
  extern "C" __attribute__((alias(#newest))) decltype(newest) name##_first_name __asm__(#name);
METAMEM_FIRST_NAME(cuCtxPopCurrent, cuCtxPopCurrent_v2)
METAMEM_FIRST_NAME(cuCtxPushCurrent, cuCtxPushCurrent_v2)
METAMEM_FIRST_NAME(cuLinkCreate, cuLinkCreate_v2)
METAMEM_FIRST_NAME(cuLinkAddData, cuLinkAddData_v2)
#undef METAMEM_FIRST_NAME
