// The exact arena solver: the ideas of MiniMalloc (Moffitt, ASPLOS 2023),
// in our own code. Items are placed in order of offset, each as low as the
// items already placed let it (a canonical plan: every instance that fits
// has one), and a partial plan is given up as soon as
//  - a time section's unplaced items no longer fit between its floor and
//    the capacity (spatial inference),
//  - an item would go where an unplaced item could still have been put
//    entirely below it (dominance: that gap is never needed),
//  - or its last item overlapped no unplaced item and the rest still failed
//    (placing the others first cannot help).
// Whenever no unplaced item spans some moment, the two sides are solved
// apart. Tie orders (static preorders) are tried in turn with node limits
// that double, so one bad order does not sink the search.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <exception>
#include <deque>
#include <limits>
#include <numeric>
#include <string_view>

#include <pthread.h>

#include "memonger/Placement.h"

namespace memonger {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::int64_t kUnplaced = -1;
constexpr std::int64_t kInfinity = std::numeric_limits<std::int64_t>::max();

// The items with bytes, over time sections: the stretches between
// consecutive points where some item starts or ends.
struct Instance {
  // Incomplete past `deadline` (overlap_lists gave up).
  Instance(const Problem& p, const Items& items, Clock::time_point deadline) {
    std::vector<std::int64_t> points;
    for (std::size_t k = 0; k < items.size(); ++k) {
      const LiveRange& r = p.ranges()[items[k]];
      if (p.bytes(items[k]) == 0) continue;  // anywhere will do: offset 0
      index.push_back(k);
      bytes.push_back(p.bytes(items[k]));
      width.push_back(r.last + 1 - r.first);
      points.push_back(r.first);
      points.push_back(r.last + 1);
    }
    std::sort(points.begin(), points.end());
    points.erase(std::unique(points.begin(), points.end()), points.end());
    sections = points.empty() ? 0 : static_cast<int>(points.size()) - 1;
    members.resize(sections);
    auto section_of = [&](std::int64_t t) {
      return static_cast<int>(std::lower_bound(points.begin(), points.end(), t) - points.begin());
    };
    for (std::size_t i = 0; i < index.size(); ++i) {
      const LiveRange& r = p.ranges()[items[index[i]]];
      lo.push_back(section_of(r.first));
      hi.push_back(section_of(r.last + 1));
      for (int s = lo[i]; s < hi[i]; ++s) members[s].push_back(static_cast<int>(i));
    }
    std::vector<std::int64_t> first(index.size()), last(index.size());
    for (std::size_t i = 0; i < index.size(); ++i) first[i] = lo[i], last[i] = hi[i] - 1;
    if (std::optional<std::vector<Items>> lists = overlap_lists(first, last, deadline)) overlaps = std::move(*lists);
    else complete = false;
  }
  std::size_t size() const { return bytes.size(); }

  std::vector<std::size_t> index;  // into the caller's items
  std::vector<std::int64_t> bytes, width;
  std::vector<int> lo, hi;                 // sections [lo, hi)
  std::vector<Items> overlaps;             // items alive at a common section
  bool complete = true;
  std::vector<std::vector<int>> members;   // items per section
  int sections = 0;
};

enum class Outcome { kFound, kNone, kStopped };

// Static preorders: sort keys, most significant first, each larger first.
// 'W' lifetime, 'A' area (bytes × lifetime), 'T' the most bytes still to
// place in any of the item's sections.
constexpr std::array<std::string_view, 3> kPreorders = {"WAT", "TAW", "TWA"};

// One decision: do all items fit below `capacity`?
class CanonicalSearch {
 public:
  explicit CanonicalSearch(const Instance& in)
      : in_(in),
        offset_(in.size(), kUnplaced),
        min_offset_(in.size(), 0),
        solution_(in.size(), 0),
        floor_(in.sections, 0),
        total_(in.sections, 0),
        cuts_(std::max(in.sections - 1, 0), 0),
        raised_at_(in.size(), 0),
        stamp_of_(in.sections, 0),
        floor_keeper_(in.sections, 0) {
    for (std::size_t i = 0; i < in.size(); ++i) {
      for (int s = in.lo[i]; s < in.hi[i]; ++s) total_[s] += in.bytes[i], floor_keeper_[s] = static_cast<int>(i);
      for (int s = in.lo[i]; s + 1 < in.hi[i]; ++s) ++cuts_[s];
    }
  }

  // Every search undoes what it did, so runs may follow one another.
  Outcome run(std::int64_t capacity, std::string_view preorder, std::int64_t node_limit,
              Clock::time_point deadline) {
    capacity_ = capacity;
    preorder_ = preorder;
    nodes_left_ = node_limit;
    deadline_ = deadline;
    std::vector<int> all(in_.size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
    return solve_apart(all, 0, in_.sections);
  }
  const std::vector<std::int64_t>& offsets() const { return solution_; }
  std::int64_t nodes() const { return nodes_; }

 private:
  struct Entry {
    int item;
    int rank;  // in the part's static preorder
  };
  struct Part {
    std::vector<int> items;
    int lo, hi;  // sections
  };
  struct Saved {
    std::int64_t* slot;
    std::int64_t value;
  };

  // Splits the unplaced `items` at every section boundary no unplaced item
  // spans, and solves each side.
  Outcome solve_apart(const std::vector<int>& items, int lo, int hi) {
    int start = lo;
    for (int s = lo; s < hi; ++s) {
      if (s + 1 < hi && cuts_[s] > 0) continue;
      Part part{{}, start, s + 1};
      for (int i : items)
        if (offset_[i] == kUnplaced && in_.lo[i] < part.hi && part.lo < in_.hi[i]) part.items.push_back(i);
      start = s + 1;
      if (part.items.empty()) continue;
      if (const Outcome o = solve(part); o != Outcome::kFound) return o;
    }
    return Outcome::kFound;
  }

  Outcome solve(const Part& part) {
    if (!fits(part, 0)) return Outcome::kNone;
    std::vector<std::int64_t> most(part.items.size(), 0);
    for (std::size_t k = 0; k < part.items.size(); ++k) {
      const int i = part.items[k];
      for (int s = in_.lo[i]; s < in_.hi[i]; ++s) most[k] = std::max(most[k], total_[s]);
    }
    auto key = [&](std::size_t k, char c) -> std::int64_t {
      const int i = part.items[k];
      switch (c) {
        case 'W': return in_.width[i];
        case 'A': return in_.width[i] * in_.bytes[i];
        default: return most[k];
      }
    };
    std::vector<std::size_t> by_rank(part.items.size());
    for (std::size_t k = 0; k < by_rank.size(); ++k) by_rank[k] = k;
    std::sort(by_rank.begin(), by_rank.end(), [&](std::size_t a, std::size_t b) {
      for (char c : preorder_)
        if (key(a, c) != key(b, c)) return key(a, c) > key(b, c);
      return part.items[a] < part.items[b];
    });
    std::vector<Entry> order;
    for (std::size_t r = 0; r < by_rank.size(); ++r)
      order.push_back({part.items[by_rank[r]], static_cast<int>(r)});
    std::stable_sort(order.begin(), order.end(),
                     [&](const Entry& a, const Entry& b) { return min_offset_[a.item] < min_offset_[b.item]; });
    return search(part, order, 0, -1);
  }

  // Places one more item of `part`: any unplaced one at or after (offset,
  // rank) `last` in canonical order.
  Outcome search(const Part& part, const std::vector<Entry>& parent, std::int64_t last_offset,
                 int last_rank) {
    if (--nodes_left_ < 0) return Outcome::kStopped;
    if ((++nodes_ & 255) == 0 && Clock::now() > deadline_) return Outcome::kStopped;

    // The parent's order, less the item placed, with the items it raised
    // taken out, sorted and merged back in.
    if (orders_.size() <= depth_) orders_.emplace_back();
    std::vector<Entry>& order = orders_[depth_];
    order.clear();
    raised_.clear();
    for (const Entry& e : parent) {
      if (offset_[e.item] != kUnplaced) continue;
      (raised_at_[e.item] == stamp_ ? raised_ : order).push_back(e);
    }
    if (order.empty() && raised_.empty()) return Outcome::kFound;
    auto before = [&](const Entry& a, const Entry& b) {
      const std::int64_t oa = min_offset_[a.item], ob = min_offset_[b.item];
      return oa != ob ? oa < ob : a.rank < b.rank;
    };
    std::sort(raised_.begin(), raised_.end(), before);
    const std::size_t kept = order.size();
    order.insert(order.end(), raised_.begin(), raised_.end());
    std::inplace_merge(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(kept), order.end(), before);

    std::int64_t min_height = kInfinity;
    for (const Entry& e : order) min_height = std::min(min_height, min_offset_[e.item] + in_.bytes[e.item]);

    ++depth_;
    Outcome outcome = Outcome::kNone;
    for (std::size_t k = 0; k < order.size() && outcome == Outcome::kNone; ++k) {
      const Entry e = order[k];
      const std::int64_t offset = min_offset_[e.item];
      if (offset >= min_height) break;  // and so is every later one
      if (offset < last_offset || (offset == last_offset && e.rank < last_rank)) continue;
      bool hatless = false;
      outcome = place(part, order, e, offset, offset > last_offset, hatless);
      if (outcome == Outcome::kNone && hatless) break;
    }
    --depth_;
    return outcome;
  }

  // Puts `e` at `offset`: raises the lowest offsets of the unplaced items it
  // overlaps and the floors of the sections concerned, and goes on if the
  // part still fits (solving the sides apart where time came apart); then
  // undoes it all. `rose`: the offset is above the last one placed, so every
  // section is checked again; otherwise only those whose floor or bytes
  // changed.
  Outcome place(const Part& part, const std::vector<Entry>& order, const Entry& e, std::int64_t offset,
                bool rose, bool& hatless) {
    const int item = e.item;
    const std::int64_t end = offset + in_.bytes[item];
    const std::size_t mark = trail_top_;
    offset_[item] = offset;
    solution_[item] = offset;

    for (int s = in_.lo[item]; s < in_.hi[item]; ++s) {
      save(floor_[s]) = end;
      total_[s] -= in_.bytes[item];
    }
    ++stamp_;
    affected_.clear();
    hatless = true;
    for (std::size_t other : in_.overlaps[item]) {
      if (offset_[other] != kUnplaced) continue;
      hatless = false;
      if (min_offset_[other] >= end) continue;
      save(min_offset_[other]) = end;
      raised_at_[other] = stamp_;
      // A section's floor may rise only where it is below `end`: not in
      // the item's own sections.
      auto mark = [&](int from, int to) {
        for (int s = from; s < to; ++s)
          if (floor_[s] < end && stamp_of_[s] != stamp_) stamp_of_[s] = stamp_, affected_.push_back(s);
      };
      mark(in_.lo[other], std::min(in_.hi[other], in_.lo[item]));
      mark(std::max(in_.lo[other], in_.hi[item]), in_.hi[other]);
    }
    // Nothing unplaced can go below a section's lowest unplaced offset. The
    // member that last kept a section's floor where it was is asked first.
    for (int s : affected_) {
      const int kept = floor_keeper_[s];
      if (offset_[kept] == kUnplaced && min_offset_[kept] <= floor_[s]) continue;  // no rise here
      std::int64_t lowest = kInfinity;
      for (int i : in_.members[s]) {
        if (offset_[i] != kUnplaced) continue;
        lowest = std::min(lowest, min_offset_[i]);
        if (lowest <= floor_[s]) {
          floor_keeper_[s] = i;
          break;
        }
      }
      if (lowest != kInfinity && floor_[s] < lowest) save(floor_[s]) = lowest;
    }

    bool split = false;
    for (int s = in_.lo[item]; s + 1 < in_.hi[item]; ++s) split |= --cuts_[s] == 0;

    Outcome outcome = Outcome::kNone;
    if (rose ? fits(part, offset) : fits_after(item, offset))
      outcome = split ? solve_apart(part.items, part.lo, part.hi) : search(part, order, offset, e.rank);

    for (int s = in_.lo[item]; s + 1 < in_.hi[item]; ++s) ++cuts_[s];
    for (int s = in_.lo[item]; s < in_.hi[item]; ++s) total_[s] += in_.bytes[item];
    while (trail_top_ > mark) {
      --trail_top_;
      *trail_[trail_top_].slot = trail_[trail_top_].value;
    }
    offset_[item] = kUnplaced;
    return outcome;
  }

  // Every section's unplaced bytes stack above its floor and above the
  // offset reached (later items go no lower).
  bool fits(const Part& part, std::int64_t offset) const {
    for (int s = part.lo; s < part.hi; ++s)
      if (std::max(offset, floor_[s]) + total_[s] > capacity_) return false;
    return true;
  }
  // fits(), for the sections a placement at an unchanged offset changed.
  bool fits_after(int item, std::int64_t offset) const {
    auto fits_in = [&](int s) { return std::max(offset, floor_[s]) + total_[s] <= capacity_; };
    for (int s = in_.lo[item]; s < in_.hi[item]; ++s)
      if (!fits_in(s)) return false;
    return std::all_of(affected_.begin(), affected_.end(), fits_in);
  }

  // Remembers `slot`'s value, to be put back when the placement is undone.
  std::int64_t& save(std::int64_t& slot) {
    if (trail_top_ == trail_.size()) trail_.resize(2 * trail_.size() + 1024);
    trail_[trail_top_++] = {&slot, slot};
    return slot;
  }

  const Instance& in_;
  std::int64_t capacity_ = 0;
  std::string_view preorder_;
  std::int64_t nodes_left_ = 0, nodes_ = 0;
  Clock::time_point deadline_;

  std::vector<std::int64_t> offset_, min_offset_, solution_;
  std::vector<std::int64_t> floor_, total_;
  std::vector<int> cuts_;  // unplaced items spanning the boundary after each section
  std::vector<std::uint64_t> raised_at_;  // items: the stamp of the placement that last raised them
  std::vector<std::uint64_t> stamp_of_;  // sections: == stamp_ when in affected_
  std::vector<int> floor_keeper_;  // sections: a member last found at or below the floor (a hint, not undone)
  std::uint64_t stamp_ = 0;
  std::vector<int> affected_;  // sections of items whose lowest offset rose
  std::vector<Entry> raised_;  // scratch for search()
  std::vector<Saved> trail_;  // in use up to trail_top_
  std::size_t trail_top_ = 0;
  std::deque<std::vector<Entry>> orders_;  // one per depth, reused (a deque: frames keep references)
  std::size_t depth_ = 0;
};

// The search recurses a level per item it places (about 200 bytes of stack
// in an optimised build, 600 where time comes apart; AddressSanitizer's
// redzones make them several times larger), so it runs on a thread whose
// stack holds kStackPerLevel for every item: no instance overflows it, and
// pages are committed only as they are used.
#if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t kStackPerLevel = 16 << 10;
#else
constexpr std::size_t kStackPerLevel = 2 << 10;
#endif

template <typename Work>
void on_stack_for(std::size_t levels, Work& work) {
  struct Call {
    Work& work;
    std::exception_ptr error;
  } call{work, nullptr};
  auto run = [](void* arg) -> void* {
    Call& c = *static_cast<Call*>(arg);
    try {
      c.work();
    } catch (...) {
      c.error = std::current_exception();
    }
    return nullptr;
  };
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, (std::size_t{1} << 20) + levels * kStackPerLevel);
  pthread_t thread;
  const int failed = pthread_create(&thread, &attr, run, &call);
  pthread_attr_destroy(&attr);
  if (failed)
    throw PlanLimitError("exact: cannot start the search's thread (" + std::string(std::strerror(failed)) + ")");
  pthread_join(thread, nullptr);
  if (call.error) std::rethrow_exception(call.error);
}

Placement search_from(const Instance& in, const Items& items, Placement best, const SearchLimits& limits) {
  const Budget& budget = limits.budget;
  CanonicalSearch search(in);

  // Do the items fit below `capacity`? Each preorder in turn, with node
  // limits doubling, up to `node_budget` nodes in all.
  auto decide = [&](std::int64_t capacity, std::int64_t node_budget) {
    for (std::int64_t limit = 2 * static_cast<std::int64_t>(in.size()) + 2;; limit *= 2)
      for (std::string_view preorder : kPreorders) {
        if (node_budget <= 0 || budget.exhausted()) return Outcome::kStopped;
        const std::int64_t before = search.nodes();
        const Outcome o = search.run(capacity, preorder, std::min({limit, node_budget, budget.work - budget.spent}),
                                     budget.deadline);
        const std::int64_t used = search.nodes() - before;
        node_budget -= used;
        budget.spent += used;
        if (o != Outcome::kStopped) return o;
      }
  };
  auto take_found = [&] {
    best.offsets.assign(items.size(), 0);
    best.height = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
      best.offsets[in.index[i]] = search.offsets()[i];
      best.height = std::max(best.height, search.offsets()[i] + in.bytes[i]);
    }
    best.buffers = count_offsets(best.offsets);
  };

  if (limits.capacity) {  // decision: the first plan within capacity will do
    if (best.height <= *limits.capacity) return best;
    const Outcome o = decide(*limits.capacity, kInfinity);
    if (o == Outcome::kFound) take_found();
    if (o == Outcome::kNone) best.bound = std::max(best.bound, *limits.capacity + 1);
    return best;
  }

  // Minimisation: binary search between the proven bound and the best plan,
  // over multiples of the sizes' gcd (a canonical plan's height is a sum of
  // sizes). A height whose decision runs out of nodes is skipped, and the
  // open range searched again with four times the nodes, until the budget is spent.
  std::int64_t unit = 0;
  for (std::int64_t bytes : in.bytes) unit = std::gcd(unit, bytes);
  if (unit == 0) return best;
  best.bound = (best.bound + unit - 1) / unit * unit;
  for (std::int64_t nodes = 64 * static_cast<std::int64_t>(in.size()) + 1024;
       best.bound < best.height && !budget.exhausted(); nodes *= 4) {
    std::int64_t low = best.bound / unit, high = (best.height - 1) / unit;
    bool first = true;
    while (low <= high && !budget.exhausted()) {
      const std::int64_t target = first ? low : low + (high - low) / 2;  // the bound is often exact
      first = false;
      const Outcome o = decide(target * unit, nodes);
      if (o == Outcome::kFound) {
        take_found();
        high = (best.height - 1) / unit;
      } else {
        if (o == Outcome::kNone) best.bound = std::max(best.bound, (target + 1) * unit);
        low = target + 1;
      }
    }
  }
  return best;
}

}  // namespace

Placement arena_search(const Problem& problem, const Items& items, Placement start,
                       const SearchLimits& limits) {
  start.bound = std::max(start.bound, items_lower_bound(problem, items));
  const Instance in(problem, items, limits.budget.deadline);
  if (!in.complete) return start;
  Placement best;
  auto work = [&] { best = search_from(in, items, std::move(start), limits); };
  on_stack_for(in.size(), work);
  return best;
}

}  // namespace memonger
