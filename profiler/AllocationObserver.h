// What a tracer tells about allocations as it records them, and observers
// that stop a trace whose step cannot fit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace metamem {

// Thrown to stop a trace whose step needs more memory than there is:
// whoever only asks whether a step fits needs no more of one that cannot.
class MemoryExceeded : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What the traced code asked of the CUDA caching allocator itself, besides
// allocations and frees, before event `event` of its trace.
struct AllocatorCall {
  enum class Kind : std::uint8_t {
    EmptyCache,      // torch.cuda.empty_cache(): cached segments go back to the GPU
    // A CUDA graph tree keeps private pool `pool`'s layout after a recording
    // (c10's getCheckpointState). Checkpoints are numbered from 0 in order:
    // each allocator that replays the trace keeps its own.
    PoolCheckpoint,
    // The tree returns that pool to checkpoint `checkpoint` (c10's
    // setCheckpointPoolState): every block it holds is freed, and the block
    // buffer held_by[i] held at the checkpoint is held by buffers[i] from
    // here on. A buffer among them that the trace allocates after this call
    // holds its block from here, without allocating.
    PoolRestore,
  };
  Kind kind = Kind::EmptyCache;
  std::size_t event = 0;  // the first event after it (the trace's length: after the last)
  int pool = 0;
  std::uint32_t checkpoint = 0;
  std::vector<std::uint32_t> held_by, buffers;
};

// Sees every allocation and free a tracer records, in order, by the
// buffer's index in the trace, with the live bytes after an allocation,
// the CUDA stream it is on (0: the default) and the caching allocator's
// pool that serves it (0: the device's own; else a CUDA graph's private
// pool). It may throw on an allocation to stop the trace, never on a free:
// frees run in tensors' destructors.
class AllocationObserver {
 public:
  virtual ~AllocationObserver() = default;
  virtual void on_alloc(std::uint32_t buffer, std::int64_t bytes, std::int64_t live_bytes, int stream,
                        int pool) = 0;
  virtual void on_free(std::uint32_t buffer) noexcept = 0;
  // Tensor.record_stream(): the buffer is used on `stream` too.
  virtual void on_record_stream(std::uint32_t buffer, int stream) {}
  virtual void on_allocator_call(const AllocatorCall& call) {}
  // Of requests of `sizes` bytes on `stream` from `pool`, tried in turn
  // (MetaObserver::first_granted), the index of the first the allocator
  // grants; nullopt where none. One that never runs short grants the first.
  virtual std::optional<std::size_t> first_granted(const std::vector<std::int64_t>& sizes, int stream, int pool) {
    return 0;
  }
};

// Throws MemoryExceeded once the live bytes pass `limit`.
class LiveBytesLimit final : public AllocationObserver {
 public:
  explicit LiveBytesLimit(std::int64_t limit) : limit_(limit) {}
  void on_alloc(std::uint32_t, std::int64_t, std::int64_t live_bytes, int, int) override {
    if (live_bytes > limit_)
      throw MemoryExceeded("the traced step holds more than " + std::to_string(limit_) + " bytes");
  }
  void on_free(std::uint32_t) noexcept override {}

 private:
  std::int64_t limit_;
};

}  // namespace metamem
