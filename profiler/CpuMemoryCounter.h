// Counts bytes held through libtorch's CPU allocator: the *achieved* memory
// of a real CPU run, to compare with a trace's prediction.
#pragma once

#include <cstddef>
#include <cstdint>

namespace metamem {

// Sees every allocation and free made through libtorch's CPU allocator
// while it is set (a trace on a fake cpu records the traced code's own).
class CpuAllocationListener {
 public:
  virtual ~CpuAllocationListener() = default;
  virtual void on_cpu_alloc(void* data, std::size_t bytes) = 0;
  virtual void on_cpu_free(void* data) = 0;
  // Whether what this thread allocates now is the listener's to hear of,
  // asked as the block is made: a block made while uncounted is told of
  // only when the guard ends, when the answer may have changed.
  virtual bool hears_allocations_now() const { return true; }
};

// While alive, what this thread allocates through the CPU allocator is not
// counted (nor told to the listener) until the guard ends, and then only
// what is still held, as allocated then: compiling (torch.compile's Dynamo
// and Inductor) is not the step, in a trace as in the real run it is
// compared with, but what it leaves behind is (the optimizer state Dynamo
// makes while it traces an optimizer's step).
class UncountedCpuAllocations {
 public:
  UncountedCpuAllocations();
  ~UncountedCpuAllocations();
  UncountedCpuAllocations(const UncountedCpuAllocations&) = delete;
  UncountedCpuAllocations& operator=(const UncountedCpuAllocations&) = delete;
};

class CpuMemoryCounter {
 public:
  // Installs the counting allocator (once: it stays for the process) and
  // sets the listener, or unsets it with nullptr. Returns once no thread is
  // still calling the listener it replaced, which may then be destroyed.
  static void set_listener(CpuAllocationListener* listener);

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
