// Caffe2's memonger model: tensors share whole buffers.
#include <algorithm>
#include <numeric>
#include <optional>

#include "memonger/Placement.h"

namespace memonger {
namespace {

struct SharedBuffer {
  std::int64_t bytes = 0;
  std::vector<std::size_t> members;
};

bool fits_in_time(const Problem& p, const SharedBuffer& buffer, std::size_t item) {
  return std::none_of(buffer.members.begin(), buffer.members.end(), [&](std::size_t m) {
    return overlap_in_time(p.ranges()[m], p.ranges()[item]);
  });
}

Placement lay_out(const Items& items, const std::vector<SharedBuffer>& buffers) {
  std::vector<std::int64_t> offset_of(items.empty() ? 0 : *std::max_element(items.begin(), items.end()) + 1);
  Placement placement;
  for (const SharedBuffer& buffer : buffers) {
    for (std::size_t m : buffer.members) offset_of[m] = placement.height;
    placement.height += buffer.bytes;
  }
  for (std::size_t i : items) placement.offsets.push_back(offset_of[i]);
  placement.buffers = static_cast<std::int64_t>(buffers.size());
  return placement;
}

template <typename Less>
Items by(const Items& items, Less less) {
  Items order = items;
  std::stable_sort(order.begin(), order.end(), less);
  return order;
}

// In order of definition, each range takes a buffer free by then: the
// smallest one that holds it, else the largest one (which grows).
std::vector<SharedBuffer> greedy_buffers(const Problem& p, const Items& items) {
  const auto& r = p.ranges();
  std::vector<SharedBuffer> buffers;
  std::vector<std::int64_t> free_after;  // last step of each buffer's latest member
  for (std::size_t i : by(items, [&](auto a, auto b) { return r[a].first < r[b].first; })) {
    std::ptrdiff_t chosen = -1;
    for (std::size_t b = 0; b < buffers.size(); ++b) {
      if (free_after[b] >= r[i].first) continue;
      if (chosen < 0) {
        chosen = static_cast<std::ptrdiff_t>(b);
        continue;
      }
      const std::int64_t have = buffers[chosen].bytes, candidate = buffers[b].bytes;
      const bool have_fits = have >= p.bytes(i), candidate_fits = candidate >= p.bytes(i);
      if (candidate_fits ? (!have_fits || candidate < have) : (!have_fits && candidate > have))
        chosen = static_cast<std::ptrdiff_t>(b);
    }
    if (chosen < 0) {
      chosen = static_cast<std::ptrdiff_t>(buffers.size());
      buffers.emplace_back();
      free_after.push_back(0);
    }
    buffers[chosen].bytes = std::max(buffers[chosen].bytes, p.bytes(i));
    buffers[chosen].members.push_back(i);
    free_after[chosen] = r[i].last;
  }
  return buffers;
}

// Ranges go largest first, so a new buffer costs its first member and
// joining an existing one costs nothing.
class BranchAndBound {
 public:
  BranchAndBound(const Problem& p, const Items& items, std::int64_t node_limit)
      : p_(p),
        order_(by(items, [&](auto a, auto b) { return p.bytes(a) > p.bytes(b); })),
        bound_(items_lower_bound(p, items)),
        node_limit_(node_limit) {}

  std::vector<SharedBuffer> solve(std::vector<SharedBuffer> incumbent) {
    best_ = std::move(incumbent);
    best_cost_ = cost(best_);
    if (best_cost_ > bound_) search();
    return best_;
  }

 private:
  static std::int64_t cost(const std::vector<SharedBuffer>& buffers) {
    return std::accumulate(buffers.begin(), buffers.end(), std::int64_t{0},
                           [](std::int64_t sum, const SharedBuffer& b) { return sum + b.bytes; });
  }

  // One level per range in order: the buffers it may join, tried in turn,
  // then a buffer of its own. The levels live on the heap: the depth is the
  // number of ranges.
  struct Level {
    std::size_t next = 0;   // the next buffer to try; current_.size(): a new one
    std::int64_t cost = 0;  // of the buffers before this level's range came
    enum { kOut, kJoined, kOwnBuffer } range = kOut;
  };

  // Depth first; stops once a plan at the lower bound is found (nothing
  // beats it).
  void search() {
    std::vector<Level> levels;
    std::int64_t cost_so_far = 0;
    for (;;) {
      // A node: the first levels.size() ranges are placed.
      if (++nodes_ > node_limit_)
        throw PlanLimitError("dp: gave up after " + std::to_string(node_limit_) + " search nodes on " +
                             std::to_string(order_.size()) + " ranges; use greedy or bestfit");
      if (std::max(cost_so_far, bound_) < best_cost_) {
        if (levels.size() < order_.size()) {
          levels.push_back({0, cost_so_far});
        } else {
          best_ = current_;
          best_cost_ = cost_so_far;
          if (best_cost_ <= bound_) return;
        }
      }
      // The next node: the deepest level with a choice left takes it.
      std::optional<std::int64_t> next_cost;
      while (!levels.empty() && !(next_cost = take_next(levels.back(), order_[levels.size() - 1])))
        levels.pop_back();
      if (!next_cost) return;
      cost_so_far = *next_cost;
    }
  }

  // Moves the level's range from its last choice to its next one and
  // returns the cost then; none when no choice is left.
  std::optional<std::int64_t> take_next(Level& level, std::size_t item) {
    if (level.range == Level::kOwnBuffer) current_.pop_back();
    if (level.range == Level::kJoined) current_[level.next - 1].members.pop_back();
    level.range = Level::kOut;
    while (level.next < current_.size() && !fits_in_time(p_, current_[level.next], item)) ++level.next;
    if (level.next > current_.size()) return std::nullopt;
    if (level.next++ == current_.size()) {
      current_.push_back({p_.bytes(item), {item}});
      level.range = Level::kOwnBuffer;
      return level.cost + p_.bytes(item);
    }
    current_[level.next - 1].members.push_back(item);
    level.range = Level::kJoined;
    return level.cost;
  }

  const Problem& p_;
  const Items order_;
  const std::int64_t bound_;
  const std::int64_t node_limit_;
  std::int64_t nodes_ = 0;
  std::vector<SharedBuffer> current_, best_;
  std::int64_t best_cost_ = 0;
};

}  // namespace

Placement shared_greedy(const Problem& p, const Items& items) {
  return lay_out(items, greedy_buffers(p, items));
}

Placement shared_optimal(const Problem& p, const Items& items, std::int64_t node_limit) {
  return lay_out(items, BranchAndBound(p, items, node_limit).solve(greedy_buffers(p, items)));
}

}  // namespace memonger
