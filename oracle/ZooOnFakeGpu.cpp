// metamem-zoo-on-fake-gpu: a zoo model's training steps, chosen by the
// model flags of `metamem profile`, run by real torch on the fake GPU as a
// C++ program runs them (the model built on the CPU and moved with
// Module::to), for tests to compare with `metamem profile --device cuda`.
// Prints {"allocated": [...], "reserved": [...]}: each step's max allocated
// and max reserved bytes in torch's caching allocator. --allocator-events
// FILE writes what the allocator was asked, from the model's move on, as
// `metamem profile --allocator-events` writes a trace's, to find where the
// two part (metamem-allocator-oracle replays either).
//
// Run with the fake GPU preloaded (estimator/FakeGpuRecordings.h's
// fake_gpu_environment); the fake device is made the --gpu.
#include <dlfcn.h>
#include <unistd.h>

#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "estimator/AllocatorEvents.h"
#include "examples/cli/Flags.h"
#include "examples/cli/ModelFlags.h"
#include "oracle/FakeGpuDevice.h"

namespace {

namespace c10_allocator = c10::cuda::CUDACachingAllocator;

// The allocator itself, reached through its virtual functions: libc10_cuda
// is loaded with libtorch's CUDA library, after this program starts.
c10_allocator::CUDAAllocator& cuda_allocator() {
  return *static_cast<c10_allocator::CUDAAllocator*>(c10::GetAllocator(c10::kCUDA));
}

// The recorded history's allocations and frees as allocator events, ids
// counted from 0 in order and streams from 0 (the default stream) in the
// order they appear, as a trace's.
std::vector<metamem::AllocatorEvent> recorded_allocator_events() {
  using metamem::AllocatorEvent;
  using Entry = c10::CachingDeviceAllocator::TraceEntry;
  std::vector<AllocatorEvent> events;
  std::map<std::size_t, std::uint32_t> live;  // address: id
  std::map<void*, int> streams = {{nullptr, 0}};
  std::uint32_t allocations = 0;
  const c10_allocator::SnapshotInfo snapshot = cuda_allocator().snapshot({0, 0}, true);
  for (const Entry& entry : snapshot.device_traces.at(0)) {
    if (entry.action_ == Entry::ALLOC) {
      const int stream = streams.try_emplace(entry.stream_, static_cast<int>(streams.size())).first->second;
      live[entry.addr_] = allocations;
      events.push_back({AllocatorEvent::Kind::Alloc, allocations++, static_cast<std::int64_t>(entry.size_), stream});
    } else if (entry.action_ == Entry::FREE_REQUESTED) {
      events.push_back({AllocatorEvent::Kind::Free, live.at(entry.addr_)});
      live.erase(entry.addr_);
    }
  }
  return events;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace metamem;
  int code = 0;
  try {
    cli::ModelFlags m;
    cli::Flags flags;
    m.add_to(flags);
    std::string events;
    flags.add("--allocator-events", &events);
    if (const auto extra = flags.parse({argv + 1, argv + argc}); !extra.empty())
      throw cli::UsageError("unexpected argument '" + extra[0] + "'");
    if (m.device != "cuda") throw cli::UsageError("the fake GPU runs --device cuda");
    set_fake_gpu_device(m.gpu_spec());
    // Found in the torch wheel's folder, which this program's run path names.
    if (!dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_GLOBAL))
      throw std::runtime_error(std::string("libtorch_cuda.so: ") + dlerror());
    if (!events.empty()) {
      at::globalContext().lazyInitDevice(c10::kCUDA);  // the allocator made, to record its history
      cuda_allocator().recordHistory(true, nullptr, std::size_t{1} << 24, c10_allocator::RecordContext::NEVER, true,
                                     {});
    }
    const CudaStepPeaks peaks = achieved_cuda_step_peaks(m.builder(), m.step_options());
    if (!events.empty()) {
      std::ofstream out(events);
      write_allocator_events(out, recorded_allocator_events());
      if (!out.flush()) throw std::runtime_error("cannot write " + events);
    }
    std::cout << nlohmann::json{{"allocated", peaks.allocated}, {"reserved", peaks.reserved}}.dump() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "metamem-zoo-on-fake-gpu: " << e.what() << std::endl;
    code = 2;
  }
  // Without exit handlers, as the tests' Python children on the fake GPU
  // leave: torch's CUDA teardown races autograd's device threads
  // (pytorch/pytorch#38228), on a real GPU too.
  _exit(code);
}
