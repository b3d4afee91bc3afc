// CPU kernels whose memory only the library that runs them knows (internal
// to meta/): oneDNN's RNN layer, which torch 2.14's CPU LSTM runs while
// oneDNN is on, every convolution torch gives to oneDNN or NNPACK rather
// than to its native kernels (meta/CpuLayerModel.cpp), the bf16 and f16
// matrix products it may give to oneDNN's matmul and the GELUs to
// oneDNN's eltwise kernel. What they
// hold (workspaces, weights and inputs reordered into oneDNN's layouts,
// scratchpads) is chosen for this CPU and its threads, and libtorch hides
// those libraries' symbols: a CPU trace runs the real kernel once per
// distinct call, on zeros laid out as the trace's arguments, records what
// it allocates through the CPU allocator, and follows that (a plan:
// meta/KernelRecording.h). A recording hears the calling thread only,
// where these kernels allocate (not their OpenMP workers).
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <string>

#include "meta/CpuKernelModel.h"

namespace metamem {

// Whether a call (its arguments the caller's MetaTensors) runs such a kernel.
using RecordedCpuCall = bool (*)(c10::ArrayRef<c10::IValue> arguments);

// The test of op `qualified_name` ("aten::convolution"), or nullptr where
// it never runs one: oneDNN's RNN layer always does; a convolution or its
// backward where torch picks neither of its native kernels for it, under
// the process's flags; a matrix product or GELU where torch may pick
// oneDNN's kernel.
RecordedCpuCall recorded_cpu_call(const std::string& qualified_name);

// The plan of such a call of `op` for `arguments` (the caller's
// MetaTensors), recorded at its first such call in the process. Real
// torch's error, where the kernel refuses the call, is raised.
ScratchPlan recorded_cpu_plan(const std::string& op, c10::ArrayRef<c10::IValue> arguments);

}  // namespace metamem
