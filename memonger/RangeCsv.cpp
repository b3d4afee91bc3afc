#include "memonger/RangeCsv.h"

#include <charconv>
#include <string>
#include <string_view>
#include <unordered_map>

namespace memonger {
namespace {

std::string_view trim(std::string_view s) {
  const auto begin = s.find_first_not_of(" \t\r");
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(" \t\r") - begin + 1);
}

std::vector<std::string_view> split(std::string_view line) {
  std::vector<std::string_view> fields;
  std::size_t start = 0;
  for (;;) {
    const auto comma = line.find(',', start);
    fields.push_back(trim(line.substr(start, comma - start)));
    if (comma == std::string_view::npos) return fields;
    start = comma + 1;
  }
}

// A field as an error message shows it: bytes that are not printable ASCII
// as \xNN, and no more than 40 of them (a binary file's first line is one
// field of thousands of bytes).
std::string shown(std::string_view field) {
  constexpr std::size_t kShown = 40;
  std::string text;
  for (const char c : field.substr(0, kShown)) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f) {
      text += c;
    } else {
      constexpr char kHex[] = "0123456789abcdef";
      text += {'\\', 'x', kHex[byte >> 4], kHex[byte & 0xf]};
    }
  }
  return field.size() > kShown ? text + "..." : text;
}

std::int64_t parse_integer(std::string_view field, const char* what, const std::string& at) {
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), value);
  if (field.empty() || error != std::errc() || end != field.data() + field.size())
    throw InputError(at + what + " is not an integer: '" + shown(field) + "'");
  return value;
}

}  // namespace

RangeTable read_ranges_csv(std::istream& in) {
  RangeTable table;
  std::unordered_map<std::int64_t, std::size_t> line_of_id;
  std::string text;
  for (std::size_t line = 1; std::getline(in, text); ++line) {
    // A spreadsheet's UTF-8 export begins with a byte-order mark.
    if (line == 1 && text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
    const std::string at = "line " + std::to_string(line) + ": ";
    const std::string_view content = trim(text);
    if (content.empty() || content.front() == '#') continue;
    if (line == 1 && content.substr(0, 3) == "id,") {  // header
      if (content == "id,lower,upper,size") table.layout = RangeLayout::kMiniMalloc;
      continue;
    }
    const bool minimalloc = table.layout == RangeLayout::kMiniMalloc;
    const auto fields = split(content);
    if (minimalloc ? fields.size() != 4 : fields.size() != 4 && fields.size() != 5)
      throw InputError(at + "expected " + (minimalloc ? "id,lower,upper,size" : "id,first,last,bytes[,pinned]") +
                       ", got " + std::to_string(fields.size()) + " fields");
    LiveRange r;
    r.id = parse_integer(fields[0], "id", at);
    r.first = parse_integer(fields[1], minimalloc ? "lower" : "first", at);
    r.last = parse_integer(fields[2], minimalloc ? "upper" : "last", at);
    r.bytes = parse_integer(fields[3], minimalloc ? "size" : "bytes", at);
    if (minimalloc) {
      if (r.last <= r.first) throw InputError(at + "upper must be above lower (lifetimes are [lower, upper))");
      --r.last;
    }
    if (fields.size() == 5) {
      const std::int64_t pinned = parse_integer(fields[4], "pinned", at);
      if (pinned != 0 && pinned != 1) throw InputError(at + "pinned must be 0 or 1");
      r.pinned = pinned == 1;
    }
    if (const char* reason = invalid_reason(r)) throw InputError(at + reason);
    const auto [seen, added] = line_of_id.try_emplace(r.id, line);
    if (!added)
      throw InputError(at + "duplicate id " + std::to_string(r.id) + " (first on line " +
                       std::to_string(seen->second) + ")");
    table.ranges.push_back(r);
  }
  return table;
}

void write_ranges_csv(std::ostream& out, const RangeTable& table, const std::vector<std::int64_t>& offsets) {
  const bool minimalloc = table.layout == RangeLayout::kMiniMalloc;
  const bool placed = !offsets.empty();
  out << (minimalloc ? "id,lower,upper,size" : "id,first,last,bytes,pinned") << (placed ? ",offset\n" : "\n");
  for (std::size_t i = 0; i < table.ranges.size(); ++i) {
    const LiveRange& r = table.ranges[i];
    out << r.id << ',' << r.first << ',' << (minimalloc ? r.last + 1 : r.last) << ',' << r.bytes;
    if (!minimalloc) out << ',' << (r.pinned ? 1 : 0);
    if (placed) out << ',' << offsets[i];
    out << '\n';
  }
}

}  // namespace memonger
