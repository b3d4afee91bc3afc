#include "estimator/Snapshot.h"

#include <vector>

#include "estimator/CachingAllocator.h"
#include "estimator/Pickle.h"

namespace metamem {
namespace {

struct TraceEntry {
  CachingAllocatorSim::Action action;
  std::int64_t time;
  std::int32_t op;  // producing op of the buffer, or -1
};

void write_frames(PickleWriter& w, const Trace& trace, std::int32_t op) {
  w.begin_list();
  if (op >= 0) {
    w.begin_dict();
    w.string("filename");
    w.string(trace.scopes[trace.ops[op].scope]);
    w.string("line");
    w.integer(0);
    w.string("name");
    w.string(trace.op_name(trace.ops[op]));
    w.end_dict();
  }
  w.end_list();
}

}  // namespace

std::string memory_snapshot_pickle(const Trace& trace, const AllocatorSetup& allocator) {
  CachingAllocatorSim sim(allocator);
  std::vector<TraceEntry> entries;
  std::int64_t now = 0;
  std::int32_t op = -1;
  sim.set_listener([&](const CachingAllocatorSim::Action& a) { entries.push_back({a, now, op}); });
  trace.replay(sim, [&](std::size_t e) {
    now = static_cast<std::int64_t>(e);
    const Event& event = trace.events[e];
    op = event.kind == EventKind::Op ? -1 : trace.buffers[event.index].producer_op;
  });

  PickleWriter w;
  w.begin_dict();
  w.string("segments");
  w.begin_list();
  for (const auto& segment : sim.snapshot_segments()) {
    const std::int64_t base = segment.address, size = segment.size, allocated = segment.allocated;
    w.begin_dict();
    for (auto [key, value] : {std::pair<const char*, std::int64_t>{"device", 0}, {"address", base},
                              {"total_size", size}, {"allocated_size", allocated},
                              {"active_size", segment.active}, {"requested_size", allocated},
                              {"stream", segment.stream}}) {
      w.string(key);
      w.integer(value);
    }
    w.string("is_expandable");
    w.boolean(segment.expandable);
    w.string("segment_type");
    w.string(segment.small_pool ? "small" : "large");
    w.string("blocks");
    w.begin_list();
    for (auto it = sim.blocks().lower_bound(base); it != sim.blocks().end() && it->first < base + size; ++it) {
      w.begin_dict();
      w.string("address");
      w.integer(it->first);
      w.string("size");
      w.integer(it->second.size);
      w.string("requested_size");
      w.integer(it->second.size);
      w.string("state");
      w.string(it->second.state());
      w.string("frames");
      w.begin_list();
      w.end_list();
      w.end_dict();
    }
    w.end_list();
    w.end_dict();
  }
  w.end_list();

  w.string("device_traces");
  w.begin_list();
  w.begin_list();
  for (const TraceEntry& entry : entries) {
    w.begin_dict();
    w.string("action");
    w.string(entry.action.action);
    for (auto [key, value] : {std::pair<const char*, std::int64_t>{"addr", entry.action.address},
                              {"size", entry.action.size}, {"stream", entry.action.stream},
                              {"time_us", entry.time}}) {
      w.string(key);
      w.integer(value);
    }
    w.string("frames");
    write_frames(w, trace, entry.op);
    w.end_dict();
  }
  w.end_list();
  w.end_list();
  w.end_dict();
  return w.finish();
}

}  // namespace metamem
