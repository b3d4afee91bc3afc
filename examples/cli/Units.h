#pragma once

#include <fmt/core.h>

#include <cstdint>
#include <string>

namespace metamem::cli {

// 1536 -> "1.50 KiB"; below 1 KiB, exact bytes.
inline std::string human_bytes(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) value /= 1024, ++unit;
  return unit == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.2f} {}", value, units[unit]);
}

}  // namespace metamem::cli
