#include "estimator/CachingAllocator.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <string>

namespace metamem {

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
    reserved_ += size;
    peak_reserved_ = std::max(peak_reserved_, reserved_);
    notify("segment_alloc", base, size);
    fit = free_blocks.emplace(size, base).first;
  }
  const std::int64_t address = fit->second;
  free_blocks.erase(fit);
  Block& block = blocks_[address];
  const std::int64_t remaining = block.size - rounded;
  // Splitting leaves a free remainder; otherwise the whole block is handed
  // out and counts as allocated.
  const bool split = small_pool ? remaining >= kMinBlockSize : remaining > kSmallSize;
  if (split) {
    block.size = rounded;
    blocks_[address + rounded] = {block.segment, remaining, false, small_pool};
    free_blocks.emplace(remaining, address + rounded);
  }
  block.allocated = true;
  allocated_ += block.size;
  peak_allocated_ = std::max(peak_allocated_, allocated_);
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
  allocated_ -= block.size;
  notify("free_requested", address, block.size);
  notify("free_completed", address, block.size);
  block.allocated = false;
  auto& free_blocks = pool(block.small_pool);

  // Merge with free neighbours in the same segment.
  auto next = std::next(it);
  if (next != blocks_.end() && !next->second.allocated && next->second.segment == block.segment) {
    free_blocks.erase({next->second.size, next->first});
    block.size += next->second.size;
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    auto prev = std::prev(it);
    if (!prev->second.allocated && prev->second.segment == block.segment) {
      free_blocks.erase({prev->second.size, prev->first});
      prev->second.size += block.size;
      blocks_.erase(it);
      it = prev;
    }
  }
  free_blocks.emplace(it->second.size, it->first);
}

void CachingAllocatorSim::reset_peaks() {
  peak_allocated_ = allocated_;
  peak_reserved_ = reserved_;
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
