#include "estimator/CachingAllocator.h"

#include <algorithm>
#include <bit>
#include <iterator>
#include <limits>
#include <stdexcept>
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

CachingAllocatorSim::CachingAllocatorSim(const AllocatorConfig& config, std::int64_t device_memory)
    : config_(config), device_memory_(device_memory) {
  if (config.expandable_segments)
    throw std::invalid_argument("PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True is not simulated yet");
  // c10 reports its size_t setting as int64_t: no limit reads -1.
  stats_.max_split_size = config.max_split_size == std::numeric_limits<std::int64_t>::max() ? -1 : config.max_split_size;
  if (config.per_process_memory_fraction > 0)
    allowed_maximum_ = static_cast<std::int64_t>(config.per_process_memory_fraction * static_cast<double>(device_memory));
}

std::int64_t CachingAllocatorSim::round_size(std::int64_t bytes) const {
  if (bytes < kMinBlockSize) return kMinBlockSize;
  const std::int64_t divisions = config_.divisions_for(bytes);
  if (divisions > 1 && bytes > kMinBlockSize * divisions) {
    // The next of `divisions` equal steps between the powers of two around bytes.
    const std::int64_t floor = std::bit_floor(static_cast<std::uint64_t>(bytes));
    if (floor == bytes) return bytes;
    const std::int64_t step = floor / divisions;
    if (step == 0) return 2 * floor;
    return (bytes + step - 1) / step * step;
  }
  return (bytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

std::int64_t CachingAllocatorSim::segment_size(std::int64_t rounded) const {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return config_.large_segment_size;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

void CachingAllocatorSim::insert_free(std::int64_t address, Block& block) {
  block.gc_count_base = get_free_block_calls_[block.small_pool];
  pool(block.small_pool).emplace(block.size, address);
}

std::optional<std::int64_t> CachingAllocatorSim::get_free_block(bool small_pool, std::int64_t rounded) {
  if (garbage_collecting()) ++get_free_block_calls_[small_pool];
  auto& free_blocks = pool(small_pool);
  // Best fit: the smallest free block that holds the request, lowest address first.
  const auto fit = free_blocks.lower_bound({rounded, std::numeric_limits<std::int64_t>::min()});
  if (fit == free_blocks.end()) return std::nullopt;
  const std::int64_t size = fit->first, max_split = config_.max_split_size;
  // Blocks of max_split_size or more serve only requests as large, and
  // only if they are less than max_non_split_rounding_size larger.
  if (rounded < max_split && size >= max_split) return std::nullopt;
  if (rounded >= max_split && size >= rounded + config_.max_non_split_rounding_size) return std::nullopt;
  const std::int64_t address = fit->second;
  free_blocks.erase(fit);
  return address;
}

std::optional<std::int64_t> CachingAllocatorSim::alloc_block(bool small_pool, std::int64_t size, bool retry) {
  if (retry) ++stats_.num_alloc_retries;
  const std::int64_t reserved = reserved_bytes();
  if (allowed_maximum_ && reserved + size > *allowed_maximum_) return std::nullopt;
  if (size > device_memory_ - reserved) return std::nullopt;
  const std::int64_t base = next_segment_address_;
  next_segment_address_ += size + kSmallBuffer;  // a gap: segments never merge
  segments_[base] = size;
  blocks_[base] = {base, size, false, small_pool};
  add(stats_.segment, small_pool, 1);
  add(stats_.reserved_bytes, small_pool, size);
  if (size >= config_.max_split_size) stats_.oversize_segments.increase(1);
  ++stats_.num_device_alloc;
  notify("segment_alloc", base, size);
  return base;
}

void CachingAllocatorSim::release_block(std::int64_t address) {
  const std::int64_t size = segments_.at(address);
  const bool small_pool = blocks_.at(address).small_pool;
  notify("segment_free", address, size);
  add(stats_.segment, small_pool, -1);
  add(stats_.reserved_bytes, small_pool, -size);
  if (size >= config_.max_split_size) stats_.oversize_segments.decrease(1);
  ++stats_.num_device_free;
  pool(small_pool).erase({size, address});
  blocks_.erase(address);
  segments_.erase(address);
}

bool CachingAllocatorSim::release_available_cached_blocks(bool small_pool, std::int64_t rounded) {
  const std::int64_t max_split = config_.max_split_size;
  if (max_split == std::numeric_limits<std::int64_t>::max()) return false;
  auto& free_blocks = pool(small_pool);
  const std::int64_t wanted = std::max(rounded, max_split);
  auto it = free_blocks.lower_bound({wanted, std::numeric_limits<std::int64_t>::min()});
  if (it != free_blocks.end()) {
    release_block(it->second);
    return true;
  }
  // No one block is large enough: free oversize blocks, largest first.
  std::int64_t released = 0;
  while (released < wanted && !free_blocks.empty()) {
    const auto [size, address] = *std::prev(free_blocks.end());
    if (size < max_split) break;
    released += size;
    release_block(address);
  }
  return released >= wanted;
}

void CachingAllocatorSim::release_cached_blocks() {
  ++stats_.num_sync_all_streams;  // it waits for every stream first
  for (bool small_pool : {false, true}) {
    auto& free_blocks = pool(small_pool);
    for (auto it = free_blocks.begin(); it != free_blocks.end();) {
      const auto [size, address] = *it++;
      if (!is_split(blocks_.at(address))) release_block(address);
    }
  }
}

void CachingAllocatorSim::garbage_collect_cached_blocks() {
  // Frees cached whole large segments that have waited longest (counted in
  // get_free_block calls), until the reserved bytes are under the threshold.
  const auto threshold =
      static_cast<std::int64_t>(config_.garbage_collection_threshold * static_cast<double>(*allowed_maximum_));
  const std::int64_t reserved = reserved_bytes();
  if (reserved <= threshold) return;
  const std::int64_t target = reserved - threshold;
  auto age = [&](std::int64_t address) { return get_free_block_calls_[false] - blocks_.at(address).gc_count_base; };
  std::int64_t total_age = 0, freeable = 0, reclaimed = 0;
  for (const auto& [size, address] : free_large_)
    if (!is_split(blocks_.at(address))) total_age += age(address), ++freeable;
  bool freed = true;
  while (reclaimed < target && freed && freeable > 0) {
    const double threshold_age = static_cast<double>(total_age) / static_cast<double>(freeable);
    freed = false;
    for (auto it = free_large_.begin(); it != free_large_.end();) {
      const auto [size, address] = *it++;
      if (is_split(blocks_.at(address)) || static_cast<double>(age(address)) < threshold_age) continue;
      freed = true;
      reclaimed += size;
      total_age -= age(address);
      --freeable;
      release_block(address);
    }
  }
}

void CachingAllocatorSim::malloc(std::uint32_t id, std::int64_t bytes) {
  if (bytes <= 0) return;
  const std::int64_t rounded = round_size(bytes);
  const bool small_pool = rounded <= kSmallSize;
  std::optional<std::int64_t> found = get_free_block(small_pool, rounded);
  if (!found) {
    if (garbage_collecting()) garbage_collect_cached_blocks();
    const std::int64_t size = segment_size(rounded);
    // As c10: a new segment; else free cached oversize blocks and retry;
    // else free every cached whole segment and retry.
    found = alloc_block(small_pool, size, false);
    if (!found && release_available_cached_blocks(small_pool, rounded)) found = alloc_block(small_pool, size, false);
    if (!found) {
      release_cached_blocks();
      found = alloc_block(small_pool, size, true);
    }
    if (!found) {
      ++stats_.num_ooms;
      throw MemoryExceeded("CUDA out of memory: the caching allocator cannot get " + std::to_string(size) +
                           " more bytes for a request of " + std::to_string(bytes) + " (" +
                           std::to_string(reserved_bytes()) + " reserved)");
    }
  }
  const std::int64_t address = *found;
  Block& block = blocks_[address];
  const bool already_split = is_split(block);
  const std::int64_t remaining = block.size - rounded;
  // Splitting leaves a free remainder; otherwise the whole block is handed
  // out and counts as allocated. A free block of a split segment is an
  // inactive split block (c10's fragmentation statistic).
  const bool split = small_pool ? remaining >= kMinBlockSize
                                : rounded < config_.max_split_size && remaining > kSmallSize;
  if (split) {
    block.size = rounded;
    Block& rest = blocks_[address + rounded] = {block.segment, remaining, false, small_pool};
    insert_free(address + rounded, rest);
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
  if (block.size >= config_.max_split_size) stats_.oversize_allocations.increase(1);
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
  if (size >= config_.max_split_size) stats_.oversize_allocations.decrease(1);
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
  insert_free(it->first, it->second);
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

std::string first_difference(const AllocatorStats& a, const AllocatorStats& b) {
  auto differ = [](const AllocatorStat& x, const AllocatorStat& y, const std::string& name) -> std::string {
    for (auto [field, member] : {std::pair{".current", &AllocatorStat::current}, {".peak", &AllocatorStat::peak},
                                 {".allocated", &AllocatorStat::allocated}, {".freed", &AllocatorStat::freed}})
      if (x.*member != y.*member)
        return name + field + ": " + std::to_string(x.*member) + " vs " + std::to_string(y.*member);
    return "";
  };
  for (const auto& [name, array] : kStatArrays)
    for (std::size_t pool = 0; pool < kStatPoolNames.size(); ++pool)
      if ((a.*array)[pool] != (b.*array)[pool])
        return differ((a.*array)[pool], (b.*array)[pool], std::string(name) + "." + kStatPoolNames[pool]);
  if (a.oversize_allocations != b.oversize_allocations)
    return differ(a.oversize_allocations, b.oversize_allocations, "oversize_allocations");
  if (a.oversize_segments != b.oversize_segments)
    return differ(a.oversize_segments, b.oversize_segments, "oversize_segments");
  for (auto [name, member] : {std::pair{"num_alloc_retries", &AllocatorStats::num_alloc_retries},
                              {"num_ooms", &AllocatorStats::num_ooms},
                              {"num_device_alloc", &AllocatorStats::num_device_alloc},
                              {"num_device_free", &AllocatorStats::num_device_free},
                              {"num_sync_all_streams", &AllocatorStats::num_sync_all_streams},
                              {"max_split_size", &AllocatorStats::max_split_size}})
    if (a.*member != b.*member)
      return std::string(name) + ": " + std::to_string(a.*member) + " vs " + std::to_string(b.*member);
  return "";
}

void CachingAllocatorSim::reset_peaks() {
  AllocatorStats::for_each(stats_, [](AllocatorStat& stat) { stat.peak = stat.current; });
}

void CachingAllocatorSim::reset_accumulated() {
  AllocatorStats::for_each(stats_, [](AllocatorStat& stat) { stat.allocated = stat.freed = 0; });
  stats_.num_alloc_retries = stats_.num_ooms = 0;
  stats_.num_device_alloc = stats_.num_device_free = stats_.num_sync_all_streams = 0;
}

void CachingAllocatorSim::empty_cache() { release_cached_blocks(); }

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
