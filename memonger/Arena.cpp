// Arena planning: every range gets a byte offset (TFLite's greedy by size,
// XLA's GlobalDecreasingSizeBestFitHeap), improved by packing into a fixed
// height from both ends; for the exact planner, that packing in orders
// learnt by squeaky wheel optimisation.
#include <algorithm>
#include <array>
#include <stdexcept>
#include <limits>
#include <map>
#include <optional>
#include <queue>
#include <random>
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

  // Placed items alive at some step of item k's.
  void overlapping(std::size_t k, std::vector<std::size_t>& out) const {
    const std::int64_t from = sorted_firsts_[position_[k]], to = lasts_[k];
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
// the pass, or with `unplaced` is left out and listed there.
// `index` finds the placed ranges a range overlaps in time.
template <typename Index>
std::optional<Placement> pack(const ItemTable& t, const Items& order, std::int64_t height, Index index,
                              Items* unplaced = nullptr) {
  Placement placement;
  placement.offsets.assign(t.bytes.size(), 0);
  std::vector<std::size_t> neighbours;
  std::vector<std::pair<std::int64_t, std::int64_t>> taken;  // byte intervals
  for (std::size_t k : order) {
    const std::int64_t size = t.bytes[k];
    if (size == 0) continue;
    index.overlapping(k, neighbours);
    taken.clear();
    for (std::size_t n : neighbours)
      if (t.bytes[n] > 0) taken.emplace_back(placement.offsets[n], placement.offsets[n] + t.bytes[n]);
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
      if (best_start < 0) {
        if (!unplaced) return std::nullopt;
        unplaced->push_back(k);
        continue;
      }
      const bool touches_ceiling = best_start + best_size == height;
      offset = best_start > 0 && touches_ceiling ? height - size : best_start;
    }
    placement.offsets[k] = offset;
    placement.height = std::max(placement.height, offset + size);
    index.place(k);
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

// Every range's time neighbours, listed once (overlap_lists): for the many
// packing passes of one instance, cheaper than PlacedIndex's tree walks.
class NeighbourLists {
 public:
  explicit NeighbourLists(std::vector<Items> lists) : lists_(std::move(lists)) {}

  // One pass's view: the placed neighbours.
  class Placed {
   public:
    explicit Placed(const NeighbourLists& lists) : lists_(lists.lists_), placed_(lists_.size(), 0) {}
    void place(std::size_t k) { placed_[k] = 1; }
    void overlapping(std::size_t k, std::vector<std::size_t>& out) const {
      out.clear();
      for (std::size_t n : lists_[k])
        if (placed_[n]) out.push_back(n);
    }

   private:
    const std::vector<Items>& lists_;
    std::vector<char> placed_;
  };

 private:
  std::vector<Items> lists_;
};

// Squeaky wheel optimisation (Joslin & Clements, JAIR 1999) over pack():
// each pass packs into a fixed height in priority order and moves the
// ranges it left out forward by random stretches (up to 1/40 of the order;
// longer ones scramble what earlier passes learnt), so the next pass places
// them earlier. The order carries over from one height to the next.
class SqueakyWheel {
 public:
  SqueakyWheel(const ItemTable& t, NeighbourLists neighbours, Items order)
      : t_(t),
        neighbours_(std::move(neighbours)),
        order_(std::move(order)),
        stretch_(1, std::max<std::size_t>(order_.size() / 40, 1)) {}

  // Up to `passes` passes at `height`, within `budget`; true with `found`.
  bool fit(std::int64_t height, std::int64_t passes, const Budget& budget, Placement& found) {
    Items unplaced;
    for (std::int64_t pass = 0; pass < passes && !budget.exhausted(); ++pass) {
      budget.spent += static_cast<std::int64_t>(order_.size());
      unplaced.clear();
      std::optional<Placement> placement = pack(t_, order_, height, NeighbourLists::Placed(neighbours_), &unplaced);
      if (unplaced.empty()) {
        found = std::move(*placement);
        return true;
      }
      move_forward(unplaced);
    }
    return false;
  }

 private:
  void move_forward(const Items& unplaced) {
    std::vector<char> left_out(t_.bytes.size(), 0);
    for (std::size_t k : unplaced) left_out[k] = 1;
    std::vector<std::pair<double, std::size_t>> keyed(order_.size());
    for (std::size_t position = 0; position < order_.size(); ++position) {
      const std::size_t k = order_[position];
      const double moved = left_out[k] ? static_cast<double>(stretch_(rng_)) + 0.5 : 0.0;
      keyed[position] = {static_cast<double>(position) - moved, k};
    }
    std::stable_sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (std::size_t position = 0; position < order_.size(); ++position) order_[position] = keyed[position].second;
  }

  const ItemTable& t_;
  const NeighbourLists neighbours_;
  Items order_;
  std::uniform_int_distribution<std::size_t> stretch_;
  std::mt19937_64 rng_{1};
};

}  // namespace

Placement arena_squeaky_wheel(const Problem& p, const Items& items, Placement start, const Budget& budget) {
  const ItemTable table(p, items);
  std::optional<std::vector<Items>> lists = overlap_lists(table.first, table.last, budget.deadline);
  if (!lists) return start;
  SqueakyWheel wheel(table, NeighbourLists(std::move(*lists)), order_by(p, items, [](const LiveRange& r, std::int64_t b) {
                       return static_cast<double>(b) * static_cast<double>(r.last - r.first + 1);
                     }));
  // Steps down from the best height by a sixteenth of the gap to the bound;
  // a step that fails within 64 passes is halved, down to 1/4096 of the height.
  Placement best = std::move(start);
  const std::int64_t smallest = std::max<std::int64_t>(best.height / 4096, 1);
  std::int64_t step = std::max((best.height - best.bound) / 16, smallest);
  while (best.height > best.bound && !budget.exhausted()) {
    step = std::min(step, best.height - best.bound);
    Placement found;
    if (wheel.fit(best.height - step, 64, budget, found)) {
      found.bound = best.bound;
      best = std::move(found);
    } else {
      step = std::max(step / 2, smallest);
    }
  }
  return best;
}

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
    auto candidate = pack(table, order(o), height, PlacedIndex(table.first, table.last));
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
