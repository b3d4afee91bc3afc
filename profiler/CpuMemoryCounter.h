// Counts bytes held through libtorch's CPU allocator: the *achieved* memory
// of a real CPU run, to compare with a trace's prediction.
#pragma once

#include <cstdint>

namespace metamem {

class CpuMemoryCounter {
 public:
  // Installs the counting allocator the first time (it stays installed for
  // the process) and starts with the bytes already live.
  CpuMemoryCounter();

  // Peak restarts from the bytes live now.
  void reset_peak();
  // Bytes live now (0 before any counter installed the allocator).
  static std::int64_t live_bytes();
  std::int64_t peak_bytes() const;
};

}  // namespace metamem
