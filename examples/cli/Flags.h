// A small flag parser for the metamem commands: --name VALUE, --switch,
// positionals. Every mistake is a UsageError (exit code 2).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace metamem::cli {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Flags {
 public:
  void add(const std::string& name, std::int64_t* value) { ints_[name] = value; }
  void add(const std::string& name, std::string* value, std::vector<std::string> allowed = {}) {
    strings_[name] = {value, std::move(allowed)};
  }
  void add_switch(const std::string& name, bool* value) { switches_[name] = value; }
  // May be given several times; each value is appended.
  void add_list(const std::string& name, std::vector<std::string>* values) { lists_[name] = values; }
  // parse() adds the name of each flag it meets to *given.
  void record_given(std::set<std::string>* given) { given_ = given; }

  // Parses args (the command name excluded); returns the positionals.
  std::vector<std::string> parse(const std::vector<std::string>& args) const;

 private:
  struct Choice {
    std::string* value;
    std::vector<std::string> allowed;
  };
  std::map<std::string, std::int64_t*> ints_;
  std::map<std::string, Choice> strings_;
  std::map<std::string, bool*> switches_;
  std::map<std::string, std::vector<std::string>*> lists_;
  std::set<std::string>* given_ = nullptr;
};

}  // namespace metamem::cli
