#include "examples/cli/Flags.h"

#include "examples/zoo/ParseInteger.h"

#include <algorithm>

namespace metamem::cli {
namespace {

std::int64_t parse_int(const std::string& flag, const std::string& text) {
  const auto value = parse_integer(text);
  if (!value) throw UsageError(flag + " expects an integer, got '" + text + "'");
  return *value;
}

std::string join(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : "|") + w;
  return out;
}

}  // namespace

std::vector<std::string> Flags::parse(const std::vector<std::string>& args) const {
  std::vector<std::string> positionals;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (flag.rfind("--", 0) != 0) {
      positionals.push_back(flag);
      continue;
    }
    const bool takes_value = ints_.count(flag) || strings_.count(flag) || lists_.count(flag);
    if (!takes_value && !switches_.count(flag)) throw UsageError("unknown flag '" + flag + "'");
    if (given_ != nullptr) given_->insert(flag);
    if (auto s = switches_.find(flag); s != switches_.end()) {
      *s->second = true;
      continue;
    }
    if (i + 1 >= args.size()) throw UsageError(flag + " needs a value");
    const std::string& value = args[++i];
    if (auto list = lists_.find(flag); list != lists_.end()) {
      list->second->push_back(value);
      continue;
    }
    if (auto n = ints_.find(flag); n != ints_.end()) {
      *n->second = parse_int(flag, value);
      continue;
    }
    const Choice& choice = strings_.at(flag);
    if (!choice.allowed.empty() &&
        std::find(choice.allowed.begin(), choice.allowed.end(), value) == choice.allowed.end())
      throw UsageError(flag + " must be " + join(choice.allowed) + ", got '" + value + "'");
    *choice.value = value;
  }
  return positionals;
}

}  // namespace metamem::cli
