#include "meta/KernelRecording.h"

#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace metamem {

ScratchPlan plan_of(const KernelRecording& call, const std::string& recorder) {
  std::unordered_map<std::int64_t, std::size_t> returns;
  for (std::size_t r = 0; r < call.returns.size(); ++r)
    for (const std::int64_t address : call.returns[r])
      if (address != 0) returns[address] = r;
  // Kept: made and not freed inside the call.
  const auto& events = call.events;
  std::vector<bool> kept(events.size());
  std::unordered_set<std::int64_t> freed;
  using Kind = KernelRecording::Event::Kind;
  for (std::size_t i = events.size(); i-- > 0;) {
    if (events[i].kind == Kind::Alloc) {
      kept[i] = !freed.contains(events[i].address);
      freed.erase(events[i].address);
    } else if (events[i].kind == Kind::Free) {
      freed.insert(events[i].address);
    }
  }
  ScratchPlan plan;
  plan.recorded = true;
  plan.return_sizes = call.sizes;
  plan.return_strides = call.strides;
  std::unordered_map<std::int64_t, std::size_t> pieces;
  std::unordered_set<std::size_t> placed;
  for (std::size_t i = 0; i < events.size(); ++i) {
    const std::int64_t address = events[i].address;
    if (events[i].kind == Kind::EmptyCache) {
      plan.empty_cache();
    } else if (events[i].kind == Kind::Free) {
      const auto piece = pieces.find(address);
      if (piece == pieces.end()) throw std::runtime_error("metamem: " + recorder + " frees a block it did not make");
      plan.free(piece->second);
      pieces.erase(piece);
    } else if (const auto r = returns.find(address); kept[i] && r != returns.end()) {
      if (placed.insert(r->second).second) plan.output(r->second);
      returns.erase(r);
    } else if (kept[i]) {
      plan.cublas_call();
    } else {
      pieces[address] = plan.make(events[i].bytes);
    }
  }
  return plan;
}

}  // namespace metamem
