// The fake GPU made a GPU of metamem's table, by a program linked to the
// fake CUDA runtime (metamem-allocator-oracle) or run with it preloaded
// (metamem-zoo-on-fake-gpu), before anything asks the runtime. Python's
// children do the same through ctypes (metamem/_fake_gpu_server.py).
#pragma once

#include <string>

#include "estimator/Gpu.h"
#include "oracle/FakeCudaRuntime.h"

namespace metamem {

inline void set_fake_gpu_device(const GpuSpec& gpu) {
  const std::string name(gpu.name);
  const metamem_fake_gpu device = {name.c_str(),
                                   static_cast<std::size_t>(gpu.total_memory),
                                   gpu.major,
                                   gpu.minor,
                                   gpu.multi_processor_count,
                                   static_cast<int>(gpu.l2_cache_size),
                                   gpu.max_threads_per_multi_processor,
                                   gpu.shared_memory_per_block_optin,
                                   gpu.shared_memory_per_multi_processor,
                                   gpu.clock_rate,
                                   gpu.memory_clock_rate,
                                   gpu.memory_bus_width,
                                   gpu.max_active_clusters.data(),
                                   static_cast<int>(gpu.max_active_clusters.size())};
  metamem_fake_cuda_set_device(&device);
}

}  // namespace metamem
