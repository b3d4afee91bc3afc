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
    explicit Recorder(std::vector<AllocatorEvent>& to) : events(to) {}
    void on_alloc(std::uint32_t buffer, std::int64_t bytes, std::int64_t, int stream, int pool) override {
      // A private pool's request: routed there for it alone.
      if (pool != 0) events.push_back({AllocatorEvent::Kind::PoolBegin, 0, 0, stream, pool});
      events.push_back({AllocatorEvent::Kind::Alloc, buffer, bytes, stream});
      if (pool != 0) events.push_back({AllocatorEvent::Kind::PoolEnd, 0, 0, 0, pool});
    }
    void on_record_stream(std::uint32_t buffer, int stream) override {
      events.push_back({AllocatorEvent::Kind::RecordStream, buffer, 0, stream});
    }
    void on_free(std::uint32_t buffer) noexcept override { events.push_back({AllocatorEvent::Kind::Free, buffer}); }
  } recorder(events);
  auto empty_cache = trace.empty_caches.begin();
  auto empty_caches_at = [&](std::size_t e) {
    for (; empty_cache != trace.empty_caches.end() && *empty_cache == e; ++empty_cache)
      events.push_back({AllocatorEvent::Kind::EmptyCache});
  };
  for (std::size_t e = 0; e < trace.events.size(); ++e) {
    if (e == measured) events.push_back({AllocatorEvent::Kind::ResetPeaks});
    empty_caches_at(e);
    trace.tell(trace.events[e], recorder);
  }
  empty_caches_at(trace.events.size());
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
    }
  }
}

std::vector<AllocatorEvent> read_allocator_events(std::istream& in, const std::string& source) {
  std::vector<AllocatorEvent> events;
  std::unordered_set<std::uint32_t> live;
  // Private pools: their uses, and those routed to now.
  std::unordered_map<int, int> pool_uses;
  std::unordered_set<int> routed;
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
  }
}

}  // namespace metamem
