#include "memonger/LiveRange.h"

#include <unordered_set>

namespace memonger {

const char* invalid_reason(const LiveRange& r) {
  if (r.bytes < 0) return "negative bytes";
  if (r.last < r.first) return "last step before first step";
  return nullptr;
}

Problem::Problem(std::vector<LiveRange> ranges, std::int64_t alignment)
    : ranges_(std::move(ranges)), alignment_(alignment) {
  if (alignment < 1) throw InputError("alignment must be at least 1");
  std::unordered_set<std::int64_t> ids;
  aligned_.reserve(ranges_.size());
  for (const LiveRange& r : ranges_) {
    const std::string name = "range " + std::to_string(r.id);
    if (const char* reason = invalid_reason(r)) throw InputError(name + ": " + reason);
    if (!ids.insert(r.id).second) throw InputError(name + ": duplicate id");
    aligned_.push_back((r.bytes + alignment - 1) / alignment * alignment);
  }
}

}  // namespace memonger
