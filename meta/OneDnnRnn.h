// oneDNN's RNN layer, which torch 2.14's CPU LSTM runs while oneDNN is on
// (aten::mkldnn_rnn_layer and its backward; internal to meta/). What it
// holds (its workspace, the weights reordered for oneDNN, a scratchpad)
// only oneDNN knows, for this CPU and its threads, and libtorch hides its
// symbols: a CPU trace runs the real layer once per distinct call, on
// zeros laid out as the trace's arguments, records what it allocates
// through the CPU allocator, and follows that.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <string>
#include <vector>

#include "meta/CpuKernelModel.h"

namespace metamem {

// The ops a CPU trace takes from such recordings.
const std::vector<std::string>& onednn_recorded_ops();

// The plan of `op` (one of onednn_recorded_ops()) for `arguments` (the
// caller's MetaTensors), recorded at its first such call in the process.
// Real torch's error, where the layer refuses the call, is raised.
ScratchPlan onednn_rnn_plan(const std::string& op, c10::ArrayRef<c10::IValue> arguments);

}  // namespace metamem
