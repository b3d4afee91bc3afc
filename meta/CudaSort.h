// cub's radix sort as libtorch calls it on CUDA (meta/CudaSort.cpp): for
// the plans of kernels that sort (sorts, an embedding's gradient).
#pragma once

#include <cstdint>
#include <optional>

namespace metamem {

// The temporary storage cub 3.0's DeviceRadixSort asks for to sort `n`
// keys of `key_bytes` on `bits` of each, with values of `value_bytes` (0
// for keys alone), on the traced GPU's architecture, n passed as int64_t as
// libtorch passes it. nullopt where cub sizes it by its kernels'
// occupancy, which a trace cannot know (keys under 4 bytes before sm90,
// past one block's tile), and for keys under 4 bytes with values other
// than libtorch's 8-byte indices.
std::optional<std::int64_t> cub_radix_sort_bytes(std::int64_t n, std::int64_t key_bytes, std::int64_t value_bytes,
                                                 int bits);

}  // namespace metamem
