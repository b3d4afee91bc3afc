// Per-node memory of a traced step (ColossalAI's model, made exact), and
// the same summed by module.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "profiler/Trace.h"

namespace metamem {

// One forward op with the backward ops of the autograd node it made; one
// op a checkpointed segment's recomputation ran, with the backward of the
// node it made there; or a backward or optimizer op that neither accounts for.
struct NodeRow {
  std::string name;    // "<op>_<index>", unique
  std::string op;      // aten::addmm
  std::string module;  // ResNet.layer1.0.conv1
  Phase phase = Phase::Forward;
  std::int64_t fwd_flops = 0, bwd_flops = 0, recompute_flops = 0;
  std::int64_t fwd_in = 0;   // its inputs that autograd saves (each buffer at its first reader)
  std::int64_t fwd_tmp = 0;  // buffers it makes that autograd saves
  std::int64_t fwd_out = 0;  // buffers it makes
  std::int64_t bwd_tmp = 0;  // peak of its backward above the live bytes before it
  std::int64_t bwd_out = 0;  // buffers its backward makes that outlive it (gradients)
  std::int64_t live_before = 0;  // live bytes before the node's first event
  std::int64_t peak = 0;         // largest live bytes while any of its ops ran
  std::int64_t accumulated = 0;  // live bytes after its forward (or only) part
};

struct NodeTable {
  std::vector<NodeRow> rows;  // in execution order of their first op
  std::size_t peak_row = 0;   // the row whose op reached the step's peak
  Phase peak_phase = Phase::Forward;  // the phase of that op
};

// Rows for every op of the measured step.
NodeTable node_table(const Trace& trace);

// "ResNet.layer1.0.conv1" at depth 2 is "ResNet.layer1".
std::string module_prefix(const std::string& path, int depth);

// Rows summed by module path cut to `depth` components ("ResNet.layer1" at
// depth 2); bwd_tmp and peak take the largest, the rest add up.
std::vector<NodeRow> module_table(const NodeTable& table, int depth);

}  // namespace metamem
