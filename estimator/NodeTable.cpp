#include "estimator/NodeTable.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>

namespace metamem {
namespace {

// The events an op owns: from just after the previous op event to its own.
struct OpSpan {
  std::int64_t live_before = 0, peak = 0, live_after = 0;
  std::size_t op_event = 0;
};

std::vector<OpSpan> op_spans(const Trace& trace) {
  std::vector<OpSpan> spans(trace.ops.size());
  const std::int64_t live = trace.measured().begin_bytes;
  OpSpan current{live, live, live, 0};
  for (std::size_t e = trace.measured().begin; e < trace.events.size(); ++e) {
    const Event& event = trace.events[e];
    current.peak = std::max(current.peak, event.live_bytes);
    if (event.kind != EventKind::Op) continue;
    current.op_event = e;
    current.live_after = event.live_bytes;
    spans[event.index] = current;
    current = {event.live_bytes, event.live_bytes, event.live_bytes, 0};
  }
  return spans;
}

std::string short_name(const std::string& op) {
  std::string name = op.substr(op.find("::") == std::string::npos ? 0 : op.find("::") + 2);
  std::replace(name.begin(), name.end(), '.', '_');
  return name;
}

// The first op whose event is `event` or later: the op that was running then.
std::size_t op_at_or_after(const Trace& trace, std::size_t event) {
  for (std::size_t e = event; e < trace.events.size(); ++e)
    if (trace.events[e].kind == EventKind::Op) return trace.events[e].index;
  return trace.ops.size();
}

}  // namespace

std::string module_prefix(const std::string& path, int depth) {
  std::size_t pos = 0;
  for (int d = 0; d < depth; ++d) {
    const std::size_t dot = path.find('.', pos);
    if (dot == std::string::npos) return path;
    pos = dot + 1;
  }
  return path.substr(0, pos == 0 ? 0 : pos - 1);
}

NodeTable node_table(const Trace& trace) {
  const std::vector<OpSpan> spans = op_spans(trace);
  const std::size_t first_op = op_at_or_after(trace, trace.measured().begin);
  const std::size_t peak_op = op_at_or_after(trace, trace.measured().peak_event);

  NodeTable table;
  std::unordered_map<std::int64_t, std::size_t> row_of_node;  // autograd node -> forward row
  std::unordered_set<std::uint32_t> saved_inputs_seen;
  std::unordered_map<std::int64_t, std::size_t> backward_row;  // node -> row of orphan backward ops

  // Live bytes before each row's first backward op: its temporaries' base.
  std::vector<std::int64_t> backward_base;
  auto new_row = [&](std::size_t i) {
    const OpEvent& op = trace.ops[i];
    NodeRow row;
    row.op = trace.op_name(op);
    row.name = short_name(row.op) + "_" + std::to_string(i);
    row.module = trace.scopes[op.scope];
    row.phase = op.phase;
    row.live_before = spans[i].live_before;
    row.peak = spans[i].peak;
    row.accumulated = spans[i].live_after;
    table.rows.push_back(row);
    backward_base.push_back(-1);
    return table.rows.size() - 1;
  };

  for (std::size_t i = first_op; i < trace.ops.size(); ++i) {
    const OpEvent& op = trace.ops[i];
    std::size_t row_index;
    if (op.phase == Phase::Forward || op.phase == Phase::Recompute) {
      row_index = new_row(i);
      NodeRow& row = table.rows[row_index];
      (op.phase == Phase::Forward ? row.fwd_flops : row.recompute_flops) = op.flops;
      for (std::uint32_t b : trace.outputs(op)) {
        const Buffer& buffer = trace.buffers[b];
        if (buffer.producer_op != static_cast<std::int32_t>(i)) continue;
        row.fwd_out += buffer.bytes;
        if (buffer.saved_for_backward()) row.fwd_tmp += buffer.bytes;
      }
      for (std::uint32_t b : trace.inputs(op)) {
        const Buffer& buffer = trace.buffers[b];
        if (buffer.saved_for_backward() && buffer.producer_op != static_cast<std::int32_t>(i) &&
            saved_inputs_seen.insert(b).second)
          row.fwd_in += buffer.bytes;
      }
      if (op.node >= 0) row_of_node.try_emplace(op.node, row_index);
    } else {
      auto forward = op.phase == Phase::Backward ? row_of_node.find(op.node) : row_of_node.end();
      if (forward != row_of_node.end()) {
        row_index = forward->second;
      } else {
        auto orphan = op.node >= 0 ? backward_row.find(op.node) : backward_row.end();
        if (orphan != backward_row.end()) {
          row_index = orphan->second;
        } else {
          row_index = new_row(i);
          if (op.node >= 0) backward_row.emplace(op.node, row_index);
        }
      }
      NodeRow& row = table.rows[row_index];
      if (backward_base[row_index] < 0) backward_base[row_index] = spans[i].live_before;
      row.bwd_flops += op.flops;
      row.peak = std::max(row.peak, spans[i].peak);
      row.bwd_tmp = std::max(row.bwd_tmp, spans[i].peak - backward_base[row_index]);
      for (std::uint32_t b : trace.outputs(op)) {
        const Buffer& buffer = trace.buffers[b];
        if (buffer.producer_op == static_cast<std::int32_t>(i) && buffer.free_event > spans[i].op_event)
          row.bwd_out += buffer.bytes;
      }
    }
    if (i == peak_op) {
      table.peak_row = row_index;
      table.peak_phase = op.phase;
    }
  }
  return table;
}

std::vector<NodeRow> module_table(const NodeTable& table, int depth) {
  std::vector<NodeRow> modules;
  std::map<std::string, std::size_t> index;
  for (const NodeRow& row : table.rows) {
    const std::string key = module_prefix(row.module, depth);
    auto [it, added] = index.try_emplace(key, modules.size());
    if (added) {
      NodeRow m;
      m.name = key.empty() ? "(no module)" : key;
      m.module = key;
      m.phase = row.phase;
      m.live_before = row.live_before;
      modules.push_back(m);
    }
    NodeRow& m = modules[it->second];
    m.fwd_flops += row.fwd_flops;
    m.bwd_flops += row.bwd_flops;
    m.recompute_flops += row.recompute_flops;
    m.fwd_in += row.fwd_in;
    m.fwd_tmp += row.fwd_tmp;
    m.fwd_out += row.fwd_out;
    m.bwd_out += row.bwd_out;
    m.bwd_tmp = std::max(m.bwd_tmp, row.bwd_tmp);
    m.peak = std::max(m.peak, row.peak);
    m.accumulated = row.accumulated;
  }
  return modules;
}

}  // namespace metamem
