// How a CUDA runtime linked statically into a library (cuDNN's, cuBLASLt's)
// finds the fake driver's functions (oracle/FakeCudaDriver.cpp): by base
// name and the CUDA version whose signature it calls them with
// (cuGetProcAddress), not by the driver's exported symbols.
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

CUresult get_proc_address(const char* symbol, void** function, int version, cuuint64_t flags) {
  return cuGetProcAddress(symbol, function, version, flags, nullptr);
}
CUresult capture_info(CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id) {
  return cuStreamGetCaptureInfo(stream, status, id, nullptr, nullptr, nullptr, nullptr);
}
CUresult capture_info_without_edges(CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                                    const CUgraphNode** dependencies, size_t* count) {
  return cuStreamGetCaptureInfo(stream, status, id, graph, dependencies, nullptr, count);
}
CUresult context_device(CUdevice* device, CUcontext) { return cuCtxGetDevice(device); }
CUresult context_synchronize(CUcontext) { return cuCtxSynchronize(); }
CUresult stream_context(CUstream stream, CUcontext* context, CUgreenCtx* green) {
  if (green) *green = nullptr;
  return cuStreamGetCtx(stream, context);
}

struct EntryPoint {
  const char* name;
  int since;  // the CUDA version whose signature it has
  void* function;
};
// A runtime asks for each function by its base name and the CUDA version
// whose signature it calls with: the newest one here no newer than that.
// cuda.h's macros turn each function named into its newest version with the
// signature of its first (cuMemAlloc: cuMemAlloc_v2); where a version
// changed the signature, each is listed with the version it came in.
#define METAMEM_ENTRY(name) {#name, 0, reinterpret_cast<void*>(&name)}
#define METAMEM_VERSION(name, since, function) {#name, since, reinterpret_cast<void*>(&function)}
const EntryPoint kEntryPoints[] = {
    METAMEM_VERSION(cuGetProcAddress, 11030, get_proc_address),
    METAMEM_VERSION(cuGetProcAddress, 12000, cuGetProcAddress),
    METAMEM_VERSION(cuStreamGetCaptureInfo, 10010, capture_info),
    METAMEM_VERSION(cuStreamGetCaptureInfo, 11030, capture_info_without_edges),
    METAMEM_VERSION(cuStreamGetCaptureInfo, 12030, cuStreamGetCaptureInfo),
    METAMEM_VERSION(cuCtxGetDevice, 2000, cuCtxGetDevice), METAMEM_VERSION(cuCtxGetDevice, 13000, context_device),
    METAMEM_VERSION(cuCtxSynchronize, 2000, cuCtxSynchronize),
    METAMEM_VERSION(cuCtxSynchronize, 13000, context_synchronize),
    METAMEM_VERSION(cuStreamGetCtx, 9020, cuStreamGetCtx), METAMEM_VERSION(cuStreamGetCtx, 12050, stream_context),
    METAMEM_ENTRY(cuInit), METAMEM_ENTRY(cuDriverGetVersion), METAMEM_ENTRY(cuGetExportTable),
    METAMEM_ENTRY(cuGetErrorString), METAMEM_ENTRY(cuDeviceGet), METAMEM_ENTRY(cuDeviceGetCount),
    METAMEM_ENTRY(cuDeviceGetAttribute), METAMEM_ENTRY(cuDeviceGetName), METAMEM_ENTRY(cuDeviceTotalMem),
    METAMEM_ENTRY(cuDeviceGetUuid), METAMEM_ENTRY(cuDeviceGetLuid), METAMEM_ENTRY(cuDeviceGetPCIBusId),
    METAMEM_ENTRY(cuDeviceCanAccessPeer), METAMEM_ENTRY(cuDevicePrimaryCtxRetain),
    METAMEM_ENTRY(cuDevicePrimaryCtxRelease), METAMEM_ENTRY(cuDevicePrimaryCtxGetState),
    METAMEM_ENTRY(cuDevicePrimaryCtxSetFlags), METAMEM_ENTRY(cuDevicePrimaryCtxReset),
    METAMEM_ENTRY(cuCtxGetCurrent), METAMEM_ENTRY(cuCtxSetCurrent), METAMEM_ENTRY(cuCtxPushCurrent),
    METAMEM_ENTRY(cuCtxPopCurrent), METAMEM_ENTRY(cuCtxGetFlags), METAMEM_ENTRY(cuCtxGetApiVersion),
    METAMEM_ENTRY(cuCtxGetId), METAMEM_ENTRY(cuCtxGetStreamPriorityRange), METAMEM_ENTRY(cuCtxGetCacheConfig),
    METAMEM_ENTRY(cuCtxSetCacheConfig), METAMEM_ENTRY(cuCtxGetLimit), METAMEM_ENTRY(cuCtxSetLimit),
    METAMEM_ENTRY(cuMemAlloc), METAMEM_ENTRY(cuMemFree), METAMEM_ENTRY(cuMemGetInfo), METAMEM_ENTRY(cuMemAllocHost),
    METAMEM_ENTRY(cuMemHostAlloc), METAMEM_ENTRY(cuMemFreeHost), METAMEM_ENTRY(cuMemHostGetDevicePointer),
    METAMEM_ENTRY(cuMemHostGetFlags), METAMEM_ENTRY(cuMemHostRegister), METAMEM_ENTRY(cuMemHostUnregister),
    METAMEM_ENTRY(cuMemsetD8),
    METAMEM_ENTRY(cuMemsetD32), METAMEM_ENTRY(cuMemsetD8Async), METAMEM_ENTRY(cuMemsetD32Async),
    METAMEM_ENTRY(cuMemcpy), METAMEM_ENTRY(cuMemcpy2D), METAMEM_ENTRY(cuMemcpy2DAsync),
    METAMEM_ENTRY(cuPointerGetAttributes),
    METAMEM_ENTRY(cuGetErrorName), METAMEM_ENTRY(cuOccupancyMaxPotentialClusterSize), METAMEM_ENTRY(cuLinkCreate),
    METAMEM_ENTRY(cuLinkAddData), METAMEM_ENTRY(cuLinkComplete), METAMEM_ENTRY(cuLinkDestroy),
    METAMEM_ENTRY(cuLibraryLoadFromFile), METAMEM_ENTRY(cuCtxEnablePeerAccess), METAMEM_ENTRY(cuCtxDisablePeerAccess),
    METAMEM_ENTRY(cuMemcpyAsync), METAMEM_ENTRY(cuMemcpyHtoD), METAMEM_ENTRY(cuMemcpyDtoH),
    METAMEM_ENTRY(cuMemcpyHtoDAsync), METAMEM_ENTRY(cuMemcpyDtoHAsync), METAMEM_ENTRY(cuMemcpyDtoDAsync),
    METAMEM_ENTRY(cuPointerGetAttribute), METAMEM_ENTRY(cuStreamCreate), METAMEM_ENTRY(cuStreamCreateWithPriority),
    METAMEM_ENTRY(cuStreamDestroy), METAMEM_ENTRY(cuStreamSynchronize), METAMEM_ENTRY(cuStreamQuery),
    METAMEM_ENTRY(cuStreamGetFlags), METAMEM_ENTRY(cuStreamGetPriority), METAMEM_ENTRY(cuStreamGetId),
    METAMEM_ENTRY(cuStreamWaitEvent), METAMEM_ENTRY(cuStreamIsCapturing),
    METAMEM_ENTRY(cuThreadExchangeStreamCaptureMode), METAMEM_ENTRY(cuEventCreate), METAMEM_ENTRY(cuEventDestroy),
    METAMEM_ENTRY(cuEventRecord), METAMEM_ENTRY(cuEventRecordWithFlags), METAMEM_ENTRY(cuEventQuery),
    METAMEM_ENTRY(cuEventSynchronize), METAMEM_ENTRY(cuEventElapsedTime), METAMEM_ENTRY(cuModuleLoad),
    METAMEM_ENTRY(cuModuleLoadData), METAMEM_ENTRY(cuModuleLoadDataEx), METAMEM_ENTRY(cuModuleUnload),
    METAMEM_ENTRY(cuModuleGetFunction), METAMEM_ENTRY(cuModuleGetLoadingMode), METAMEM_ENTRY(cuLibraryLoadData),
    METAMEM_ENTRY(cuLibraryUnload), METAMEM_ENTRY(cuLibraryGetKernel), METAMEM_ENTRY(cuLibraryGetModule),
    METAMEM_ENTRY(cuLibraryGetGlobal), METAMEM_ENTRY(cuModuleGetGlobal),
    METAMEM_ENTRY(cuKernelGetFunction), METAMEM_ENTRY(cuKernelGetAttribute), METAMEM_ENTRY(cuKernelSetAttribute),
    METAMEM_ENTRY(cuKernelSetCacheConfig), METAMEM_ENTRY(cuFuncGetAttribute), METAMEM_ENTRY(cuFuncSetAttribute),
    METAMEM_ENTRY(cuFuncSetCacheConfig), METAMEM_ENTRY(cuFuncGetModule), METAMEM_ENTRY(cuFuncLoad),
    METAMEM_ENTRY(cuFuncIsLoaded), METAMEM_ENTRY(cuLaunchKernel), METAMEM_ENTRY(cuLaunchKernelEx),
    METAMEM_ENTRY(cuLaunchCooperativeKernel), METAMEM_ENTRY(cuOccupancyMaxActiveBlocksPerMultiprocessor),
    METAMEM_ENTRY(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags), METAMEM_ENTRY(cuOccupancyMaxActiveClusters),
    METAMEM_ENTRY(cuOccupancyAvailableDynamicSMemPerBlock), METAMEM_ENTRY(cuTensorMapEncodeTiled),
    METAMEM_ENTRY(cuTensorMapEncodeIm2col), METAMEM_ENTRY(cuTensorMapReplaceAddress),
};
#undef METAMEM_VERSION
#undef METAMEM_ENTRY

}  // namespace

extern "C" {

// Libraries that link the runtime statically open this driver and ask it
// for each entry point. One not here is not found, which the runtime
// accepts as an older driver's gap until it is called;
// METAMEM_FAKE_DRIVER_LOG=1 names each.
CUresult cuGetProcAddress(const char* symbol, void** function, int version, cuuint64_t,
                          CUdriverProcAddressQueryResult* status) {
  const EntryPoint* found = nullptr;
  bool named = false;
  for (const EntryPoint& entry : kEntryPoints) {
    if (std::strcmp(entry.name, symbol) != 0) continue;
    named = true;
    if (entry.since <= version && (!found || entry.since > found->since)) found = &entry;
  }
  *function = found ? found->function : nullptr;
  if (status)
    *status = found ? CU_GET_PROC_ADDRESS_SUCCESS
                    : named ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (!found && std::getenv("METAMEM_FAKE_DRIVER_LOG"))
    std::fprintf(stderr, "fake driver: no %s (CUDA %d)\n", symbol, version);
  return found ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

}  // extern "C"
