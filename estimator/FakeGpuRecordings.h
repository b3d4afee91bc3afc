// Real torch on metamem's fake GPU, asked from a trace.
//
// The fake GPU (oracle/: a CUDA runtime, cuBLAS and driver preloaded into a
// child Python) runs the wheel's own torch, cuDNN among its libraries, with
// kernels that return at once: torch's caching allocator sees what real
// torch allocates, and cuDNN's own heuristics choose its engines and size
// their workspaces for the GPU named. While a FollowRecordingsScope lives,
// traces ask it, once per distinct call, what the kernels whose temporaries
// only cuDNN or cub knows (convolutions, RNNs, sorting: recorded_ops())
// allocate inside, and follow that recording (set_recorded_plans). Both
// front ends use it: Python's trace(fake_gpu=...) and the C++ CLI with
// METAMEM_FAKE_GPU set.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "estimator/Gpu.h"
#include "meta/CpuKernelModel.h"
#include "meta/FakeCuda.h"

namespace metamem {

// What starts the child: the folder of the fake GPU's libraries
// (build/oracle), a Python with the pinned torch, and the child's program
// (metamem/_fake_gpu_server.py).
struct FakeGpu {
  std::string folder, python, server;
};

// Throws std::invalid_argument, naming `folder`, where it does not hold
// the fake GPU's libraries.
void check_fake_gpu(const std::string& folder);

// The environment (NAME=VALUE each) of a child whose CUDA is the fake GPU
// of `folder`: this process's, with the fake runtime and cuBLAS preloaded
// and the fake driver (libcuda.so.1) found first.
std::vector<std::string> fake_gpu_environment(const std::string& folder);

// What the fake device is made of `gpu` (its name, memory, capability,
// SMs, caches, clocks, cluster placement), as the JSON object the child's
// make_gpu (metamem/_fake_gpu_server.py) reads.
std::string fake_device_json(const GpuSpec& gpu);

// The ops a trace takes from the recordings.
const std::vector<std::string>& recorded_ops();

// One recording (the child's answer, JSON) as the plan a trace follows:
// the returns where they were made ("output"), each temporary made and
// freed in its place, the allocator's cache emptied where the call emptied
// it ("empty_cache"), and a first cuBLAS call where the recording kept a
// block that no return holds (cuBLAS's workspace). An answer that is real
// torch's error raises it (std::runtime_error). With cuDNN's benchmark on,
// the answer also holds the call made again ("repeat": the engine found is
// kept, no search), which a trace follows after its first such call.
ScratchPlan recorded_plan(const std::string& recording);

// The fake GPU's recordings made `gpu`: one child, started at the first
// question, and its answers, kept for the process per fake GPU and GPU.
class FakeGpuRecordings {
 public:
  FakeGpuRecordings(const FakeGpu& fake_gpu, const GpuSpec& gpu);  // std::invalid_argument: no fake GPU there

 private:
  friend class FollowRecordingsScope;
  std::shared_ptr<class KernelRecordings> kernels_;
};

// While alive, every trace of the process on fake cuda follows `recordings`
// for recorded_ops(); where libtorch's CUDA library is not loaded (the
// C++ front end), fake cuda answers as a CUDA build with the fake GPU's
// cuDNN (CudnnBuildScope), so that batch norm and RNNs take cuDNN there too.
class FollowRecordingsScope {
 public:
  explicit FollowRecordingsScope(const FakeGpuRecordings& recordings);
  ~FollowRecordingsScope();
  FollowRecordingsScope(const FollowRecordingsScope&) = delete;
  FollowRecordingsScope& operator=(const FollowRecordingsScope&) = delete;

 private:
  CudnnBuildScope cudnn_;
};

}  // namespace metamem
