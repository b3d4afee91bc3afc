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

std::int64_t parse_integer(std::string_view field, const char* what, const std::string& at) {
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), value);
  if (field.empty() || error != std::errc() || end != field.data() + field.size())
    throw InputError(at + what + " is not an integer: '" + std::string(field) + "'");
  return value;
}

}  // namespace

std::vector<LiveRange> read_ranges_csv(std::istream& in) {
  std::vector<LiveRange> ranges;
  std::unordered_map<std::int64_t, std::size_t> line_of_id;
  std::string text;
  for (std::size_t line = 1; std::getline(in, text); ++line) {
    const std::string at = "line " + std::to_string(line) + ": ";
    const std::string_view content = trim(text);
    if (content.empty() || content.front() == '#') continue;
    if (line == 1 && content.substr(0, 3) == "id,") continue;  // header
    const auto fields = split(content);
    if (fields.size() != 4 && fields.size() != 5)
      throw InputError(at + "expected id,first,last,bytes[,pinned], got " +
                       std::to_string(fields.size()) + " fields");
    LiveRange r;
    r.id = parse_integer(fields[0], "id", at);
    r.first = parse_integer(fields[1], "first", at);
    r.last = parse_integer(fields[2], "last", at);
    r.bytes = parse_integer(fields[3], "bytes", at);
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
    ranges.push_back(r);
  }
  return ranges;
}

void write_ranges_csv(std::ostream& out, const std::vector<LiveRange>& ranges) {
  out << "id,first,last,bytes,pinned\n";
  for (const LiveRange& r : ranges)
    out << r.id << ',' << r.first << ',' << r.last << ',' << r.bytes << ',' << (r.pinned ? 1 : 0)
        << '\n';
}

}  // namespace memonger
