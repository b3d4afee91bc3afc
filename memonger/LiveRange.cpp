#include "memonger/LiveRange.h"

#include <limits>
#include <unordered_set>

namespace memonger {

const char* invalid_reason(const LiveRange& r) {
  if (r.bytes < 0) return "negative bytes";
  if (r.last < r.first) return "last step before first step";
  // Planners count the step after a range's last.
  if (r.last == std::numeric_limits<std::int64_t>::max()) return "last step is 2^63-1 (the largest is 2^63-2)";
  return nullptr;
}

Problem::Problem(std::vector<LiveRange> ranges, std::int64_t alignment)
    : ranges_(std::move(ranges)), alignment_(alignment) {
  if (alignment < 1) throw InputError("alignment must be at least 1");
  std::unordered_set<std::int64_t> ids;
  aligned_.reserve(ranges_.size());
  // Every offset of a plan is at most the sum of all sizes: where that sum
  // fits in 64 bits, no planner's arithmetic overflows.
  std::int64_t total = 0, rounded = 0;
  for (const LiveRange& r : ranges_) {
    const std::string name = "range " + std::to_string(r.id);
    if (const char* reason = invalid_reason(r)) throw InputError(name + ": " + reason);
    if (!ids.insert(r.id).second) throw InputError(name + ": duplicate id");
    if (__builtin_add_overflow(r.bytes, alignment - 1, &rounded))
      throw InputError(name + ": its bytes rounded up to the alignment do not fit in 64 bits");
    aligned_.push_back(rounded / alignment * alignment);
    if (__builtin_add_overflow(total, aligned_.back(), &total))
      throw InputError("the ranges' bytes add up to more than 2^63-1: no plan's offsets would fit in 64 bits");
  }
}

}  // namespace memonger
