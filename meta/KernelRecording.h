// A real kernel's call as it was recorded: the blocks it made and freed, in
// order, where it emptied the allocator's cache, and where its returns lie.
// Real torch on the fake GPU records cuDNN's calls
// (estimator/FakeGpuRecordings.h); a CPU trace records oneDNN's RNN layer
// on the CPU itself (meta/OneDnnRnn.cpp). A trace follows
// the plan made of it (plan_of): each return made where its block was, each
// temporary made and freed in its place.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meta/CpuKernelModel.h"

namespace metamem {

struct KernelRecording {
  struct Event {
    // EmptyCache: the caching allocator gave its cached segments back (cuDNN's
    // benchmark, after its search for the fastest engine).
    enum class Kind : std::uint8_t { Alloc, Free, EmptyCache };
    Kind kind = Kind::Alloc;
    std::int64_t address = 0;
    std::int64_t bytes = 0;
  };
  std::vector<Event> events;
  // Each return's address, or each of a list's (cuDNN's RNN weight
  // gradients); 0 for an undefined one.
  std::vector<std::vector<std::int64_t>> returns;
  // Each return's sizes and strides as the kernel made them.
  std::vector<std::vector<std::int64_t>> sizes, strides;
};

// The plan of `call`: a list return is made as one step, where its first
// block is; a block kept that no return holds becomes a cuBLAS call (its
// workspace, kept by the handle). Throws std::runtime_error, naming
// `recorder` ("the fake GPU's recording"), where the call frees a block it
// did not make.
ScratchPlan plan_of(const KernelRecording& call, const std::string& recorder);

}  // namespace metamem
