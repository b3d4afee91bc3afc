// cuBLAS and cuBLASLt as real torch on the fake runtime calls them (the
// functions libtorch_cuda.so imports): handles and descriptors are tokens,
// the algorithm search finds one algorithm, and every product returns at
// once without computing. Preloaded, these come before the real libraries,
// which would ask a GPU; what torch asks of cuBLAS for memory (the
// workspace it allocates through the caching allocator) is its own code.
#include <cstring>

namespace {
int token;
}  // namespace

extern "C" {

// Each handle is its own, as the real library's are: torch keeps a cuBLAS
// workspace per (handle, stream), and its handle pool gives each host
// thread (autograd's device thread among them) a handle of its own.
int cublasCreate_v2(void** handle) {
  *handle = new int;  // never destroyed, as torch never destroys its handles
  return 0;
}
int cublasGetMathMode(void*, int* mode) {
  *mode = 0;
  return 0;
}
int cublasGetPointerMode_v2(void*, int* mode) {
  *mode = 0;
  return 0;
}
int cublasLtMatmulDescCreate(void** descriptor, int, int) {
  *descriptor = &token;
  return 0;
}
int cublasLtMatrixLayoutCreate(void** layout, int, unsigned long, unsigned long, long) {
  *layout = &token;
  return 0;
}
int cublasLtMatmulPreferenceCreate(void** preference) {
  *preference = &token;
  return 0;
}
// One heuristic result (cublasLtMatmulHeuristicResult_t: 96 bytes), zeroed.
int cublasLtMatmulAlgoGetHeuristic(void*, void*, void*, void*, void*, void*, void*, int, void* results,
                                   int* returned) {
  std::memset(results, 0, 96);
  *returned = 1;
  return 0;
}
unsigned long cublasLtGetVersion() { return 130000; }

// Everything else: CUBLAS_STATUS_SUCCESS, with nothing written.
#define METAMEM_CUBLAS_SUCCEEDS(name) \
  int name() { return 0; }
#define METAMEM_CUBLAS_CALLS(X)                                                                                  \
  X(cublasCdotc_v2) X(cublasCdotu_v2) X(cublasCgelsBatched) X(cublasCgemmStridedBatched) X(cublasCgemm_v2)        \
  X(cublasCgemv_v2) X(cublasCgeqrfBatched) X(cublasCgetrfBatched) X(cublasCgetrsBatched) X(cublasCtrsmBatched)    \
  X(cublasCtrsm_v2) X(cublasDdot_v2) X(cublasDestroy_v2) X(cublasDgelsBatched) X(cublasDgemmStridedBatched)       \
  X(cublasDgemm_v2) X(cublasDgemv_v2) X(cublasDgeqrfBatched) X(cublasDgetrfBatched) X(cublasDgetrsBatched)        \
  X(cublasDotEx) X(cublasDtrsmBatched) X(cublasDtrsm_v2) X(cublasGemmEx) X(cublasGemmStridedBatchedEx)            \
  X(cublasLtMatmul) X(cublasLtMatmulAlgoCheck) X(cublasLtMatmulAlgoConfigGetAttribute)                            \
  X(cublasLtMatmulAlgoConfigSetAttribute) X(cublasLtMatmulAlgoInit) X(cublasLtMatmulDescDestroy)                  \
  X(cublasLtMatmulDescSetAttribute) X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute)    \
  X(cublasLtMatrixLayoutDestroy) X(cublasLtMatrixLayoutSetAttribute) X(cublasSdot_v2) X(cublasSetMathMode)        \
  X(cublasSetPointerMode_v2) X(cublasSetSmCountTarget) X(cublasSetStream_v2) X(cublasSetWorkspace_v2)             \
  X(cublasSgelsBatched) X(cublasSgemmEx) X(cublasSgemmStridedBatched) X(cublasSgemm_v2) X(cublasSgemv_v2)         \
  X(cublasSgeqrfBatched) X(cublasSgetrfBatched) X(cublasSgetrsBatched) X(cublasStrsmBatched) X(cublasStrsm_v2)    \
  X(cublasZdotc_v2) X(cublasZdotu_v2) X(cublasZgelsBatched) X(cublasZgemmStridedBatched) X(cublasZgemm_v2)        \
  X(cublasZgemv_v2) X(cublasZgeqrfBatched) X(cublasZgetrfBatched) X(cublasZgetrsBatched) X(cublasZtrsmBatched)    \
  X(cublasZtrsm_v2)
METAMEM_CUBLAS_CALLS(METAMEM_CUBLAS_SUCCEEDS)

}  // extern "C"
