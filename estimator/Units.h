// Sizes and counts as people read and write them.
#pragma once

#include <cstdint>
#include <string>

namespace metamem {

// 1536 -> "1.50 KiB"; below 1 KiB, exact bytes.
std::string human_bytes(std::int64_t bytes);

// 7'550'000'000 -> "7.55 GFLOP"; below 1000, exact.
std::string human_flops(std::int64_t flops);

// "80GiB", "1.5TB", "512MiB", "4096" (bytes) -> bytes. Throws
// std::invalid_argument naming `what` (e.g. "--memory") for anything else.
std::int64_t parse_memory(const std::string& text, const std::string& what);
// The same, and "0": a size measured as nothing (--cuda-context 0).
std::int64_t parse_memory_or_zero(const std::string& text, const std::string& what);

// "10s", "500ms", "2min", "1.5" (seconds) -> seconds. Throws
// std::invalid_argument naming `what` for anything else.
double parse_seconds(const std::string& text, const std::string& what);

}  // namespace metamem
