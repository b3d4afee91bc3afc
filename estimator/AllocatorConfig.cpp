#include "estimator/AllocatorConfig.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace metamem {
namespace {

constexpr std::int64_t kMiB = 1 << 20;
constexpr int kFirstIntervalLog2 = 20;  // intervals start at 1 MiB

// Splits as c10 does: ',' ':' '[' ']' are tokens of their own, spaces vanish.
std::vector<std::string> tokens(const std::string& text) {
  std::vector<std::string> out;
  std::string word;
  for (char c : text) {
    if (c == ',' || c == ':' || c == '[' || c == ']') {
      if (!word.empty()) out.push_back(std::move(word)), word.clear();
      out.emplace_back(1, c);
    } else if (c != ' ') {
      word += c;
    }
  }
  if (!word.empty()) out.push_back(word);
  return out;
}

class Parser {
 public:
  Parser(const std::string& text, std::string source) : tokens_(tokens(text)), source_(std::move(source)) {}
  bool done() const { return i_ >= tokens_.size(); }
  const std::string& next(const char* what) {
    if (done()) fail(std::string("expected ") + what + " at its end");
    return tokens_[i_++];
  }
  void expect(const char* token) {
    if (next(token) != token) fail(std::string("expected '") + token + "' after '" + tokens_[i_ - 2] + "'");
  }
  bool peek(const char* token) const { return !done() && tokens_[i_] == token; }
  std::int64_t integer(const char* what) {
    const std::string& word = next(what);
    std::size_t used = 0;
    std::int64_t value = -1;
    try {
      value = std::stoll(word, &used);
    } catch (const std::exception&) {
    }
    if (used != word.size() || value < 0) fail(std::string(what) + " is not a whole number: '" + word + "'");
    return value;
  }
  bool boolean(const char* key) {
    const std::string& word = next("True or False");
    if (word != "True" && word != "False") fail(std::string(key) + " takes True or False, not '" + word + "'");
    return word == "True";
  }
  // A number in (0, 1), or (0, 1] where `one` is allowed.
  double fraction(const char* key, bool one) {
    const std::string& word = next("a number");
    std::size_t used = 0;
    double value = 0;
    try {
      value = std::stod(word, &used);
    } catch (const std::exception&) {
    }
    if (used != word.size() || !(value > 0 && (value < 1 || (one && value == 1))))
      fail(std::string(key) + " is a number in (0, 1" + (one ? "]" : ")") + ", not '" + word + "'");
    return value;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument(source_ + ": " + what);
  }

 private:
  std::vector<std::string> tokens_;
  std::string source_;  // where the text came from, for errors
  std::size_t i_ = 0;
};

int interval_of(std::int64_t bytes) {
  const int log2 = 63 - std::countl_zero(static_cast<std::uint64_t>(bytes));
  return std::clamp(log2 - kFirstIntervalLog2, 0, 15);
}

std::int64_t power_of_two_divisions(Parser& p) {
  const std::int64_t n = p.integer("roundup_power2_divisions");
  if (n != 0 && !std::has_single_bit(static_cast<std::uint64_t>(n)))
    p.fail("roundup_power2_divisions must be a power of 2 (or 0), not " + std::to_string(n));
  return n;
}

void parse_divisions(Parser& p, AllocatorConfig& config) {
  if (!p.peek("[")) {
    config.divisions.fill(power_of_two_divisions(p));
    return;
  }
  p.expect("[");
  bool first = true;
  std::size_t last = 0;
  while (!p.peek("]")) {
    const std::string key = p.next("an interval");
    p.expect(":");
    const std::int64_t n = power_of_two_divisions(p);
    if (key == ">") {
      std::fill(config.divisions.begin() + static_cast<std::ptrdiff_t>(last), config.divisions.end(), n);
    } else {
      std::size_t used = 0;
      std::uint64_t mib = 0;
      try {
        mib = std::stoull(key, &used);
      } catch (const std::exception&) {
      }
      if (used != key.size() || !std::has_single_bit(mib))
        p.fail("roundup_power2_divisions' intervals are powers of 2 (MiB), not '" + key + "'");
      const std::size_t index =
          std::min<std::size_t>(63 - std::countl_zero(mib), config.divisions.size() - 1);
      if (first) std::fill(config.divisions.begin(), config.divisions.begin() + static_cast<std::ptrdiff_t>(index), n);
      first = false;
      config.divisions[index] = n;
      last = index;
    }
    if (!p.peek("]")) p.expect(",");
  }
  p.expect("]");
}

// A size in MiB of at least `least` (c10's bounds: 20 for the split limits,
// 11 for large segments, which must exceed the 10 MiB requests they serve).
std::int64_t megabytes_at_least(Parser& p, const char* key, std::int64_t least) {
  const std::int64_t mb = p.integer(key);
  if (mb < least) p.fail(std::string(key) + " must be at least " + std::to_string(least) + ", not " + std::to_string(mb));
  return std::min(mb, std::numeric_limits<std::int64_t>::max() / kMiB) * kMiB;
}

}  // namespace

AllocatorConfig AllocatorConfig::with_divisions(std::int64_t n) {
  AllocatorConfig config;
  config.divisions.fill(n);
  return config;
}

std::int64_t AllocatorConfig::divisions_for(std::int64_t bytes) const { return divisions[interval_of(bytes)]; }

AllocatorConfig parse_allocator_config(const std::string& text, const std::string& source) {
  AllocatorConfig config;
  Parser p(text, source);
  while (!p.done()) {
    const std::string key = p.next("an option");
    p.expect(":");
    if (key == "max_split_size_mb") {
      config.max_split_size = megabytes_at_least(p, "max_split_size_mb", 20);
    } else if (key == "max_non_split_rounding_mb") {
      config.max_non_split_rounding_size = megabytes_at_least(p, "max_non_split_rounding_mb", 20);
    } else if (key == "roundup_power2_divisions") {
      parse_divisions(p, config);
    } else if (key == "large_segment_size_mb") {
      config.large_segment_size = megabytes_at_least(p, "large_segment_size_mb", 11);
    } else if (key == "garbage_collection_threshold") {
      config.garbage_collection_threshold = p.fraction("garbage_collection_threshold", false);
    } else if (key == "per_process_memory_fraction") {
      config.per_process_memory_fraction = p.fraction("per_process_memory_fraction", true);
    } else if (key == "expandable_segments") {
      config.expandable_segments = p.boolean("expandable_segments");
    } else if (key == "release_lock_on_cudamalloc" || key == "pinned_use_cuda_host_register" ||
               key == "pinned_use_background_threads" || key == "graph_capture_record_stream_reuse" ||
               key == "pinned_free_catch_all" || key == "throw_on_cudamalloc_oom") {
      p.boolean(key.c_str());  // nothing a trace's device memory depends on
    } else if (key == "pinned_num_register_threads" || key == "pinned_reserve_segment_size_mb" ||
               key == "pinned_max_cached_size_mb" || key == "pinned_max_round_threshold_mb") {
      p.integer(key.c_str());  // host (pinned) memory only
    } else if (key == "backend") {
      const std::string& backend = p.next("a backend");
      if (backend == "cudaMallocAsync") p.fail("backend:cudaMallocAsync is CUDA's own pool, which metamem does not simulate");
      if (backend != "native") p.fail("unknown backend '" + backend + "' (native or cudaMallocAsync)");
    } else {
      p.fail("unknown option '" + key + "'");
    }
    if (!p.done()) p.expect(",");
  }
  return config;
}

const char* allocator_config_variable() {
  const bool only_old_name =
      std::getenv("PYTORCH_ALLOC_CONF") == nullptr && std::getenv("PYTORCH_CUDA_ALLOC_CONF") != nullptr;
  return only_old_name ? "PYTORCH_CUDA_ALLOC_CONF" : "PYTORCH_ALLOC_CONF";
}

std::string allocator_config_from_environment() {
  const char* value = std::getenv(allocator_config_variable());
  return value == nullptr ? "" : value;
}

}  // namespace metamem
