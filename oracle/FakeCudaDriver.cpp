// A fake CUDA driver (libcuda.so.1) for real torch on the fake runtime:
// torch's CUDA initialisation loads libcaffe2_nvrtc.so, which links these
// driver calls, and Triton's launcher and Inductor's static launcher load
// and launch compiled kernels through them. There is one context, the
// fake runtime's device (its attributes come from there), modules load and
// kernels launch without running; what compiles or links code at run time
// (NVRTC's jit) answers CUDA_ERROR_NOT_SUPPORTED.
#include <cuda.h>

#include <cstring>

#include "oracle/FakeCudaRuntime.h"

// The runtime is preloaded beside this driver (docs/allocator-oracle.md):
// weak, so that the driver still loads, and answers no attribute, alone.
extern "C" __attribute__((weak)) CUresult metamem_fake_cuda_device_attribute(int*, CUdevice_attribute, CUdevice);
extern "C" __attribute__((weak)) void metamem_fake_cuda_launched(CUstream);

namespace {
int token;  // what contexts, modules and functions point to

// A launch on a stream that captures a graph is one of its nodes.
CUresult launched(CUstream stream) {
  if (metamem_fake_cuda_launched) metamem_fake_cuda_launched(stream);
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
CUresult cuDevicePrimaryCtxGetState(CUdevice, unsigned int* flags, int* active) {
  *flags = 0;
  *active = 1;
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice) { return cuCtxGetCurrent(context); }
// Every kernel fits: a block may have all of a device's threads (Triton
// checks its warps against this), and uses no registers, spills or static
// shared memory worth counting.
CUresult cuFuncGetAttribute(int* value, CUfunction_attribute attribute, CUfunction) {
  *value = attribute == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK ? 1024 : 0;
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
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, CUfunction, int, size_t) {
  *blocks = 1;
  return CUDA_SUCCESS;
}
CUresult cuOccupancyMaxActiveClusters(int* clusters, CUfunction, const CUlaunchConfig*) {
  *clusters = 1;
  return CUDA_SUCCESS;
}
// NVRTC opens this driver when it compiles (torch's jiterated ops: exp2,
// ...) and asks it for an export table, which it then uses without
// checking that the lookup found one: none, said as an error.
CUresult cuGetExportTable(const void** table, const CUuuid*) {
  *table = nullptr;
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult cuLinkCreate_v2(unsigned int, CUjit_option*, void**, CUlinkState*) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuLinkAddData_v2(CUlinkState, CUjitInputType, void*, size_t, const char*, unsigned int, CUjit_option*,
                          void**) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult cuLinkComplete(CUlinkState, void**, size_t*) { return CUDA_ERROR_NOT_SUPPORTED; }
// Triton's launcher asks each pointer argument's device address: the
// fake runtime's addresses are the device's.
CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr pointer) {
  if (attribute != CU_POINTER_ATTRIBUTE_DEVICE_POINTER) return CUDA_ERROR_NOT_SUPPORTED;
  *static_cast<CUdeviceptr*>(data) = pointer;
  return CUDA_SUCCESS;
}
CUresult cuTensorMapEncodeTiled(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult cuTensorMapEncodeIm2col(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const int*, const int*, cuuint32_t, cuuint32_t,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  return CUDA_ERROR_NOT_SUPPORTED;
}

}  // extern "C"
