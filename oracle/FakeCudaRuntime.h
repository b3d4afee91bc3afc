// The fake CUDA runtime's own calls (oracle/FakeCudaRuntime.cpp): which GPU
// it pretends to be. A program that links it in place of libcudart sets the
// GPU before anything asks the runtime.
#pragma once

#include <cuda.h>

#include <cstddef>

// The registers a thread of every kernel uses (cudaFuncGetAttributes,
// cuFuncGetAttribute): 32, with which the 65,536 registers of an SM (on
// every GPU of metamem's table) hold 2,048 threads, the most any of them
// runs, so that every kernel fits at full occupancy. Occupancy calculators
// divide by them: at 0, cuBLASLt's heuristics (asked by a cuDNN engine for
// a 1x1 convolution of 3 channels, timm's CoaT-Tiny head) stopped the
// process with a division by zero, and at 128 or 255, where its block did
// not fit, the same way. Inductor shrinks the reduction blocks of a Triton
// kernel of more than 32 (`dynamic_scale_rblock`): at 32 it compiles as it
// did when the fake GPU answered 0, and as a trace, which builds no kernel.
constexpr int kFakeKernelRegisters = 32;

extern "C" {

// The GPU the one device is, as estimator/Gpu.h describes it. Laid out
// alike in python/metamem/_fake_gpu_server.py (ctypes), which sets it too.
struct metamem_fake_gpu {
  const char* name;
  std::size_t total_memory;  // bytes
  int major, minor;          // compute capability
  int multi_processor_count;
  int l2_cache_size;
  int max_threads_per_multi_processor;
  int shared_memory_per_block_optin, shared_memory_per_multi_processor;
  int clock_rate, memory_clock_rate;  // kHz
  int memory_bus_width;               // bits
  const int* max_active_clusters;     // of 1, 2, ... `largest_cluster` blocks
  int largest_cluster;                // 0 where it launches no clusters
};

// Before the first call of the runtime; the default is an H100 without
// clocks or clusters.
void metamem_fake_cuda_set_device(const struct metamem_fake_gpu* gpu);
// cuDeviceGetAttribute of the one device, for the runtime, its driver entry
// points and the fake driver (oracle/FakeCudaDriver.cpp), which finds it
// here, where the device is set.
CUresult metamem_fake_cuda_device_attribute(int* value, CUdevice_attribute attribute, CUdevice device);
// cuOccupancyMaxActiveClusters for clusters of `blocks` blocks, each kernel
// taken to fit once per SM (as the fake driver's occupancy says):
// CUDA_ERROR_NOT_SUPPORTED on a device without clusters.
CUresult metamem_fake_cuda_max_active_clusters(int* clusters, unsigned int blocks);
// A kernel launched through the driver on `stream`: a node of the graph the
// stream captures, if it captures (the fake driver calls it).
void metamem_fake_cuda_launched(CUstream stream);
// Device memory in use now: cudaMalloc'd and cuMemCreate'd bytes.
std::size_t metamem_fake_cuda_used_memory();
// cudaMalloc grants the next `calls` calls, then refuses every request of
// `bytes` or more until it grants a smaller one; 0 bytes: it refuses none
// from now. The fake GPU's server asks which workspace cuDNN falls back on
// where the caching allocator runs out (metamem/_fake_gpu_server.py).
void metamem_fake_cuda_refuse_mallocs(std::size_t calls, std::size_t bytes);

}
