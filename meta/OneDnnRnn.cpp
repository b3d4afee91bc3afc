// oneDNN's RNN layer on a CPU trace: the shapes of its returns (the
// kernels below) and, from a recording of the real layer, what it holds
// and how large its workspace is (onednn_rnn_plan).
#include "meta/OneDnnRnn.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Allocator.h>
#include <c10/core/GradMode.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "meta/KernelRecording.h"
#include "meta/MetaMode.h"
#include "meta/OwnKernel.h"

namespace metamem {
namespace {

// Where a call has no recording.
constexpr const char* kNoRecording =
    " holds what oneDNN chooses for this CPU, which a CPU trace records from the real "
    "layer; this call has no recording (a trace on fake cuda never takes oneDNN).";

// Forward: the output (time-major: the LSTM's own code made the input so),
// the last hidden and cell states, and the workspace (its bytes recorded).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> mkldnn_rnn_layer(
    const at::Tensor& input, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor& hx, const at::Tensor& cx, bool, at::IntArrayRef, int64_t, int64_t hidden_size, int64_t, bool,
    bool, bool, bool) {
  check_recorded_call("aten::mkldnn_rnn_layer", kNoRecording);
  return {at::empty({input.size(0), input.size(1), hidden_size}, input.options()),
          at::empty(hx.sizes(), hx.options()), at::empty(cx.sizes(), cx.options()),
          at::empty({0}, input.options().dtype(at::kByte))};
}

// Backward: float gradients of the input, the two weights, the combined
// bias (twice: bias_ih's and bias_hh's are equal; one per gate row of
// weight_ih, also where the layer has no biases) and the initial states.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
mkldnn_rnn_layer_backward(const at::Tensor& input, const at::Tensor& weight_ih, const at::Tensor& weight_hh,
                          const at::Tensor&, const at::Tensor&, const at::Tensor& hx, const at::Tensor& cx,
                          const at::Tensor&, const at::Tensor&, const at::Tensor&,
                          const std::optional<at::Tensor>& grad_output, const std::optional<at::Tensor>& grad_hy,
                          const std::optional<at::Tensor>& grad_cy, bool, int64_t, int64_t, int64_t, bool, bool, bool,
                          at::IntArrayRef, bool, const at::Tensor&) {
  check_recorded_call("aten::mkldnn_rnn_layer_backward", kNoRecording);
  auto given = [](const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); };
  if (!given(grad_output) && !given(grad_hy) && !given(grad_cy)) return {};
  const at::TensorOptions f32 = input.options().dtype(at::kFloat);
  auto like = [&](const at::Tensor& t) { return at::empty(t.sizes(), f32); };
  return {like(input), like(weight_ih), like(weight_hh), at::empty({weight_ih.size(0)}, f32),
          at::empty({weight_ih.size(0)}, f32), like(hx), like(cx)};
}

// What the CPU allocator reports on this thread while it is installed:
// the blocks made, and the frees of those (the allocator also reports a
// free of a block it sized under another profiler).
class AllocationRecorder final : public c10::MemoryReportingInfoBase {
 public:
  bool memoryProfilingEnabled() const override { return true; }
  void reportMemoryUsage(void* ptr, int64_t alloc_size, size_t, size_t, c10::Device device) override {
    const auto address = reinterpret_cast<std::int64_t>(ptr);
    if (!device.is_cpu() || alloc_size == 0 || (alloc_size < 0 && made_.erase(address) == 0)) return;
    if (alloc_size > 0) made_.insert(address);
    events.push_back({alloc_size > 0, address, std::abs(alloc_size)});
  }
  std::vector<KernelRecording::Event> events;

 private:
  std::unordered_set<std::int64_t> made_;
};

// A call's tensors as the real layer gets them: on zeros, laid out as the
// trace's (sizes, strides, offset, dtype), tensors that share a buffer in
// the trace sharing a storage (the backward clones a cell state that shares
// the hidden state's). `key` names the call: its op, arguments, grad mode
// and threads.
class RealArguments {
 public:
  RealArguments(const std::string& op, c10::ArrayRef<c10::IValue> arguments) : arguments_(arguments) {
    std::ostringstream key;
    key << op << " grad " << c10::GradMode::is_enabled() << " threads " << at::get_num_threads();
    std::map<BufferId, std::size_t> groups;  // by first appearance
    for (const c10::IValue& argument : arguments) {
      if (!argument.isTensor() || !argument.toTensor().defined()) {
        group_of_.push_back(kNone);
        key << " | " << argument;
        continue;
      }
      const at::Tensor& t = argument.toTensor();
      const BufferId buffer = buffer_of(t);
      const std::size_t group =
          buffer == 0 ? bytes_.size() : groups.emplace(buffer, bytes_.size()).first->second;
      if (group == bytes_.size()) bytes_.push_back(0);
      std::int64_t extent = t.numel() == 0 ? 0 : t.storage_offset() + 1;
      for (int64_t d = 0; d < t.dim() && t.numel() != 0; ++d) extent += (t.size(d) - 1) * t.stride(d);
      bytes_[group] = std::max(bytes_[group], extent * static_cast<std::int64_t>(t.element_size()));
      group_of_.push_back(group);
      key << " | " << t.scalar_type() << t.sizes() << t.strides() << "+" << t.storage_offset() << " in " << group;
    }
    key_ = key.str();
  }

  const std::string& key() const { return key_; }

  torch::jit::Stack stack() const {
    std::vector<c10::Storage> storages;
    for (const std::int64_t bytes : bytes_) storages.push_back(at::zeros({bytes}, at::kByte).storage());
    torch::jit::Stack stack;
    for (std::size_t i = 0; i < arguments_.size(); ++i) {
      if (group_of_[i] == kNone) {
        stack.push_back(arguments_[i]);
        continue;
      }
      const at::Tensor& t = arguments_[i].toTensor();
      stack.push_back(at::empty({0}, t.options().device(at::kCPU))
                          .set_(storages[group_of_[i]], t.storage_offset(), t.sizes(), t.strides()));
    }
    return stack;
  }

 private:
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  c10::ArrayRef<c10::IValue> arguments_;
  std::vector<std::size_t> group_of_;
  std::vector<std::int64_t> bytes_;  // per storage
  std::string key_;
};

KernelRecording recorded(const std::string& op, torch::jit::Stack stack) {
  const auto dot = op.find('.');
  const c10::OperatorHandle handle = c10::Dispatcher::singleton().findSchemaOrThrow(
      op.substr(0, dot).c_str(), dot == std::string::npos ? "" : op.substr(dot + 1).c_str());
  auto recorder = std::make_shared<AllocationRecorder>();
  const torch::jit::Stack arguments = stack;  // freed after the recording, as the trace's outlive the call
  {
    c10::DebugInfoGuard reporting(c10::DebugInfoKind::PROFILER_STATE, recorder);
    handle.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
  }
  KernelRecording call;
  call.events = std::move(recorder->events);
  for (const c10::IValue& value : stack) {
    const at::Tensor t = value.isTensor() ? value.toTensor() : at::Tensor();
    call.returns.push_back({t.defined() ? reinterpret_cast<std::int64_t>(t.storage().data()) : 0});
    call.sizes.push_back(t.defined() ? t.sizes().vec() : std::vector<std::int64_t>{});
    call.strides.push_back(t.defined() ? t.strides().vec() : std::vector<std::int64_t>{});
  }
  return call;
}

}  // namespace

const std::vector<std::string>& onednn_recorded_ops() {
  static const std::vector<std::string> ops{"aten::mkldnn_rnn_layer", "aten::mkldnn_rnn_layer_backward"};
  return ops;
}

ScratchPlan onednn_rnn_plan(const std::string& op, c10::ArrayRef<c10::IValue> arguments) {
  static std::mutex lock;
  static std::unordered_map<std::string, ScratchPlan> plans;
  const RealArguments real(op, arguments);
  {
    std::lock_guard<std::mutex> hold(lock);
    if (const auto found = plans.find(real.key()); found != plans.end()) return found->second;
  }
  ScratchPlan plan;
  {
    OutsideMetaMode outside;  // the zeros are real CPU tensors, the recording's own
    InsideMetaCall not_the_steps;
    plan = plan_of(recorded(op, real.stack()), "oneDNN's recorded " + op);
  }
  for (const ScratchPlan::Step& step : plan.steps)
    if (step.kind == ScratchPlan::Step::Kind::CublasCall)
      throw std::runtime_error("metamem: oneDNN's recorded " + op + " keeps a block that none of its returns holds");
  std::lock_guard<std::mutex> hold(lock);
  return plans.emplace(real.key(), std::move(plan)).first->second;
}

std::vector<OwnKernelEntry> onednn_rnn_kernels() {
  return {own("mkldnn_rnn_layer", TORCH_FN(mkldnn_rnn_layer)),
          own("mkldnn_rnn_layer_backward", TORCH_FN(mkldnn_rnn_layer_backward))};
}

}  // namespace metamem
