#include "estimator/AllocatorEvents.h"

#include <istream>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "estimator/CachingAllocator.h"

namespace metamem {
namespace {

constexpr const char* kHeader = "metamem allocator events 1";

}  // namespace

std::vector<AllocatorEvent> allocator_events(const Trace& trace) {
  std::vector<AllocatorEvent> events;
  events.reserve(trace.buffers.size() * 2 + 1);
  const std::size_t measured = trace.measured().begin;
  // The trace's events as an observer sees them.
  struct Recorder final : AllocationObserver {
    std::vector<AllocatorEvent>& events;
    std::unordered_set<std::uint32_t> restored;  // holders a pool restore gave blocks, whose allocations follow
    explicit Recorder(std::vector<AllocatorEvent>& to) : events(to) {}
    void on_alloc(std::uint32_t buffer, std::int64_t bytes, std::int64_t, int stream, int pool) override {
      if (restored.erase(buffer) != 0) return;
      // A private pool's request: routed there for it alone.
      if (pool != 0) events.push_back({AllocatorEvent::Kind::PoolBegin, 0, 0, stream, pool});
      events.push_back({AllocatorEvent::Kind::Alloc, buffer, bytes, stream});
      if (pool != 0) events.push_back({AllocatorEvent::Kind::PoolEnd, 0, 0, 0, pool});
    }
    void on_record_stream(std::uint32_t buffer, int stream) override {
      events.push_back({AllocatorEvent::Kind::RecordStream, buffer, 0, stream});
    }
    void on_free(std::uint32_t buffer) noexcept override { events.push_back({AllocatorEvent::Kind::Free, buffer}); }
    void on_allocator_call(const AllocatorCall& call) override {
      AllocatorEvent& event = events.emplace_back();
      switch (call.kind) {
        case AllocatorCall::Kind::EmptyCache: event.kind = AllocatorEvent::Kind::EmptyCache; break;
        case AllocatorCall::Kind::PoolCheckpoint:
          event.kind = AllocatorEvent::Kind::PoolCheckpoint;
          event.pool = call.pool;
          break;
        case AllocatorCall::Kind::PoolRestore:
          event.kind = AllocatorEvent::Kind::PoolRestore;
          event.id = call.checkpoint;
          event.held_by = call.held_by;
          event.buffers = call.buffers;
          restored.insert(call.buffers.begin(), call.buffers.end());
          break;
      }
    }
  } recorder(events);
  trace.replay(recorder, [&](std::size_t e) {
    if (e == measured) events.push_back({AllocatorEvent::Kind::ResetPeaks});
  });
  if (measured >= trace.events.size()) events.push_back({AllocatorEvent::Kind::ResetPeaks});
  return events;
}

void write_allocator_events(std::ostream& out, const std::vector<AllocatorEvent>& events) {
  out << kHeader << "\n";
  for (const AllocatorEvent& event : events) {
    switch (event.kind) {
      case AllocatorEvent::Kind::Alloc:
        out << "alloc " << event.id << " " << event.bytes;
        if (event.stream != 0) out << " " << event.stream;
        out << "\n";
        break;
      case AllocatorEvent::Kind::Free: out << "free " << event.id << "\n"; break;
      case AllocatorEvent::Kind::RecordStream:
        out << "record_stream " << event.id << " " << event.stream << "\n";
        break;
      case AllocatorEvent::Kind::ResetPeaks: out << "reset_peaks\n"; break;
      case AllocatorEvent::Kind::EmptyCache: out << "empty_cache\n"; break;
      case AllocatorEvent::Kind::PoolBegin:
        out << "pool_begin " << event.pool;
        if (event.stream != AllocatorEvent::kEveryStream) out << " " << event.stream;
        out << "\n";
        break;
      case AllocatorEvent::Kind::PoolEnd: out << "pool_end " << event.pool << "\n"; break;
      case AllocatorEvent::Kind::PoolRelease: out << "pool_release " << event.pool << "\n"; break;
      case AllocatorEvent::Kind::PoolCheckpoint: out << "pool_checkpoint " << event.pool << "\n"; break;
      case AllocatorEvent::Kind::PoolRestore:
        out << "pool_restore " << event.id;
        for (std::size_t i = 0; i < event.buffers.size(); ++i) out << " " << event.held_by[i] << ":" << event.buffers[i];
        out << "\n";
        break;
    }
  }
}

std::vector<AllocatorEvent> read_allocator_events(std::istream& in, const std::string& source) {
  std::vector<AllocatorEvent> events;
  std::unordered_set<std::uint32_t> live;
  // Private pools: their uses, and those routed to now.
  std::unordered_map<int, int> pool_uses;
  std::unordered_set<int> routed;
  std::uint32_t checkpoints = 0;
  std::string line;
  std::size_t number = 0;
  auto error = [&](const std::string& what) {
    return std::invalid_argument(source + ":" + std::to_string(number) + ": " + what);
  };
  if (!std::getline(in, line) || line != kHeader)
    throw std::invalid_argument(source + ": not a metamem allocator event list (its first line is not '" +
                                kHeader + "')");
  number = 1;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    std::istringstream fields(line);
    std::string kind;
    fields >> kind;
    AllocatorEvent event;
    auto read_stream = [&] {
      if (event.stream < 0 || event.stream >= kMaxStreams)
        throw error("streams are numbered 0 to " + std::to_string(kMaxStreams - 1) + ", got " +
                    std::to_string(event.stream));
    };
    if (kind == "alloc") {
      event.kind = AllocatorEvent::Kind::Alloc;
      if (!(fields >> event.id >> event.bytes) || event.bytes < 0)
        throw error("'alloc' needs an ID and a size in bytes");
      if (!(fields >> std::ws).eof() && !(fields >> event.stream)) throw error("'alloc' takes a stream number");
      read_stream();
      if (!live.insert(event.id).second) throw error("allocation " + std::to_string(event.id) + " is live");
    } else if (kind == "record_stream") {
      event.kind = AllocatorEvent::Kind::RecordStream;
      if (!(fields >> event.id >> event.stream)) throw error("'record_stream' needs an ID and a stream number");
      read_stream();
      if (!live.contains(event.id)) throw error("allocation " + std::to_string(event.id) + " is not live");
    } else if (kind == "free") {
      event.kind = AllocatorEvent::Kind::Free;
      if (!(fields >> event.id)) throw error("'free' needs an ID");
      if (live.erase(event.id) == 0) throw error("allocation " + std::to_string(event.id) + " is not live");
    } else if (kind == "reset_peaks") {
      event.kind = AllocatorEvent::Kind::ResetPeaks;
    } else if (kind == "empty_cache") {
      event.kind = AllocatorEvent::Kind::EmptyCache;
    } else if (kind == "pool_begin" || kind == "pool_end" || kind == "pool_release") {
      if (!(fields >> event.pool) || event.pool < 1) throw error("'" + kind + "' needs a pool number (1, 2, ...)");
      const std::string pool = "pool " + std::to_string(event.pool);
      const auto uses = pool_uses.find(event.pool);
      if (kind == "pool_begin") {
        event.kind = AllocatorEvent::Kind::PoolBegin;
        event.stream = AllocatorEvent::kEveryStream;
        if (!(fields >> std::ws).eof()) {
          if (!(fields >> event.stream)) throw error("'pool_begin' takes a stream number");
          read_stream();
        }
        if (uses != pool_uses.end() && uses->second == 0)
          throw error(pool + " was released; a new pool needs a new number");
        if (!routed.insert(event.pool).second) throw error("requests are already routed to " + pool);
        ++pool_uses[event.pool];
      } else if (kind == "pool_end") {
        event.kind = AllocatorEvent::Kind::PoolEnd;
        if (routed.erase(event.pool) == 0) throw error("requests are not routed to " + pool);
      } else {
        event.kind = AllocatorEvent::Kind::PoolRelease;
        if (uses == pool_uses.end() || uses->second == 0) throw error(pool + " has no use to release");
        if (routed.contains(event.pool)) throw error("requests are routed to " + pool + ": end that first");
        --uses->second;
      }
    } else if (kind == "pool_checkpoint") {
      event.kind = AllocatorEvent::Kind::PoolCheckpoint;
      if (!(fields >> event.pool) || event.pool < 1) throw error("'pool_checkpoint' needs a pool number (1, 2, ...)");
      const auto uses = pool_uses.find(event.pool);
      if (uses == pool_uses.end() || uses->second == 0)
        throw error("pool " + std::to_string(event.pool) + " has no use: c10 checkpoints only a pool in use");
      ++checkpoints;
    } else if (kind == "pool_restore") {
      event.kind = AllocatorEvent::Kind::PoolRestore;
      if (!(fields >> event.id) || event.id >= checkpoints)
        throw error("'pool_restore' needs the number of a checkpoint taken before");
      // Allocations the restore frees without giving their blocks back
      // are not known here: a later free of one frees nothing.
      for (std::string pair; fields >> pair;) {
        const std::size_t colon = pair.find(':');
        std::size_t held_end = 0, id_end = 0;
        try {
          if (colon == std::string::npos) throw std::invalid_argument(pair);
          event.held_by.push_back(static_cast<std::uint32_t>(std::stoul(pair.substr(0, colon), &held_end)));
          event.buffers.push_back(static_cast<std::uint32_t>(std::stoul(pair.substr(colon + 1), &id_end)));
        } catch (const std::logic_error&) {
          throw error("'pool_restore' takes pairs HELD:ID, got '" + pair + "'");
        }
        if (held_end != colon || id_end != pair.size() - colon - 1)
          throw error("'pool_restore' takes pairs HELD:ID, got '" + pair + "'");
        live.insert(event.buffers.back());
      }
    } else {
      throw error("unknown event '" + kind + "'");
    }
    std::string extra;
    if (fields >> extra) throw error("unexpected '" + extra + "'");
    events.push_back(event);
  }
  return events;
}

void apply(CachingAllocatorSim& sim, const AllocatorEvent& event) {
  switch (event.kind) {
    case AllocatorEvent::Kind::Alloc: sim.malloc(event.id, event.bytes, event.stream); break;
    case AllocatorEvent::Kind::Free: sim.free(event.id); break;
    case AllocatorEvent::Kind::RecordStream: sim.record_stream(event.id, event.stream); break;
    case AllocatorEvent::Kind::ResetPeaks: sim.reset_peaks(); break;
    case AllocatorEvent::Kind::EmptyCache: sim.empty_cache(); break;
    case AllocatorEvent::Kind::PoolBegin:
      sim.begin_allocate_to_pool(event.pool, event.stream == AllocatorEvent::kEveryStream
                                                 ? std::nullopt
                                                 : std::optional<int>(event.stream));
      break;
    case AllocatorEvent::Kind::PoolEnd: sim.end_allocate_to_pool(event.pool); break;
    case AllocatorEvent::Kind::PoolRelease: sim.release_pool(event.pool); break;
    case AllocatorEvent::Kind::PoolCheckpoint:
    case AllocatorEvent::Kind::PoolRestore: {
      AllocatorCall call;
      call.kind = event.kind == AllocatorEvent::Kind::PoolCheckpoint ? AllocatorCall::Kind::PoolCheckpoint
                                                                      : AllocatorCall::Kind::PoolRestore;
      call.pool = event.pool;
      call.checkpoint = event.id;
      call.held_by = event.held_by;
      call.buffers = event.buffers;
      sim.on_allocator_call(call);
      break;
    }
  }
}

}  // namespace metamem
