// Writes Python pickles (protocol 2) of plain dicts, lists, strings, ints
// and booleans: no GLOBAL or REDUCE opcodes, so any unpickler can read them.
#pragma once

#include <cstdint>
#include <string>

namespace metamem {

class PickleWriter {
 public:
  PickleWriter();
  void begin_dict();  // then key, value, key, value, ...
  void end_dict();
  void begin_list();
  void end_list();
  void string(const std::string& s);
  void integer(std::int64_t value);
  void boolean(bool value);
  // The finished pickle; the writer is spent.
  std::string finish();

 private:
  std::string out_;
};

}  // namespace metamem
