#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace metamem {

// The whole of `text` as a base-10 integer, or nothing ("12x", "", overflow).
std::optional<std::int64_t> parse_integer(const std::string& text);

}  // namespace metamem
