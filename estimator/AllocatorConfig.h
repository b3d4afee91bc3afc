// PYTORCH_ALLOC_CONF (PYTORCH_CUDA_ALLOC_CONF before torch 2.9), as torch 2.x's caching allocator reads it
// (c10/core/AllocatorConfig.cpp): the options the simulator follows.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string>

namespace metamem {

struct AllocatorConfig {
  // roundup_power2_divisions, per power-of-two interval of request sizes:
  // [0] up to 2 MiB, then one per power of two up to [15] from 32 GiB on.
  // 0 and 1: no rounding beyond 512 bytes.
  std::array<std::int64_t, 16> divisions{};
  // max_split_size_mb: blocks of this size or more are never split.
  std::int64_t max_split_size = std::numeric_limits<std::int64_t>::max();
  // max_non_split_rounding_mb: a block at or above max_split_size serves a
  // request at most this much smaller.
  std::int64_t max_non_split_rounding_size = 20 << 20;
  // large_segment_size_mb: the segment requests of 1 to 10 MiB share.
  std::int64_t large_segment_size = 20 << 20;
  // per_process_memory_fraction (0: unset): the allocator reserves at most
  // this share of the device's memory.
  double per_process_memory_fraction = 0;
  // garbage_collection_threshold (0: off): with a memory fraction, cached
  // whole segments are freed, oldest first, once the reserved bytes pass
  // this share of the fraction.
  double garbage_collection_threshold = 0;
  bool expandable_segments = false;

  // All intervals `n` divisions (torch 1.x's single roundup_power2_divisions).
  static AllocatorConfig with_divisions(std::int64_t n);
  // The divisions a request of `bytes` rounds with.
  std::int64_t divisions_for(std::int64_t bytes) const;
};

// Parses a PYTORCH_ALLOC_CONF string ("" is the default); throws
// std::invalid_argument, naming `source` (where the text came from), for
// what torch would refuse and for options metamem does not simulate
// (backend:cudaMallocAsync).
AllocatorConfig parse_allocator_config(const std::string& text, const std::string& source = "PYTORCH_ALLOC_CONF");

// The variable a torch process started here would read: PYTORCH_ALLOC_CONF,
// or PYTORCH_CUDA_ALLOC_CONF (its older name) where only that one is set.
const char* allocator_config_variable();
// Its setting, else "".
std::string allocator_config_from_environment();

}  // namespace metamem
