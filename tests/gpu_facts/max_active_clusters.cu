// What cuOccupancyMaxActiveClusters answers on this GPU for the probe cuDNN
// makes before it sizes an sm90 engine's workspace: a 128-thread block with
// all of the opt-in shared memory, non-portable cluster sizes allowed,
// clusters of 1 to 32 blocks. Also other blocks and shared memory.
#include <cstdio>
#include <cuda.h>
#include <cuda_runtime.h>
__global__ void probe() {}
int main() {
  int optin = 0;
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
  cudaFuncSetAttribute(probe, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  const int blocks[] = {128, 256, 384, 1024};
  const int smems[] = {optin, optin / 2, 100 * 1024, 0};
  printf("{\"optin\": %d, \"probes\": [\n", optin);
  bool first = true;
  for (int block : blocks)
    for (int smem : smems)
      for (int c = 1; c <= 32; ++c) {
        cudaLaunchConfig_t config = {};
        config.gridDim = dim3(c, 1, 1);
        config.blockDim = dim3(block, 1, 1);
        config.dynamicSmemBytes = smem;
        cudaLaunchAttribute attribute;
        attribute.id = cudaLaunchAttributeClusterDimension;
        attribute.val.clusterDim.x = c;
        attribute.val.clusterDim.y = 1;
        attribute.val.clusterDim.z = 1;
        config.attrs = &attribute;
        config.numAttrs = 1;
        int clusters = -1;
        cudaError_t rc = cudaOccupancyMaxActiveClusters(&clusters, probe, &config);
        cudaGetLastError();
        printf("%s[%d, %d, %d, %d, %d]", first ? "" : ",\n", block, smem, c, clusters, (int)rc);
        first = false;
      }
  int per_sm = -1;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, probe, 128, optin);
  printf("\n], \"blocks_per_sm_128_optin\": %d}\n", per_sm);
}
