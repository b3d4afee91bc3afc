// The CPU allocator's counting while compiling: what torch.compile makes on
// the CPU is not the step's, but what it leaves behind (an optimizer's
// state) is, counted when compiling ends; a block the listener did not hear
// of as it was made (a trace's own known values) never is.
#include <gtest/gtest.h>
#include <torch/types.h>

#include <vector>

#include "profiler/CpuMemoryCounter.h"

namespace metamem {
namespace {

class Listener final : public CpuAllocationListener {
 public:
  void on_cpu_alloc(void*, std::size_t bytes) override { heard.push_back(static_cast<std::int64_t>(bytes)); }
  void on_cpu_free(void*) override {}
  bool hears_allocations_now() const override { return hears; }

  bool hears = true;
  std::vector<std::int64_t> heard;
};

TEST(CpuMemoryCounter, WhatCompilingLeavesIsHeardOfWhenItEndsUnlessNotHeardAsItWasMade) {
  Listener listener;
  CpuMemoryCounter::set_listener(&listener);
  at::Tensor kept, own;
  {
    UncountedCpuAllocations compiling;
    kept = at::empty({64});                   // 256 B, held past the guard
    at::empty({32});                          // freed inside it: never the step's
    listener.hears = false;
    own = at::empty({192});                   // the listener's own, made while it hears nothing
    listener.hears = true;
    EXPECT_TRUE(listener.heard.empty());      // nothing is heard of while compiling
  }
  CpuMemoryCounter::set_listener(nullptr);
  EXPECT_EQ(listener.heard, std::vector<std::int64_t>{256});
}

}  // namespace
}  // namespace metamem
