#include "profiler/Chain.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <memory>
#include <stdexcept>

#include "profiler/Checkpoint.h"
#include "profiler/KeptOutputs.h"
#include "profiler/Tracer.h"

namespace metamem {
namespace {

void validate_range(const std::vector<Segment>& segments, std::int32_t first, std::int32_t last,
                    bool proper) {
  std::int32_t next = first;
  for (const Segment& s : segments) {
    if (s.first < next || s.last < s.first || s.last > last)
      throw std::invalid_argument("checkpoint policy: segment " + std::to_string(s.first) + "-" +
                                  std::to_string(s.last) + " is out of order or outside units " +
                                  std::to_string(first) + "-" + std::to_string(last));
    if (proper && s.first == first && s.last == last)
      throw std::invalid_argument("checkpoint policy: an inner segment must be smaller than its own");
    validate_range(s.inner, s.first, s.last, true);
    next = s.last + 1;
  }
}

std::string format(const std::vector<Segment>& segments) {
  std::string out;
  for (const Segment& s : segments) {
    if (!out.empty()) out += ",";
    // Appended piece by piece: GCC 12 takes `"-" + std::to_string(...)` for
    // an overlapping copy (-Wrestrict).
    out += std::to_string(s.first);
    if (s.last != s.first) {
      out += '-';
      out += std::to_string(s.last);
    }
    if (!s.inner.empty()) {
      out += '[';
      out += format(s.inner);
      out += ']';
    }
  }
  return out;
}

class PolicyParser {
 public:
  explicit PolicyParser(const std::string& text) : text_(text) {}

  std::vector<Segment> segments(bool nested) {
    std::vector<Segment> out;
    if (at_end() || (nested && peek() == ']')) return out;
    for (;;) {
      Segment s;
      s.first = s.last = number();
      if (!at_end() && peek() == '-') {
        ++pos_;
        s.last = number();
      }
      if (!at_end() && peek() == '[') {
        ++pos_;
        s.inner = segments(true);
        expect(']');
      }
      out.push_back(std::move(s));
      if (at_end() || peek() != ',') return out;
      ++pos_;
    }
  }

  void finish() {
    if (!at_end()) fail("unexpected '" + std::string(1, peek()) + "'");
  }

 private:
  std::int32_t number() {
    const std::size_t start = pos_;
    while (!at_end() && std::isdigit(static_cast<unsigned char>(peek()))) ++pos_;
    if (pos_ == start || pos_ - start > 6) fail("expected a unit index");
    return std::stoi(text_.substr(start, pos_ - start));
  }
  void expect(char c) {
    if (at_end() || peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return text_[pos_]; }
  [[noreturn]] void fail(const std::string& why) const {
    throw std::invalid_argument("checkpoint policy '" + text_ + "': " + why + " at position " +
                                std::to_string(pos_));
  }

  const std::string& text_;
  std::size_t pos_ = 0;
};

std::atomic<UnitHooks*> g_unit_hooks{nullptr};

void run_unit(const std::vector<Unit>& units, std::int32_t u, at::Tensor& x) {
  RegionScope region(RegionKind::Unit, u, u);
  region.set_input(x);
  UnitHooks* hooks = g_unit_hooks.load();
  if (hooks != nullptr) hooks->before_unit(u);
  {
    std::vector<std::unique_ptr<ModuleScope>> scopes;
    for (const std::string& name : units[static_cast<std::size_t>(u)].scope)
      scopes.push_back(std::make_unique<ModuleScope>(name.c_str()));
    x = units[static_cast<std::size_t>(u)].forward(x);
  }
  if (hooks != nullptr) hooks->after_unit(u, x);
  region.set_output(x);
}

void run_range(const std::vector<Unit>& units, std::int32_t first, std::int32_t last,
               const std::vector<Segment>& segments, const std::vector<std::string>& keep,
               at::Tensor& x) {
  auto segment = segments.begin();
  for (std::int32_t u = first; u <= last;) {
    if (segment == segments.end() || segment->first != u) {
      run_unit(units, u++, x);
      continue;
    }
    const Segment s = *segment++;
    const SegmentFn fn = [&units, s](const std::vector<at::Tensor>& inputs) {
      at::Tensor y = inputs[0];
      run_range(units, s.first, s.last, s.inner, {}, y);
      return std::vector<at::Tensor>{y};
    };
    x = checkpoint(fn, {x}, {s.first, s.last}, keep)[0];
    u = s.last + 1;
  }
}

}  // namespace

void validate(const CheckpointPolicy& policy, std::int32_t units) {
  validate_range(policy.segments, 0, units - 1, false);
  if (policy.keep.empty()) return;
  validate_keep(policy.keep);
  for (const Segment& s : policy.segments)
    if (!s.inner.empty())
      throw std::invalid_argument("checkpoint policy: kept outputs need segments without inner ones");
}

std::string to_string(const CheckpointPolicy& policy) {
  std::string out = policy.segments.empty() ? "none" : format(policy.segments);
  for (std::size_t i = 0; i < policy.keep.size(); ++i) out += (i == 0 ? ";keep=" : ",") + policy.keep[i];
  return out;
}

CheckpointPolicy parse_policy(const std::string& text) {
  const std::size_t keep_at = text.find(";keep=");
  const std::string segments = text.substr(0, keep_at);
  CheckpointPolicy policy;
  if (segments != "none" && !segments.empty()) {
    PolicyParser parser(segments);
    policy.segments = parser.segments(false);
    parser.finish();
  }
  if (keep_at != std::string::npos) {
    std::string ops = text.substr(keep_at + 6);
    for (std::size_t start = 0; start <= ops.size();) {
      const std::size_t comma = std::min(ops.find(',', start), ops.size());
      if (comma == start) throw std::invalid_argument("checkpoint policy '" + text + "': an empty op to keep");
      policy.keep.push_back(ops.substr(start, comma - start));
      start = comma + 1;
    }
  }
  return policy;
}

UnitHooksScope::UnitHooksScope(UnitHooks* hooks) {
  UnitHooks* none = nullptr;
  if (!g_unit_hooks.compare_exchange_strong(none, hooks))
    throw std::logic_error("unit hooks are installed already");
}

UnitHooksScope::~UnitHooksScope() { g_unit_hooks.store(nullptr); }

at::Tensor run_chain(const std::vector<Unit>& units, at::Tensor x, const CheckpointPolicy& policy) {
  validate(policy, static_cast<std::int32_t>(units.size()));
  run_range(units, 0, static_cast<std::int32_t>(units.size()) - 1, policy.segments, policy.keep, x);
  return x;
}

}  // namespace metamem
