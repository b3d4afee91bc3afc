#include "meta/CudaGraphCapture.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <mutex>
#include <string>
#include <utility>

#include "meta/MetaMode.h"

namespace metamem {
namespace {

std::atomic<bool> g_underway{false};
std::mutex g_mutex;
// Whether this capture's generator has made its seed and offset: once, at
// its first draw or first state read.
bool g_state_made = false;             // guarded by g_mutex
std::vector<at::Tensor> g_draw_state;  // guarded by g_mutex

// A draw that depends on an argument: attention and dropout draw only with
// a dropout probability, in training.
bool draws_with(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> arguments) {
  for (std::size_t i = 0; i < schema.arguments().size() && i < arguments.size(); ++i) {
    const std::string& name = schema.arguments()[i].name();
    if (name == "dropout_p" && arguments[i].isDouble() && arguments[i].toDouble() == 0.0) return false;
    if (name == "train" && arguments[i].isBool() && !arguments[i].toBool()) return false;
  }
  return true;
}

bool first_use_of_generator() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return !std::exchange(g_state_made, true);
}

}  // namespace

void begin_graph_capture() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_state_made = false;
  g_draw_state.clear();
  g_underway.store(true, std::memory_order_release);
}

std::vector<at::Tensor> end_graph_capture() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_underway.store(false, std::memory_order_release);
  return std::exchange(g_draw_state, {});
}

bool graph_capture_underway() { return g_underway.load(std::memory_order_acquire); }

bool first_draw_of_capture(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> arguments) {
  if (!graph_capture_underway() || !op.hasTag(at::Tag::nondeterministic_seeded)) return false;
  // An attention's backward replays its forward's draw from the seed and
  // offset the forward kept.
  const std::string& name = op.schema().name();
  if (name.size() >= 9 && name.compare(name.size() - 9, 9, "_backward") == 0) return false;
  if (!draws_with(op.schema(), arguments)) return false;
  return first_use_of_generator();
}

bool draws_before_outputs(const c10::OperatorHandle& op) {
  const std::string& name = op.schema().name();
  return name.find("attention") != std::string::npos;
}

void read_generator_state_in_capture() {
  if (graph_capture_underway() && first_use_of_generator()) make_draw_state();
}

void make_draw_state() {
  at::Tensor seed = traced_empty_on_default_stream({1}, at::kLong);
  at::Tensor offset = traced_empty_on_default_stream({1}, at::kLong);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_draw_state.push_back(std::move(seed));
  g_draw_state.push_back(std::move(offset));
}

}  // namespace metamem
