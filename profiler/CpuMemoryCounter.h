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
  std::int64_t live_bytes() const;
  std::int64_t peak_bytes() const;
};

// Bytes live through the counting allocator now (0 before it is installed).
std::int64_t cpu_live_bytes();

}  // namespace metamem
