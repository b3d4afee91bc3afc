// A tensor's lifetime and size: the input of every memonger planner.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace memonger {

// Alive from step `first` to step `last`, both included (Caffe2's rule: a
// range made at step t cannot reuse memory whose last use is step t).
struct LiveRange {
  std::int64_t id = 0;
  std::int64_t first = 0;
  std::int64_t last = 0;
  std::int64_t bytes = 0;
  bool pinned = false;  // parameters, inputs: never shares memory
};

inline bool overlap_in_time(const LiveRange& a, const LiveRange& b) {
  return a.first <= b.last && b.first <= a.last;
}

// Why a range is invalid (negative bytes, last before first), or nullptr.
const char* invalid_reason(const LiveRange& r);

// Bad input: a message a user can act on.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The ranges to plan, each size rounded up to `alignment` bytes.
class Problem {
 public:
  // Throws InputError for negative bytes, last < first, duplicate ids or an
  // alignment below 1.
  explicit Problem(std::vector<LiveRange> ranges, std::int64_t alignment = 1);

  const std::vector<LiveRange>& ranges() const { return ranges_; }
  std::size_t size() const { return ranges_.size(); }
  std::int64_t alignment() const { return alignment_; }
  // Bytes range `i` occupies in a plan.
  std::int64_t bytes(std::size_t i) const { return aligned_[i]; }

 private:
  std::vector<LiveRange> ranges_;
  std::vector<std::int64_t> aligned_;
  std::int64_t alignment_;
};

}  // namespace memonger
