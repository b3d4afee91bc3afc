// A fake CUDA driver (libcuda.so.1) for real torch on the fake runtime:
// torch's CUDA initialisation loads libcaffe2_nvrtc.so, which links these
// driver calls. There is one context, modules load and kernels launch
// without running; what compiles or links code at run time (NVRTC's jit)
// answers CUDA_ERROR_NOT_SUPPORTED.
#include <cuda.h>

#include <cstring>

namespace {
int token;  // what contexts, modules and functions point to
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
CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute, CUdevice) {
  *value = 0;
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxGetState(CUdevice, unsigned int* flags, int* active) {
  *flags = 0;
  *active = 1;
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice) { return cuCtxGetCurrent(context); }
CUresult cuFuncGetAttribute(int* value, CUfunction_attribute, CUfunction) {
  *value = 0;
  return CUDA_SUCCESS;
}
CUresult cuFuncSetAttribute(CUfunction, CUfunction_attribute, int) { return CUDA_SUCCESS; }
CUresult cuFuncSetCacheConfig(CUfunction, CUfunc_cache) { return CUDA_SUCCESS; }
CUresult cuGetErrorString(CUresult, const char** text) {
  *text = "metamem's fake CUDA driver does not do this";
  return CUDA_SUCCESS;
}
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                        void**, void**) {
  return CUDA_SUCCESS;
}
CUresult cuLaunchCooperativeKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   CUstream, void**) {
  return CUDA_SUCCESS;
}
CUresult cuModuleLoad(CUmodule*, const char*) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuModuleLoadData(CUmodule* module, const void*) {
  *module = reinterpret_cast<CUmodule>(&token);
  return CUDA_SUCCESS;
}
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
CUresult cuLinkCreate_v2(unsigned int, CUjit_option*, void**, CUlinkState*) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuLinkAddData_v2(CUlinkState, CUjitInputType, void*, size_t, const char*, unsigned int, CUjit_option*,
                          void**) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult cuLinkComplete(CUlinkState, void**, size_t*) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuPointerGetAttribute(void*, CUpointer_attribute, CUdeviceptr) { return CUDA_ERROR_NOT_SUPPORTED; }
CUresult cuTensorMapEncodeTiled(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  return CUDA_ERROR_NOT_SUPPORTED;
}

}  // extern "C"
