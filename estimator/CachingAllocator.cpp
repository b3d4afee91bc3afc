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

CachingAllocatorSim::CachingAllocatorSim(const AllocatorSetup& setup)
    : config_(setup.config), device_memory_(setup.device_memory) {
  const AllocatorConfig& config = setup.config;
  // c10 reports its size_t setting as int64_t: no limit reads -1.
  stats_.max_split_size = config.max_split_size == std::numeric_limits<std::int64_t>::max() ? -1 : config.max_split_size;
  const std::int64_t total = setup.device_total > 0 ? setup.device_total : setup.device_memory;
  const bool unlimited = total == std::numeric_limits<std::int64_t>::max();
  if (config.per_process_memory_fraction > 0) {
    if (unlimited)
      throw std::invalid_argument("per_process_memory_fraction is a share of the GPU's memory, which is not given");
    allowed_maximum_ = static_cast<std::int64_t>(config.per_process_memory_fraction * static_cast<double>(total));
  }
  // c10 reserves the GPU's memory and an eighth per expandable segment; a
  // device of unlimited memory gets 1 PiB, which no trace maps.
  const std::int64_t memory = unlimited ? std::int64_t{1} << 50 : total;
  address_space_ = memory + memory / 8;
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
  free_blocks(block.small_pool).insert({block.pool, block.stream, block.size, address});
}

std::optional<std::int64_t> CachingAllocatorSim::get_free_block(int pool, bool small_pool, int stream,
                                                                std::int64_t rounded) {
  // Only the device's own pools are garbage collected, by their own clock.
  if (garbage_collecting() && pool == 0) ++get_free_block_calls_[small_pool];
  auto& free = free_blocks(small_pool);
  auto ours = [&](FreeBlocks::iterator it) { return it != free.end() && it->pool == pool && it->stream == stream; };
  // Best fit: the stream's smallest free block that holds the request, lowest address first.
  auto fit = free.lower_bound({pool, stream, rounded, std::numeric_limits<std::int64_t>::min()});
  if (!ours(fit)) return std::nullopt;
  if (config_.expandable_segments) {
    // A block that unmapped address space follows counts as large as it
    // could grow: the search moves on while the next block grows less.
    auto expandable_size = [&](FreeBlocks::iterator free) {
      const auto next = std::next(blocks_.find(free->address));
      const bool grows = next != blocks_.end() && next->second.segment == blocks_.at(free->address).segment &&
                         !next->second.mapped;
      return free->size + (grows ? next->second.size : 0);
    };
    for (auto next = std::next(fit); ours(next) && expandable_size(next) < expandable_size(fit);) fit = next++;
  }
  const std::int64_t size = fit->size, max_split = config_.max_split_size;
  // Blocks of max_split_size or more serve only requests as large, and
  // only if they are less than max_non_split_rounding_size larger.
  if (rounded < max_split && size >= max_split) return std::nullopt;
  if (rounded >= max_split && size >= rounded + config_.max_non_split_rounding_size) return std::nullopt;
  const std::int64_t address = fit->address;
  free.erase(fit);
  return address;
}

bool CachingAllocatorSim::should_split(const Block& block, std::int64_t rounded) const {
  const std::int64_t remaining = block.size - rounded;
  if (block.small_pool || config_.expandable_segments) return remaining >= kMinBlockSize;
  return rounded < config_.max_split_size && remaining > kSmallSize;
}

std::optional<std::int64_t> CachingAllocatorSim::alloc_block(int pool, bool small_pool, int stream, std::int64_t size,
                                                             std::int64_t rounded, bool retry) {
  if (retry) ++stats_.num_alloc_retries;
  const std::int64_t reserved = reserved_bytes();
  if (allowed_maximum_ && reserved + size > *allowed_maximum_) return std::nullopt;
  if (config_.expandable_segments) return try_allocate_expandable_block(pool, small_pool, stream, rounded);
  if (size > device_memory_ - reserved) return std::nullopt;
  const std::int64_t base = next_segment_address_;
  next_segment_address_ += size + kSmallBuffer;  // a gap: segments never merge
  segments_[base] = {size, false, stream, pool};
  blocks_[base] = {.segment = base, .size = size, .pool = pool, .allocated = false, .small_pool = small_pool,
                   .stream = stream};
  add(stats_.segment, small_pool, 1);
  add(stats_.reserved_bytes, small_pool, size);
  if (size >= config_.max_split_size) stats_.oversize_segments.increase(1);
  ++stats_.num_device_alloc;
  notify("segment_alloc", base, size);
  return base;
}

CachingAllocatorSim::Merged CachingAllocatorSim::merge_neighbours(Blocks::iterator it) {
  Merged merged{it};
  auto absorbable = [&](Blocks::iterator other) {
    const Block& block = merged.block->second;
    return !other->second.allocated && other->second.segment == block.segment && other->second.mapped == block.mapped;
  };
  auto forget = [&](Blocks::iterator other) {
    if (other->second.mapped)
      erase_free(other->first, other->second);
    else
      unmapped(other->second.small_pool).erase({other->second.pool, other->second.stream, other->first});
    ++merged.blocks;
    merged.bytes += other->second.size;
  };
  if (merged.block != blocks_.begin()) {
    const auto prev = std::prev(merged.block);
    if (absorbable(prev)) {
      forget(prev);
      prev->second.size += merged.block->second.size;
      blocks_.erase(merged.block);
      merged.block = prev;
    }
  }
  const auto next = std::next(merged.block);
  if (next != blocks_.end() && absorbable(next)) {
    forget(next);
    merged.block->second.size += next->second.size;
    blocks_.erase(next);
  }
  return merged;
}

std::int64_t CachingAllocatorSim::find_expandable_block(int pool, bool small_pool, int stream, std::int64_t rounded) {
  // The stream's lowest address where free and unmapped blocks together
  // hold the request: an unmapped block, or the free block before it.
  const Unmapped& spaces = unmapped(small_pool);
  for (auto it = spaces.lower_bound({pool, stream, 0});
       it != spaces.end() && std::get<0>(*it) == pool && std::get<1>(*it) == stream; ++it) {
    auto candidate = blocks_.find(std::get<2>(*it));
    const std::int64_t segment = candidate->second.segment;
    auto allocatable = [&](Blocks::iterator it) {
      return it != blocks_.end() && it->second.segment == segment && !it->second.allocated;
    };
    if (candidate != blocks_.begin() && allocatable(std::prev(candidate))) --candidate;
    std::int64_t room = 0;
    for (auto it = candidate; room < rounded && allocatable(it); ++it) room += it->second.size;
    if (room >= rounded) return candidate->first;
  }
  const std::int64_t page = page_size(small_pool);
  const std::int64_t size = (address_space_ + page - 1) / page * page;
  const std::int64_t base = next_segment_address_;
  next_segment_address_ += size + kSmallBuffer;
  segments_[base] = {size, true, stream, pool};
  blocks_[base] = {.segment = base, .size = size, .pool = pool, .allocated = false, .small_pool = small_pool,
                   .mapped = false, .stream = stream};
  unmapped(small_pool).insert({pool, stream, base});
  return base;
}

std::optional<std::int64_t> CachingAllocatorSim::try_allocate_expandable_block(int pool, bool small_pool, int stream,
                                                                               std::int64_t rounded) {
  std::int64_t address = find_expandable_block(pool, small_pool, stream, rounded);
  if (!blocks_.at(address).mapped) {
    const auto mapped = map_block(address, std::min(blocks_.at(address).size, rounded));
    if (!mapped) return std::nullopt;
    address = *mapped;
  }
  // A free block followed by unmapped space: map what it lacks.
  while (blocks_.at(address).size < rounded) {
    const auto next = std::next(blocks_.find(address));
    const auto mapped = map_block(next->first, std::min(rounded - blocks_.at(address).size, next->second.size));
    if (!mapped) return std::nullopt;  // what was mapped stays mapped, as in c10
    address = *mapped;
  }
  erase_free(address, blocks_.at(address));
  return address;
}

std::optional<std::int64_t> CachingAllocatorSim::map_block(std::int64_t address, std::int64_t bytes) {
  Block& block = blocks_.at(address);
  const std::int64_t page = page_size(block.small_pool);
  const std::int64_t offset = address - block.segment;
  const std::int64_t mapped = ((offset + bytes + page - 1) / page) * page - offset;
  // Physical pages come one by one; where one does not, c10 gives back the
  // others and fails.
  if (mapped > device_memory_ - reserved_bytes()) return std::nullopt;
  const bool small_pool = block.small_pool;
  unmapped(small_pool).erase({block.pool, block.stream, address});
  block.mapped = true;
  if (mapped < block.size) {
    Block& rest = blocks_[address + mapped] = block;
    rest.size = block.size - mapped;
    rest.mapped = false;
    unmapped(small_pool).insert({block.pool, block.stream, address + mapped});
    block.size = mapped;
  }
  const Merged merged = merge_neighbours(blocks_.find(address));
  insert_free(merged.block->first, merged.block->second);
  add(stats_.reserved_bytes, small_pool, mapped);
  ++stats_.num_device_alloc;
  notify("segment_map", address, mapped);
  return merged.block->first;
}

std::optional<std::int64_t> CachingAllocatorSim::unmap_block(std::int64_t address) {
  Block& block = blocks_.at(address);
  const std::int64_t page = page_size(block.small_pool), base = block.segment;
  // The whole pages inside the free block.
  const std::int64_t begin = base + (address - base + page - 1) / page * page;
  const std::int64_t end = base + (address + block.size - base) / page * page;
  if (begin >= end) return std::nullopt;
  const bool small_pool = block.small_pool;
  const int pool = block.pool, stream = block.stream;
  const std::int64_t block_end = address + block.size;
  erase_free(address, block);
  const Block free_part = block;
  if (begin > address) {  // the part before stays a free block
    block.size = begin - address;
    insert_free(address, block);
  }
  if (block_end > end) {
    Block& after = blocks_[end] = free_part;
    after.size = block_end - end;
    insert_free(end, after);
  }
  Block& space = blocks_[begin] = free_part;
  space.size = end - begin;
  space.mapped = false;
  const Merged merged = merge_neighbours(blocks_.find(begin));
  unmapped(small_pool).insert({pool, stream, merged.block->first});
  add(stats_.reserved_bytes, small_pool, -(end - begin));
  ++stats_.num_device_free;
  notify("segment_unmap", begin, end - begin);
  return merged.block->first;
}

void CachingAllocatorSim::release_block(std::int64_t address) {
  const std::int64_t size = segments_.at(address).size;
  const bool small_pool = blocks_.at(address).small_pool;
  notify("segment_free", address, size);
  add(stats_.segment, small_pool, -1);
  add(stats_.reserved_bytes, small_pool, -size);
  if (size >= config_.max_split_size) stats_.oversize_segments.decrease(1);
  ++stats_.num_device_free;
  erase_free(address, blocks_.at(address));
  blocks_.erase(address);
  segments_.erase(address);
}

bool CachingAllocatorSim::release_available_cached_blocks(int pool, bool small_pool, int stream,
                                                          std::int64_t rounded) {
  const std::int64_t max_split = config_.max_split_size;
  // With expandable segments every cached block is in one, and c10 frees
  // none of those here (only release_cached_blocks unmaps their pages).
  if (max_split == std::numeric_limits<std::int64_t>::max() || config_.expandable_segments) return false;
  auto& free = free_blocks(small_pool);
  const std::int64_t wanted = std::max(rounded, max_split);
  auto it = free.lower_bound({pool, stream, wanted, std::numeric_limits<std::int64_t>::min()});
  if (it != free.end() && it->pool == pool && it->stream == stream) {
    release_block(it->address);
    return true;
  }
  // No one block is large enough: free the stream's oversize blocks, largest first.
  std::int64_t released = 0;
  while (released < wanted && it != free.begin()) {
    const FreeBlock largest = *std::prev(it);
    if (largest.pool != pool || largest.stream != stream || largest.size < max_split) break;
    released += largest.size;
    release_block(largest.address);
    it = free.lower_bound(largest);
  }
  return released >= wanted;
}

void CachingAllocatorSim::release_cached_blocks() {
  // It waits for every stream first, and so for the work of every stream
  // that used a freed block.
  ++stats_.num_sync_all_streams;
  process_events();
  release_blocks(0);
  // Private pools no graph uses: their cached segments too; a pool left
  // with none is gone.
  for (auto it = pool_uses_.begin(); it != pool_uses_.end();) {
    if (it->second > 0) {
      ++it;
      continue;
    }
    const int pool = it->first;
    release_blocks(pool);
    const bool holds_segments = std::any_of(segments_.begin(), segments_.end(),
                                            [&](const auto& segment) { return segment.second.pool == pool; });
    it = holds_segments ? std::next(it) : pool_uses_.erase(it);
  }
}

void CachingAllocatorSim::release_blocks(int pool) {
  for (bool small_pool : {false, true}) {
    auto& free = free_blocks(small_pool);
    const auto first = free.lower_bound({pool, std::numeric_limits<int>::min(), 0, 0});
    std::vector<std::int64_t> addresses;
    for (auto it = first; it != free.end() && it->pool == pool; ++it) addresses.push_back(it->address);
    if (config_.expandable_segments) {
      // Unmap the whole pages of every free block; an address space left
      // with nothing mapped goes back too.
      for (const std::int64_t address : addresses) {
        const auto space = unmap_block(address);
        if (space && !is_split(blocks_.at(*space))) {
          const Block& block = blocks_.at(*space);
          unmapped(small_pool).erase({block.pool, block.stream, *space});
          blocks_.erase(*space);
          segments_.erase(*space);
        }
      }
      continue;
    }
    for (const std::int64_t address : addresses)
      if (!is_split(blocks_.at(address))) release_block(address);
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
  // The device's own large pool only (pool 0 comes first).
  auto own = [](const FreeBlock& free) { return free.pool == 0; };
  for (const FreeBlock& free : free_large_)
    if (own(free) && !is_split(blocks_.at(free.address))) total_age += age(free.address), ++freeable;
  bool freed = true;
  while (reclaimed < target && freed && freeable > 0) {
    const double threshold_age = static_cast<double>(total_age) / static_cast<double>(freeable);
    freed = false;
    for (auto it = free_large_.begin(); it != free_large_.end() && own(*it);) {
      const auto [pool, stream, size, address] = *it++;
      if (is_split(blocks_.at(address)) || static_cast<double>(age(address)) < threshold_age) continue;
      freed = true;
      reclaimed += size;
      total_age -= age(address);
      --freeable;
      release_block(address);
    }
  }
}

void CachingAllocatorSim::malloc(std::uint32_t id, std::int64_t bytes, int stream) {
  malloc_in_pool(id, bytes, stream, routes_.pool_for(stream));
}

void CachingAllocatorSim::malloc_in_pool(std::uint32_t id, std::int64_t bytes, int stream, int pool) {
  if (bytes <= 0 || address_of(id) != kUnallocated) return;  // nothing, or a block a pool restore gave it
  if (pool != 0 && !pool_uses_.contains(pool)) pool_uses_[pool] = 1;
  process_events();
  const std::int64_t rounded = round_size(bytes);
  const bool small_pool = rounded <= kSmallSize;
  std::optional<std::int64_t> found = get_free_block(pool, small_pool, stream, rounded);
  if (!found) {
    if (garbage_collecting()) garbage_collect_cached_blocks();
    const std::int64_t size = segment_size(rounded);
    // As c10: a new segment; else free the pool's cached oversize blocks
    // and retry; else free every cached whole segment and retry.
    found = alloc_block(pool, small_pool, stream, size, rounded, false);
    if (!found && release_available_cached_blocks(pool, small_pool, stream, rounded))
      found = alloc_block(pool, small_pool, stream, size, rounded, false);
    if (!found) {
      release_cached_blocks();
      found = alloc_block(pool, small_pool, stream, size, rounded, true);
    }
    if (!found) {
      ++stats_.num_ooms;
      throw MemoryExceeded("CUDA out of memory: the caching allocator cannot get " + std::to_string(size) +
                           " more bytes for a request of " + std::to_string(bytes) + " (" +
                           std::to_string(reserved_bytes()) + " reserved)");
    }
  }
  const std::int64_t address = *found;
  take_block(address, rounded, bytes, should_split(blocks_.at(address), rounded));
  bind(id, address);
}

std::optional<std::size_t> CachingAllocatorSim::first_granted(const std::vector<std::int64_t>& sizes, int stream,
                                                              int pool, std::int64_t device_memory) const {
  if (sizes.empty()) return std::nullopt;
  // Where the first request's new segment fits beside what is reserved,
  // it is granted (from a cached block or that segment): the common case,
  // without copying the allocator.
  const std::int64_t limit = std::min(device_memory, allowed_maximum_.value_or(device_memory));
  if (sizes[0] <= 0 || segment_size(round_size(sizes[0])) <= limit - reserved_bytes()) return 0;
  CachingAllocatorSim trial = *this;
  trial.listener_ = nullptr;
  trial.device_memory_ = device_memory;
  const auto id = static_cast<std::uint32_t>(address_of_.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    try {
      trial.malloc_in_pool(id, sizes[i], stream, pool);
      return i;
    } catch (const MemoryExceeded&) {
    }
  }
  return std::nullopt;
}

void CachingAllocatorSim::take_block(std::int64_t address, std::int64_t rounded, std::int64_t requested, bool split) {
  Block& block = blocks_.at(address);
  const bool small_pool = block.small_pool;
  const bool already_split = is_split(block);
  const std::int64_t remaining = block.size - rounded;
  // Splitting leaves a free remainder; otherwise the whole block is handed
  // out and counts as allocated.
  if (split) {
    block.size = rounded;
    Block& rest = blocks_[address + rounded] = {.segment = block.segment, .size = remaining, .pool = block.pool,
                                                .allocated = false, .small_pool = small_pool, .stream = block.stream};
    insert_free(address + rounded, rest);
  }
  // A free block of a split segment is an inactive split block (c10's
  // fragmentation statistic, which leaves out expandable segments: their
  // free pages can always be unmapped).
  if (!config_.expandable_segments) {
    if (split && already_split) {
      add(stats_.inactive_split_bytes, small_pool, -rounded);
    } else if (split) {
      add(stats_.inactive_split_bytes, small_pool, remaining);
      add(stats_.inactive_split, small_pool, 1);
    } else if (already_split) {
      add(stats_.inactive_split_bytes, small_pool, -block.size);
      add(stats_.inactive_split, small_pool, -1);
    }
  }
  block.allocated = true;
  block.requested = requested;
  add(stats_.allocation, small_pool, 1);
  add(stats_.allocated_bytes, small_pool, block.size);
  add(stats_.active, small_pool, 1);
  add(stats_.active_bytes, small_pool, block.size);
  add(stats_.requested_bytes, small_pool, requested);
  if (block.size >= config_.max_split_size) stats_.oversize_allocations.increase(1);
  notify("alloc", address, block.size);
}

void CachingAllocatorSim::bind(std::uint32_t id, std::int64_t address) {
  if (id >= address_of_.size())
    address_of_.resize(std::max<std::size_t>(id + 1, 2 * address_of_.size()), kUnallocated);
  address_of_[id] = address;
}

void CachingAllocatorSim::free(std::uint32_t id) {
  if (id >= address_of_.size() || address_of_[id] == kUnallocated) return;
  const std::int64_t address = address_of_[id];
  address_of_[id] = kUnallocated;
  free_allocation(blocks_.find(address));
}

void CachingAllocatorSim::free_allocation(Blocks::iterator it) {
  const std::int64_t address = it->first;
  Block& block = it->second;
  const bool small_pool = block.small_pool;
  const std::int64_t size = block.size;
  add(stats_.allocation, small_pool, -1);
  add(stats_.allocated_bytes, small_pool, -size);
  if (size >= config_.max_split_size) stats_.oversize_allocations.decrease(1);
  notify("free_requested", address, size);
  // Used on other streams: c10 records an event on each and frees the
  // block once they are done; it stays active until then.
  if (block.used_elsewhere) {
    block.awaiting_streams = true;
    awaiting_streams_.push_back(address);
    return;
  }
  free_block(it);
}

void CachingAllocatorSim::record_stream(std::uint32_t id, int stream) {
  if (id >= address_of_.size() || address_of_[id] == kUnallocated) return;
  const std::int64_t address = address_of_[id];
  // Uses on the block's own stream need no waiting.
  Block& block = blocks_.at(address);
  block.used_elsewhere |= block.stream != stream;
}

void CachingAllocatorSim::process_events() {
  for (const std::int64_t address : awaiting_streams_) free_block(blocks_.find(address));
  awaiting_streams_.clear();
}

void CachingAllocatorSim::free_block(Blocks::iterator it) {
  Block& block = it->second;
  const bool small_pool = block.small_pool;
  const std::int64_t address = it->first, size = block.size, requested = block.requested;
  notify("free_completed", address, size);
  block.allocated = block.used_elsewhere = block.awaiting_streams = false;
  block.requested = 0;

  // Merge with free neighbours in the same segment: each was an inactive
  // split block, and the merged block is one if its segment stays split.
  const Merged merged = merge_neighbours(it);
  insert_free(merged.block->first, merged.block->second);
  if (!config_.expandable_segments) {
    const bool still_split = is_split(merged.block->second);
    add(stats_.inactive_split, small_pool, (still_split ? 1 : 0) - merged.blocks);
    add(stats_.inactive_split_bytes, small_pool, (still_split ? merged.block->second.size : 0) - merged.bytes);
  }
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

std::vector<CachingAllocatorSim::SnapshotSegment> CachingAllocatorSim::snapshot_segments() const {
  std::vector<SnapshotSegment> segments;
  for (const auto& [base, segment] : segments_) {
    const auto end = blocks_.lower_bound(base + segment.size);
    for (auto it = blocks_.find(base); it != end;) {
      if (!it->second.mapped) {
        ++it;
        continue;
      }
      SnapshotSegment range{it->first, 0, segment.stream, it->second.small_pool, segment.expandable};
      for (; it != end && it->second.mapped; ++it) {
        range.size += it->second.size;
        if (!it->second.allocated) continue;
        range.active += it->second.size;
        if (it->second.awaiting_streams) continue;
        range.allocated += it->second.size;
        range.requested += it->second.requested;
      }
      segments.push_back(range);
    }
  }
  return segments;
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

void CachingAllocatorSim::begin_allocate_to_pool(int pool, std::optional<int> stream) {
  if (pool <= 0) throw std::invalid_argument("private pools are numbered from 1, got " + std::to_string(pool));
  if (released_pools_.contains(pool))
    throw std::invalid_argument("pool " + std::to_string(pool) + " was released; a new pool needs a new number");
  routes_.begin(pool, stream);
  ++pool_uses_[pool];
}

void CachingAllocatorSim::on_allocator_call(const AllocatorCall& call) {
  switch (call.kind) {
    case AllocatorCall::Kind::EmptyCache: empty_cache(); break;
    case AllocatorCall::Kind::PoolCheckpoint: checkpoints_.push_back(checkpoint_pool(call.pool)); break;
    case AllocatorCall::Kind::PoolRestore:
      restore_pool(checkpoints_.at(call.checkpoint), call.held_by, call.buffers);
      break;
  }
}

std::vector<CachingAllocatorSim::PoolBlock> CachingAllocatorSim::PoolCheckpoint::allocated_blocks() const {
  std::vector<PoolBlock> allocated;
  for (const auto& segment : segments)
    for (const PoolBlock& block : segment)
      if (block.allocated) allocated.push_back(block);
  return allocated;
}

CachingAllocatorSim::PoolCheckpoint CachingAllocatorSim::checkpoint_pool(int pool) const {
  PoolCheckpoint checkpoint{pool, {}};
  const std::map<std::int64_t, std::uint32_t> held = allocations_in_pool(pool);
  auto add_segment = [&](std::int64_t base) {
    auto& blocks = checkpoint.segments.emplace_back();
    const auto end = blocks_.lower_bound(base + segments_.at(base).size);
    for (auto it = blocks_.find(base); it != end; ++it) {
      const Block& block = it->second;
      if (block.awaiting_streams)
        throw std::invalid_argument("cannot checkpoint private pool " + std::to_string(pool) +
                                    ": a block freed while other streams use it has not gone back yet");
      blocks.push_back(
          {it->first, block.size, block.allocated, block.stream, block.allocated ? held.at(it->first) : 0});
    }
  };
  for (const auto& [base, segment] : segments_)
    if (segment.pool == pool && blocks_.at(base).allocated) add_segment(base);
  // The order c10 cannot tell: the one whose restore peaks highest, the
  // segment with the most free bytes last.
  auto free_bytes = [](const std::vector<PoolBlock>& segment) {
    std::int64_t bytes = 0;
    for (const PoolBlock& block : segment) bytes += block.allocated ? 0 : block.size;
    return bytes;
  };
  std::stable_sort(checkpoint.segments.begin(), checkpoint.segments.end(),
                   [&](const auto& a, const auto& b) { return free_bytes(a) < free_bytes(b); });
  for (const FreeBlocks* free : {&free_small_, &free_large_})
    for (const FreeBlock& block : *free)
      if (block.pool == pool && segments_.contains(block.address)) add_segment(block.address);
  return checkpoint;
}

std::map<std::int64_t, std::uint32_t> CachingAllocatorSim::allocations_in_pool(int pool) const {
  std::map<std::int64_t, std::uint32_t> held;
  for (std::uint32_t id = 0; id < address_of_.size(); ++id)
    if (address_of_[id] != kUnallocated && blocks_.at(address_of_[id]).pool == pool) held[address_of_[id]] = id;
  return held;
}

void CachingAllocatorSim::restore_pool(const PoolCheckpoint& checkpoint, const std::vector<std::uint32_t>& held_by,
                                       const std::vector<std::uint32_t>& buffers) {
  const int pool = checkpoint.pool;
  auto refuse = [&](const std::string& why) {
    throw std::invalid_argument("cannot return private pool " + std::to_string(pool) + " to its checkpoint: " + why +
                                " (a trace replays only under the allocator settings it was traced with)");
  };
  if (config_.expandable_segments) refuse("expandable segments are not simulated there");
  std::map<std::uint32_t, std::uint32_t> holder;  // by the buffer that held the block at the checkpoint
  for (std::size_t i = 0; i < held_by.size() && i < buffers.size(); ++i) holder[held_by[i]] = buffers[i];
  for (const PoolBlock& block : checkpoint.allocated_blocks())
    if (!holder.contains(block.buffer))
      refuse("no buffer holds the block of buffer " + std::to_string(block.buffer) + " again");
  for (const auto& [address, id] : allocations_in_pool(pool)) {
    address_of_[id] = kUnallocated;
    free_allocation(blocks_.find(address));
  }
  for (const auto& segment : checkpoint.segments) {
    for (const PoolBlock& state : segment) {
      const auto it = blocks_.find(state.address);
      if (it == blocks_.end() || it->second.allocated || it->second.pool != pool || it->second.size < state.size)
        refuse("it holds no free block of " + std::to_string(state.size) + " bytes at " +
               std::to_string(state.address));
      erase_free(it->first, it->second);
      take_block(state.address, state.size, state.size, it->second.size > state.size);
    }
    for (const PoolBlock& state : segment) {
      if (state.allocated)
        bind(holder.at(state.buffer), state.address);
      else
        free_allocation(blocks_.find(state.address));
    }
  }
}

void CachingAllocatorSim::end_allocate_to_pool(int pool) { routes_.end(pool); }

void CachingAllocatorSim::release_pool(int pool) {
  const auto uses = pool_uses_.find(pool);
  if (uses == pool_uses_.end() || uses->second == 0)
    throw std::invalid_argument("pool " + std::to_string(pool) + " has no use to release");
  // c10 would go on routing to a pool empty_cache() may free.
  if (routes_.routes(pool))
    throw std::invalid_argument("requests are routed to pool " + std::to_string(pool) + ": end that first");
  if (--uses->second == 0) released_pools_.insert(pool);
}

}  // namespace metamem
