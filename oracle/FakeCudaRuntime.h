// The fake CUDA runtime's own calls (oracle/FakeCudaRuntime.cpp): which GPU
// it pretends to be. A program that links it in place of libcudart sets the
// GPU before anything asks the runtime.
#pragma once

#include <cuda.h>

#include <cstddef>

extern "C" {

// The one device: its name, memory in bytes, compute capability, SMs, L2
// cache, threads per SM and shared memory (a block's opt-in limit, an SM's).
// Before the first call of the runtime; the default is an H100.
void metamem_fake_cuda_set_device(const char* name, std::size_t total_memory, int major, int minor,
                                  int multi_processor_count, int l2_cache_size, int max_threads_per_multi_processor,
                                  int shared_memory_per_block_optin, int shared_memory_per_multi_processor);
// cuDeviceGetAttribute of the one device, for the runtime, its driver entry
// points and the fake driver (oracle/FakeCudaDriver.cpp), which finds it
// here, where the device is set.
CUresult metamem_fake_cuda_device_attribute(int* value, CUdevice_attribute attribute, CUdevice device);
// A kernel launched through the driver on `stream`: a node of the graph the
// stream captures, if it captures (the fake driver calls it).
void metamem_fake_cuda_launched(CUstream stream);
// Device memory in use now: cudaMalloc'd and cuMemCreate'd bytes.
std::size_t metamem_fake_cuda_used_memory();

}
