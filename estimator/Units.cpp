#include "estimator/Units.h"

#include <fmt/format.h>

#include <cmath>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <utility>

namespace metamem {

std::string human_bytes(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (std::abs(value) >= 1024 && unit < 4) value /= 1024, ++unit;
  return unit == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.2f} {}", value, units[unit]);
}

std::string human_flops(std::int64_t flops) {
  const char* units[] = {"FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP"};
  double value = static_cast<double>(flops);
  int unit = 0;
  while (std::abs(value) >= 1000 && unit < 5) value /= 1000, ++unit;
  return unit == 0 ? fmt::format("{} FLOP", flops) : fmt::format("{:.2f} {}", value, units[unit]);
}

namespace {

using Unit = std::pair<const char*, double>;

// A positive finite number, then one of `units` or none (factor 1), scaled
// by the unit; nullopt for anything else.
std::optional<double> parse_scaled(const std::string& text, std::initializer_list<Unit> units) {
  std::size_t used = 0;
  double number = -1;
  try {
    number = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  const std::string unit = text.substr(used);
  double scale = unit.empty() ? 1.0 : 0.0;
  for (const auto& [name, factor] : units)
    if (unit == name) scale = factor;
  if (scale == 0.0 || !(number > 0) || !std::isfinite(number)) return std::nullopt;
  return number * scale;
}

}  // namespace

std::int64_t parse_memory(const std::string& text, const std::string& what) {
  const auto bytes = parse_scaled(text, {{"TiB", 1099511627776.0}, {"GiB", 1073741824.0}, {"MiB", 1048576.0},
                                         {"KiB", 1024.0}, {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6},
                                         {"KB", 1e3}, {"B", 1.0}});
  if (!bytes || *bytes >= 9.2e18)
    throw std::invalid_argument(what + " expects a size such as 80GiB or 40GB, got '" + text + "'");
  return static_cast<std::int64_t>(*bytes);
}

std::int64_t parse_memory_or_zero(const std::string& text, const std::string& what) {
  return text == "0" ? 0 : parse_memory(text, what);
}

double parse_seconds(const std::string& text, const std::string& what) {
  const auto seconds = parse_scaled(text, {{"ms", 1e-3}, {"s", 1.0}, {"min", 60.0}});
  if (!seconds || *seconds > 1e9)
    throw std::invalid_argument(what + " expects a duration such as 10s or 500ms, got '" + text + "'");
  return *seconds;
}

}  // namespace metamem
