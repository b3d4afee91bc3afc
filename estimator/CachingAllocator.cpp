#include "estimator/CachingAllocator.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <string>

namespace metamem {

void AllocatorStat::increase(std::int64_t amount) {
  current += amount;
  peak = std::max(peak, current);
  allocated += amount;
}

void AllocatorStat::decrease(std::int64_t amount) {
  current -= amount;
  freed += amount;
}

void CachingAllocatorSim::add(AllocatorStatArray& stat, bool small_pool, std::int64_t amount) {
  for (AllocatorStat* pool : {&stat[0], &stat[small_pool ? 1 : 2]}) {
    if (amount >= 0)
      pool->increase(amount);
    else
      pool->decrease(-amount);
  }
}

std::int64_t CachingAllocatorSim::round_size(std::int64_t bytes) const {
  if (bytes < kMinBlockSize) return kMinBlockSize;
  if (divisions_ > 0 && bytes > kMinBlockSize * divisions_) {
    if (divisions_ == 1) return bytes;  // as PyTorch: one division rounds nothing
    std::int64_t floor = 1;  // the power of two at or below bytes
    while (floor * 2 <= bytes) floor *= 2;
    if (floor == bytes) return bytes;
    std::int64_t step = floor;  // floor / (the power of two at or below divisions)
    for (int d = divisions_; d > 1; d /= 2) step /= 2;
    if (step == 0) return 2 * floor;
    return (bytes + step - 1) / step * step;
  }
  return (bytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

std::int64_t CachingAllocatorSim::segment_size(std::int64_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

void CachingAllocatorSim::malloc(std::uint32_t id, std::int64_t bytes) {
  if (bytes <= 0) return;
  const std::int64_t rounded = round_size(bytes);
  const bool small_pool = rounded <= kSmallSize;
  auto& free_blocks = pool(small_pool);
  // Best fit: the smallest free block that holds the request, lowest address first.
  auto fit = free_blocks.lower_bound({rounded, std::numeric_limits<std::int64_t>::min()});
  if (fit == free_blocks.end()) {
    const std::int64_t size = segment_size(rounded);
    const std::int64_t base = next_segment_address_;
    next_segment_address_ += size + kSmallBuffer;  // a gap: segments never merge
    segments_[base] = size;
    blocks_[base] = {base, size, false, small_pool};
    add(stats_.segment, small_pool, 1);
    add(stats_.reserved_bytes, small_pool, size);
    ++stats_.num_device_alloc;
    notify("segment_alloc", base, size);
    fit = free_blocks.emplace(size, base).first;
  }
  const std::int64_t address = fit->second;
  free_blocks.erase(fit);
  Block& block = blocks_[address];
  const bool already_split = is_split(block);
  const std::int64_t remaining = block.size - rounded;
  // Splitting leaves a free remainder; otherwise the whole block is handed
  // out and counts as allocated. A free block of a split segment is an
  // inactive split block (c10's fragmentation statistic).
  if (small_pool ? remaining >= kMinBlockSize : remaining > kSmallSize) {
    block.size = rounded;
    blocks_[address + rounded] = {block.segment, remaining, false, small_pool};
    free_blocks.emplace(remaining, address + rounded);
    if (already_split) {
      add(stats_.inactive_split_bytes, small_pool, -rounded);
    } else {
      add(stats_.inactive_split_bytes, small_pool, remaining);
      add(stats_.inactive_split, small_pool, 1);
    }
  } else if (already_split) {
    add(stats_.inactive_split_bytes, small_pool, -block.size);
    add(stats_.inactive_split, small_pool, -1);
  }
  block.allocated = true;
  block.requested = bytes;
  add(stats_.allocation, small_pool, 1);
  add(stats_.allocated_bytes, small_pool, block.size);
  add(stats_.active, small_pool, 1);
  add(stats_.active_bytes, small_pool, block.size);
  add(stats_.requested_bytes, small_pool, bytes);
  if (id >= address_of_.size())
    address_of_.resize(std::max<std::size_t>(id + 1, 2 * address_of_.size()), kUnallocated);
  address_of_[id] = address;
  notify("alloc", address, block.size);
}

void CachingAllocatorSim::free(std::uint32_t id) {
  if (id >= address_of_.size() || address_of_[id] == kUnallocated) return;
  const std::int64_t address = address_of_[id];
  address_of_[id] = kUnallocated;
  auto it = blocks_.find(address);
  Block& block = it->second;
  const bool small_pool = block.small_pool;
  const std::int64_t size = block.size, requested = block.requested;
  add(stats_.allocation, small_pool, -1);
  add(stats_.allocated_bytes, small_pool, -size);
  notify("free_requested", address, size);
  notify("free_completed", address, size);
  block.allocated = false;
  block.requested = 0;
  auto& free_blocks = pool(small_pool);

  // Merge with free neighbours in the same segment: each was an inactive
  // split block, and the merged block is one if its segment stays split.
  std::int64_t split_blocks = 0, split_bytes = 0;
  auto next = std::next(it);
  if (next != blocks_.end() && !next->second.allocated && next->second.segment == block.segment) {
    free_blocks.erase({next->second.size, next->first});
    block.size += next->second.size;
    --split_blocks;
    split_bytes -= next->second.size;
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    auto prev = std::prev(it);
    if (!prev->second.allocated && prev->second.segment == block.segment) {
      free_blocks.erase({prev->second.size, prev->first});
      --split_blocks;
      split_bytes -= prev->second.size;
      prev->second.size += block.size;
      blocks_.erase(it);
      it = prev;
    }
  }
  free_blocks.emplace(it->second.size, it->first);
  if (is_split(it->second)) {
    ++split_blocks;
    split_bytes += it->second.size;
  }
  add(stats_.inactive_split, small_pool, split_blocks);
  add(stats_.inactive_split_bytes, small_pool, split_bytes);
  add(stats_.active, small_pool, -1);
  add(stats_.active_bytes, small_pool, -size);
  add(stats_.requested_bytes, small_pool, -requested);
}

namespace {

template <typename Fn>
void for_each_stat(AllocatorStats& stats, Fn&& fn) {
  for (AllocatorStatArray* array :
       {&stats.allocation, &stats.segment, &stats.active, &stats.inactive_split, &stats.allocated_bytes,
        &stats.reserved_bytes, &stats.active_bytes, &stats.inactive_split_bytes, &stats.requested_bytes})
    for (AllocatorStat& stat : *array) fn(stat);
}

}  // namespace

void CachingAllocatorSim::reset_peaks() {
  for_each_stat(stats_, [](AllocatorStat& stat) { stat.peak = stat.current; });
}

void CachingAllocatorSim::reset_accumulated() {
  for_each_stat(stats_, [](AllocatorStat& stat) { stat.allocated = stat.freed = 0; });
  stats_.num_device_alloc = stats_.num_device_free = stats_.num_sync_all_streams = 0;
}

void CachingAllocatorSim::empty_cache() {
  ++stats_.num_sync_all_streams;  // it waits for every stream first
  for (auto segment = segments_.begin(); segment != segments_.end();) {
    const auto [base, size] = *segment;
    const Block& block = blocks_.at(base);
    if (block.allocated || block.size != size) {
      ++segment;
      continue;
    }
    notify("segment_free", base, size);
    add(stats_.segment, block.small_pool, -1);
    add(stats_.reserved_bytes, block.small_pool, -size);
    ++stats_.num_device_free;
    pool(block.small_pool).erase({size, base});
    blocks_.erase(base);
    segment = segments_.erase(segment);
  }
}

void ReservedBytesLimit::on_alloc(std::uint32_t buffer, std::int64_t bytes, std::int64_t) {
  sim_.malloc(buffer, bytes);
  if (sim_.reserved_bytes() > limit_)
    throw MemoryExceeded("the CUDA allocator reserves more than " + std::to_string(limit_) + " bytes");
}

void replay_trace(const Trace& trace, CachingAllocatorSim& sim,
                  const std::function<void(std::size_t)>& before) {
  for (std::size_t e = 0; e < trace.events.size(); ++e) {
    if (before) before(e);
    const Event& event = trace.events[e];
    if (event.kind == EventKind::Alloc)
      sim.malloc(event.index, trace.buffers[event.index].bytes);
    else if (event.kind == EventKind::Free)
      sim.free(event.index);
  }
}

}  // namespace metamem
