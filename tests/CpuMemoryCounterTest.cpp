// The CPU allocator's counting while compiling: what torch.compile makes on
// the CPU is not the step's, but what it leaves behind (an optimizer's
// state) is, counted when compiling ends; a block the listener did not hear
// of as it was made (a trace's own known values) never is. And a listener
// unset is called no more, whatever other threads allocate.
#include <gtest/gtest.h>
#include <torch/types.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
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

// Holds the first allocation another thread tells it of until released.
class BlockingListener final : public CpuAllocationListener {
 public:
  explicit BlockingListener(std::thread::id blocked) : blocked_(blocked) {}
  void on_cpu_alloc(void*, std::size_t) override {
    if (std::this_thread::get_id() != blocked_ || entered.exchange(true)) return;
    inside = true;
    release.get_future().wait();
    inside = false;
  }
  void on_cpu_free(void*) override {}

  std::atomic<bool> entered{false};
  std::atomic<bool> inside{false};
  std::promise<void> release;

 private:
  std::thread::id blocked_;
};

// A trace's recorder is unset and then destroyed while a DataLoader's
// thread may be in its call: unsetting waits for that call to return.
TEST(CpuMemoryCounter, UnsettingAListenerWaitsForTheCallsAnotherThreadIsIn) {
  std::promise<std::thread::id> allocator_id;
  std::promise<void> go;
  std::thread allocator([&] {
    allocator_id.set_value(std::this_thread::get_id());
    go.get_future().wait();
    at::empty({16});
  });
  BlockingListener listener(allocator_id.get_future().get());
  CpuMemoryCounter::set_listener(&listener);
  go.set_value();
  while (!listener.inside) std::this_thread::yield();

  std::atomic<bool> called_when_unset{false};
  std::thread unsetter([&] {
    CpuMemoryCounter::set_listener(nullptr);
    called_when_unset = listener.inside.load();
  });
  // Time for an unset that does not wait to return while the call is in.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  listener.release.set_value();
  unsetter.join();
  allocator.join();
  EXPECT_FALSE(called_when_unset);
}

}  // namespace
}  // namespace metamem
