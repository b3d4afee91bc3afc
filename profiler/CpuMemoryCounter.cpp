#include "profiler/CpuMemoryCounter.h"

#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace metamem {
namespace {

// Data pointer and context are the same, as raw_allocate() requires (oneDNN
// allocates through it), so sizes are looked up by address on free.
class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t nbytes) override {
    if (nbytes == 0) return {nullptr, nullptr, &release, c10::Device(c10::kCPU)};
    void* data = c10::GetDefaultCPUAllocator()->raw_allocate(nbytes);
    if (t_uncounted > 0) {
      bool heard = true;
      tell_listener([&](CpuAllocationListener& listener) { heard = listener.hears_allocations_now(); });
      std::lock_guard<std::mutex> lock(mutex_);
      sizes_[data] = 0;  // counted only if it outlives the guard, and the listener hears of it now
      if (heard) deferred_[data] = {nbytes, std::this_thread::get_id()};
    } else {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        sizes_[data] = nbytes;
      }
      count(data, nbytes);
    }
    return {data, data, &release, c10::Device(c10::kCPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  static void release(void* data) {
    if (data == nullptr) return;
    tell_listener([&](CpuAllocationListener& listener) { listener.on_cpu_free(data); });
    std::size_t nbytes = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = sizes_.find(data);
      nbytes = it->second;
      sizes_.erase(it);
      deferred_.erase(data);
    }
    live_.fetch_sub(static_cast<std::int64_t>(nbytes));
    c10::GetDefaultCPUAllocator()->raw_deleter()(data);
  }

  // The blocks this thread made while uncounted and still holds are
  // counted (and told to the listener) as made now.
  static void count_deferred() {
    std::vector<std::pair<void*, std::size_t>> alive;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto it = deferred_.begin(); it != deferred_.end();) {
        if (it->second.second != std::this_thread::get_id()) {
          ++it;
          continue;
        }
        alive.emplace_back(it->first, it->second.first);
        sizes_[it->first] = it->second.first;
        it = deferred_.erase(it);
      }
    }
    for (const auto& [data, nbytes] : alive) count(data, nbytes);
  }

  static thread_local int t_uncounted;

  static std::int64_t live() { return live_.load(); }
  static std::int64_t peak() { return peak_.load(); }
  static void reset_peak() { peak_.store(live_.load()); }
  // Returns once no thread can still be telling the listener it replaced:
  // a recorder unset at the end of a trace is destroyed next, while a
  // DataLoader's pin-memory thread or the user's own may be allocating.
  static void set_listener(CpuAllocationListener* listener) {
    listener_.store(listener);
    while (tellers_.load() != 0) std::this_thread::yield();
  }

 private:
  static void count(void* data, std::size_t nbytes) {
    const std::int64_t live = live_.fetch_add(static_cast<std::int64_t>(nbytes)) +
                              static_cast<std::int64_t>(nbytes);
    std::int64_t peak = peak_.load();
    while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
    }
    tell_listener([&](CpuAllocationListener& listener) { listener.on_cpu_alloc(data, nbytes); });
  }

  // Counted from before the listener is read until its call returns, so
  // that set_listener can wait for every call that read the old one. The
  // count and the pointer are sequentially consistent: a teller that read
  // the old listener has its count seen by the set_listener that replaced it.
  template <typename Tell>
  static void tell_listener(Tell&& tell) {
    struct Teller {
      Teller() { tellers_.fetch_add(1); }
      ~Teller() { tellers_.fetch_sub(1); }
    } teller;
    if (auto* listener = listener_.load()) tell(*listener);
  }

  static std::mutex mutex_;
  static std::unordered_map<void*, std::size_t> sizes_;
  // Uncounted blocks alive: their sizes and the threads that made them.
  static std::unordered_map<void*, std::pair<std::size_t, std::thread::id>> deferred_;
  static std::atomic<std::int64_t> live_;
  static std::atomic<std::int64_t> peak_;
  static std::atomic<CpuAllocationListener*> listener_;
  static std::atomic<int> tellers_;
};

thread_local int CountingAllocator::t_uncounted = 0;
std::mutex CountingAllocator::mutex_;
std::unordered_map<void*, std::size_t> CountingAllocator::sizes_;
std::unordered_map<void*, std::pair<std::size_t, std::thread::id>> CountingAllocator::deferred_;
std::atomic<std::int64_t> CountingAllocator::live_{0};
std::atomic<std::int64_t> CountingAllocator::peak_{0};
std::atomic<CpuAllocationListener*> CountingAllocator::listener_{nullptr};
std::atomic<int> CountingAllocator::tellers_{0};

void install_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingAllocator allocator;
    // Above the default allocator's priority (0), so ours stays in place.
    c10::SetCPUAllocator(&allocator, /*priority=*/100);
  });
}

}  // namespace

CpuMemoryCounter::CpuMemoryCounter() {
  install_once();
  CountingAllocator::reset_peak();
}

void CpuMemoryCounter::set_listener(CpuAllocationListener* listener) {
  install_once();
  CountingAllocator::set_listener(listener);
}

UncountedCpuAllocations::UncountedCpuAllocations() { ++CountingAllocator::t_uncounted; }
UncountedCpuAllocations::~UncountedCpuAllocations() {
  if (--CountingAllocator::t_uncounted == 0) CountingAllocator::count_deferred();
}

void CpuMemoryCounter::reset_peak() { CountingAllocator::reset_peak(); }
std::int64_t CpuMemoryCounter::live_bytes() { return CountingAllocator::live(); }
std::int64_t CpuMemoryCounter::peak_bytes() const { return CountingAllocator::peak(); }

}  // namespace metamem
