// Arena planning: every range gets a byte offset (TFLite's greedy by size,
// XLA's GlobalDecreasingSizeBestFitHeap), improved by packing into a fixed
// height from both ends.
#include <algorithm>
#include <array>
#include <stdexcept>
#include <limits>
#include <map>
#include <optional>
#include <queue>
#include <set>

#include "memonger/Placement.h"

namespace memonger {
namespace {

constexpr std::int64_t kUnbounded = std::numeric_limits<std::int64_t>::max();
// Work all neighbour-query passes together may do: a pass costs its
// overlapping pairs plus kPerRange for each range (tree updates, queries).
// About 0.1 s here; small instances get many passes, large ones few.
constexpr std::int64_t kWorkBudget = 2'000'000;
constexpr std::int64_t kPerRange = 16;

// Placed ranges by time: a segment tree over ranges sorted by first step
// holds the largest last step among placed ones, so a query visits only the
// placed ranges that overlap it (and the tree nodes above them).
class PlacedIndex {
 public:
  explicit PlacedIndex(const std::vector<std::int64_t>& firsts, const std::vector<std::int64_t>& lasts)
      : lasts_(lasts) {
    by_first_.resize(firsts.size());
    for (std::size_t k = 0; k < by_first_.size(); ++k) by_first_[k] = k;
    std::sort(by_first_.begin(), by_first_.end(),
              [&](auto a, auto b) { return firsts[a] < firsts[b]; });
    position_.resize(firsts.size());
    sorted_firsts_.resize(firsts.size());
    for (std::size_t pos = 0; pos < by_first_.size(); ++pos) {
      position_[by_first_[pos]] = pos;
      sorted_firsts_[pos] = firsts[by_first_[pos]];
    }
    while (leaves_ < firsts.size()) leaves_ *= 2;
    tree_.assign(2 * leaves_, kNone);
  }

  void place(std::size_t k) {
    std::size_t node = leaves_ + position_[k];
    tree_[node] = lasts_[k];
    for (node /= 2; node >= 1 && tree_[node] < lasts_[k]; node /= 2) tree_[node] = lasts_[k];
  }

  // Placed items alive at some step of [from, to].
  void overlapping(std::int64_t from, std::int64_t to, std::vector<std::size_t>& out) const {
    out.clear();
    const std::size_t end =
        std::upper_bound(sorted_firsts_.begin(), sorted_firsts_.end(), to) - sorted_firsts_.begin();
    Frame stack[2 * 64];
    std::size_t depth = 0;
    stack[depth++] = {1, 0, leaves_};
    while (depth > 0) {
      const Frame f = stack[--depth];
      if (f.lo >= end || tree_[f.node] < from) continue;
      if (f.hi - f.lo == 1) {
        out.push_back(by_first_[f.lo]);
        continue;
      }
      const std::size_t mid = (f.lo + f.hi) / 2;
      stack[depth++] = {2 * f.node + 1, mid, f.hi};
      stack[depth++] = {2 * f.node, f.lo, mid};
    }
  }

 private:
  static constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::min();
  struct Frame {
    std::size_t node, lo, hi;
  };

  const std::vector<std::int64_t>& lasts_;
  std::vector<std::size_t> by_first_, position_;
  std::vector<std::int64_t> sorted_firsts_, tree_;
  std::size_t leaves_ = 1;
};

// The items' steps and sizes side by side, read by every pass.
struct ItemTable {
  ItemTable(const Problem& p, const Items& items) {
    for (std::size_t i : items) {
      first.push_back(p.ranges()[i].first);
      last.push_back(p.ranges()[i].last);
      bytes.push_back(p.bytes(i));
    }
  }
  std::vector<std::int64_t> first, last, bytes;
};

// Places items in `order` (indices into items), each in the smallest gap
// beside the placed ranges it overlaps in time. Unbounded: a range that fits
// no gap goes on top. Bounded by `height`: the space above the top is a gap
// too, a range placed in a gap touching the top is hung from it (so chains
// alternate between floor and ceiling), and a range that fits nowhere fails
// the pass.
std::optional<Placement> pack(const ItemTable& t, const Items& order, std::int64_t height) {
  Placement placement;
  placement.offsets.assign(t.bytes.size(), 0);
  PlacedIndex index(t.first, t.last);
  std::vector<std::size_t> neighbours;
  std::vector<std::pair<std::int64_t, std::int64_t>> taken;  // byte intervals
  for (std::size_t k : order) {
    const std::int64_t size = t.bytes[k];
    index.place(k);
    if (size == 0) continue;
    index.overlapping(t.first[k], t.last[k], neighbours);
    taken.clear();
    for (std::size_t n : neighbours)
      if (n != k && t.bytes[n] > 0)
        taken.emplace_back(placement.offsets[n], placement.offsets[n] + t.bytes[n]);
    std::sort(taken.begin(), taken.end());

    std::int64_t best_start = -1, best_size = kUnbounded, top = 0;
    auto consider = [&](std::int64_t start, std::int64_t end) {
      if (end - start >= size && end - start < best_size) best_start = start, best_size = end - start;
    };
    for (const auto& [start, end] : taken) {
      if (start > top) consider(top, start);
      top = std::max(top, end);
    }
    std::int64_t offset;
    if (height == kUnbounded) {
      offset = best_start >= 0 ? best_start : top;
    } else {
      consider(top, height);
      if (best_start < 0) return std::nullopt;
      const bool touches_ceiling = best_start + best_size == height;
      offset = best_start > 0 && touches_ceiling ? height - size : best_start;
    }
    placement.offsets[k] = offset;
    placement.height = std::max(placement.height, offset + size);
  }
  placement.buffers = count_offsets(placement.offsets);
  return placement;
}

// Best fit in order of definition, run like an allocator: ranges are freed
// when their last step has passed, and each new one takes the smallest free
// gap that holds it, or goes on top. O(n log n) however many are alive.
Placement pack_in_time_order(const ItemTable& t, const Items& by_time) {
  Placement placement;
  placement.offsets.assign(t.bytes.size(), 0);
  std::map<std::int64_t, std::int64_t> gaps;              // start -> end
  std::set<std::pair<std::int64_t, std::int64_t>> by_size;  // (size, start)
  std::int64_t top = 0;  // everything above is free
  auto release = [&](std::int64_t start, std::int64_t end) {
    auto next = gaps.find(end);
    if (next != gaps.end()) {
      by_size.erase({next->second - next->first, next->first});
      end = next->second;
      gaps.erase(next);
    }
    auto prev = gaps.lower_bound(start);
    if (prev != gaps.begin() && std::prev(prev)->second == start) {
      --prev;
      by_size.erase({prev->second - prev->first, prev->first});
      start = prev->first;
      gaps.erase(prev);
    }
    if (end == top) {
      top = start;
      return;
    }
    gaps.emplace(start, end);
    by_size.emplace(end - start, start);
  };
  using Alive = std::pair<std::int64_t, std::size_t>;  // (last step, item)
  std::priority_queue<Alive, std::vector<Alive>, std::greater<>> alive;
  for (std::size_t k : by_time) {
    while (!alive.empty() && alive.top().first < t.first[k]) {
      const std::size_t done = alive.top().second;
      alive.pop();
      release(placement.offsets[done], placement.offsets[done] + t.bytes[done]);
    }
    const std::int64_t size = t.bytes[k];
    if (size == 0) continue;
    auto fit = by_size.lower_bound({size, std::numeric_limits<std::int64_t>::min()});
    if (fit != by_size.end()) {
      const auto [gap, start] = *fit;
      by_size.erase(fit);
      gaps.erase(start);
      placement.offsets[k] = start;
      if (gap > size) {
        gaps.emplace(start + size, start + gap);
        by_size.emplace(gap - size, start + size);
      }
    } else {
      placement.offsets[k] = top;
      top += size;
    }
    placement.height = std::max(placement.height, placement.offsets[k] + size);
    alive.emplace(t.last[k], k);
  }
  placement.buffers = count_offsets(placement.offsets);
  return placement;
}

// Pairs of ranges alive together: about what one neighbour-query pass costs.
std::int64_t overlapping_pairs(const ItemTable& t, const Items& by_time) {
  std::priority_queue<std::int64_t, std::vector<std::int64_t>, std::greater<>> lasts;
  std::int64_t pairs = 0;
  for (std::size_t k : by_time) {
    while (!lasts.empty() && lasts.top() < t.first[k]) lasts.pop();
    pairs += static_cast<std::int64_t>(lasts.size());
    lasts.push(t.last[k]);
  }
  return pairs;
}

template <typename Key>
Items order_by(const Problem& p, const Items& items, Key key) {
  Items order(items.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) {
    return key(p.ranges()[items[a]], p.bytes(items[a])) > key(p.ranges()[items[b]], p.bytes(items[b]));
  });
  return order;
}

}  // namespace

Placement arena_best_fit(const Problem& p, const Items& items) {
  // Orderings, each sorted the first time a pass needs it.
  enum Ordering { kTime, kSize, kArea, kDuration };
  std::array<std::optional<Items>, 4> orders;
  auto order = [&](Ordering o) -> const Items& {
    if (orders[o]) return *orders[o];
    using Key = std::pair<std::int64_t, std::int64_t>;
    auto duration = [](const LiveRange& r) { return r.last - r.first + 1; };
    switch (o) {
      case kTime:
        return *(orders[o] = order_by(p, items, [](const LiveRange& r, std::int64_t) { return Key{-r.first, -r.last}; }));
      case kSize:
        return *(orders[o] = order_by(p, items, [&](const LiveRange& r, std::int64_t b) { return Key{b, duration(r)}; }));
      case kArea:
        return *(orders[o] = order_by(p, items, [&](const LiveRange& r, std::int64_t b) {
                   return Key{static_cast<std::int64_t>(static_cast<double>(b) * static_cast<double>(duration(r))), b};
                 }));
      case kDuration:
        return *(orders[o] = order_by(p, items, [&](const LiveRange& r, std::int64_t b) { return Key{duration(r), b}; }));
    }
    throw std::logic_error("unknown ordering");
  };

  const ItemTable table(p, items);
  const std::int64_t bound = items_lower_bound(p, items);
  Placement best = pack_in_time_order(table, order(kTime));
  best.bound = bound;

  // Neighbour-query passes cost about the number of overlapping pairs each;
  // where many ranges are alive at once, only as many run as the budget buys.
  const std::int64_t pass_cost =
      overlapping_pairs(table, order(kTime)) + kPerRange * static_cast<std::int64_t>(items.size());
  std::int64_t budget = kWorkBudget;
  auto affordable = [&] { return best.height > bound && (budget -= pass_cost) >= 0; };
  auto try_pack = [&](Ordering o, std::int64_t height) {
    auto candidate = pack(table, order(o), height);
    const bool better = candidate && candidate->height < best.height;
    if (better) {
      best = std::move(*candidate);
      best.bound = bound;
    }
    return better;
  };

  // Cheapest first: a two-ended packing at the lower bound in time order
  // (optimal on chains), then the other orderings unbounded.
  if (affordable()) try_pack(kTime, bound);
  for (Ordering o : {kSize, kArea, kDuration})
    if (affordable()) try_pack(o, kUnbounded);

  // Improvement: the smallest height, between the lower bound and the best
  // plan so far, into which a two-ended packing fits (binary search).
  std::int64_t low = bound + 1, high = best.height - 1;
  while (low <= high) {
    const std::int64_t target = low + (high - low) / 2;
    bool fitted = false;
    for (Ordering o : {kTime, kSize, kArea, kDuration}) {
      if (!affordable()) return best;
      if ((fitted = try_pack(o, target))) break;
    }
    if (fitted)
      high = best.height - 1;
    else
      low = target + 1;
  }
  return best;
}

}  // namespace memonger
