// CPU kernels a trace follows from recordings of the real kernel: which
// calls (oneDNN's RNN layer; convolutions torch gives to oneDNN or NNPACK;
// matrix products it may give to oneDNN) and the recording itself, made
// once per distinct call in the process.
#include "meta/CpuKernelRecording.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/ConvUtils.h>
#include <c10/core/Allocator.h>
#include <c10/core/GradMode.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "meta/KernelRecording.h"
#include "meta/MetaMode.h"

namespace metamem {
namespace {

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
    events.push_back({alloc_size > 0 ? KernelRecording::Event::Kind::Alloc : KernelRecording::Event::Kind::Free,
                      address, std::abs(alloc_size)});
  }
  std::vector<KernelRecording::Event> events;

 private:
  std::unordered_set<std::int64_t> made_;
};

// A call's tensors as the real kernel gets them: on zeros, laid out as the
// trace's (sizes, strides, offset, dtype, requires_grad), tensors that share a buffer in
// the trace sharing a storage (oneDNN's RNN backward clones a cell state
// that shares the hidden state's). `key` names the call: its op,
// arguments, grad mode, threads and the flags that pick or shape its
// kernel (oneDNN's and NNPACK's, oneDNN's determinism and float32
// precision).
class RealArguments {
 public:
  RealArguments(const std::string& op, c10::ArrayRef<c10::IValue> arguments) : arguments_(arguments) {
    std::ostringstream key;
    const at::Context& context = at::globalContext();
    key << op << " grad " << c10::GradMode::is_enabled() << " threads " << at::get_num_threads() << " onednn "
        << context.userEnabledMkldnn() << context.deterministicMkldnn()
        << at::precision2str(context.float32Precision(at::Float32Backend::MKLDNN, at::Float32Op::CONV))
        << at::precision2str(context.float32Precision(at::Float32Backend::MKLDNN, at::Float32Op::RNN))
        << at::precision2str(context.float32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL))
        << " nnpack " << context.userEnabledNNPACK();
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
      key << " | " << t.scalar_type() << t.sizes() << t.strides() << "+" << t.storage_offset() << " in " << group
          << (t.requires_grad() ? " grad" : "");
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
      at::Tensor real = at::empty({0}, t.options().device(at::kCPU))
                            .set_(storages[group_of_[i]], t.storage_offset(), t.sizes(), t.strides());
      if (t.requires_grad()) real.set_requires_grad(true);  // torch's choice of a kernel may ask
      stack.push_back(std::move(real));
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
    // Below autograd, as the kernel runs under the autograd kernel above it.
    at::AutoDispatchBelowADInplaceOrView below_autograd;
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

// A CPU tensor with `t`'s sizes, strides, dtype and requires_grad and no
// memory of its own, for torch's choice of a kernel, which reads no data.
at::Tensor stand_in(const at::Tensor& t) {
  static std::max_align_t nothing;
  at::Tensor cpu = at::from_blob(&nothing, t.sizes(), t.strides(), at::TensorOptions(t.scalar_type()));
  if (t.requires_grad()) cpu.set_requires_grad(true);
  return cpu;
}

// Whether torch's choice for a CPU convolution of `input` and `weight` is
// one of its native kernels (meta/CpuLayerModel.cpp models their memory):
// oneDNN's, NNPACK's and XNNPACK's are recorded instead. convolution_backward
// asks for a backend that has a backward; asked as a forward is (grad mode
// off in autograd's backward), torch can answer XNNPACK where the backward
// runs a native kernel, which is then recorded as it runs, never the
// reverse.
bool runs_native_convolution(c10::ArrayRef<c10::IValue> arguments, bool backward) {
  using at::native::ConvBackend;
  const std::size_t first = backward ? 1 : 0;  // convolution_backward's grad_output comes first
  OutsideMetaMode outside;  // the stand-ins and their views (a 1-d convolution's) are real CPU tensors
  const c10::IValue& bias = arguments[first + 2];
  std::optional<at::Tensor> bias_tensor;
  std::optional<std::vector<std::int64_t>> bias_sizes;
  if (!backward && bias.isTensor() && bias.toTensor().defined()) bias_tensor = stand_in(bias.toTensor());
  if (backward && !bias.isNone()) bias_sizes = bias.toIntVector();
  const auto ints = [&](std::size_t i) { return arguments[first + i].toIntVector(); };
  const auto stride = ints(3), padding = ints(4), dilation = ints(5), output_padding = ints(7);
  const ConvBackend chosen = at::native::select_conv_backend(
      stand_in(arguments[first].toTensor()), stand_in(arguments[first + 1].toTensor()), bias_tensor,
      c10::fromIntArrayRefSlow(stride), c10::fromIntArrayRefSlow(padding), c10::fromIntArrayRefSlow(dilation),
      arguments[first + 6].toBool(), c10::fromIntArrayRefSlow(output_padding), arguments[first + 8].toInt(),
      bias_sizes ? at::OptionalSymIntArrayRef(c10::fromIntArrayRefSlow(*bias_sizes)) : std::nullopt);
  switch (chosen) {
    case ConvBackend::Empty:
    case ConvBackend::Slow2d:
    case ConvBackend::Slow3d:
    case ConvBackend::SlowDilated2d:
    case ConvBackend::SlowDilated3d:
    case ConvBackend::SlowTranspose2d:
    case ConvBackend::SlowTranspose3d:
      return true;
    default:
      return false;
  }
}

// Whether this CPU runs oneDNN's kernels in `dtype` (torch's own checks).
bool onednn_runs(at::ScalarType dtype) {
  const auto ask = [](const char* check) {
    OutsideMetaMode outside;  // an op without tensors, which a trace's factories would claim
    return c10::Dispatcher::singleton().findSchemaOrThrow(check, "").typed<bool()>().call();
  };
  static const bool bf16 = ask("mkldnn::_is_mkldnn_bf16_supported"), fp16 = ask("mkldnn::_is_mkldnn_fp16_supported");
  return dtype == at::kBFloat16 ? bf16 : dtype == at::kHalf && fp16;
}

// Whether torch may give a CPU matrix product to oneDNN's matmul: oneDNN
// on and an operand in bf16 or f16 that this CPU runs in oneDNN, or
// float32 under a reduced oneDNN matmul precision. Torch then asks the
// product's size too (unexported); a call recorded that torch keeps on its
// native kernel is recorded as that kernel runs, at the cost of running it.
bool may_run_onednn_matmul(c10::ArrayRef<c10::IValue> arguments) {
  const at::Context& context = at::globalContext();
  if (!context.userEnabledMkldnn()) return false;
  const at::Float32Precision float32 = context.float32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL);
  const bool reduced_float32 = float32 == at::Float32Precision::BF16 || float32 == at::Float32Precision::TF32;
  return std::any_of(arguments.begin(), arguments.end(), [&](const c10::IValue& argument) {
    if (!argument.isTensor() || !argument.toTensor().defined()) return false;
    const at::ScalarType dtype = argument.toTensor().scalar_type();
    return onednn_runs(dtype) || (dtype == at::kFloat && reduced_float32);
  });
}

// Whether torch may run a CPU activation through oneDNN's eltwise kernel:
// oneDNN on, float32 or a dtype this CPU runs in oneDNN (torch then asks
// for a contiguous input of more than one element).
bool may_run_onednn_eltwise(const at::Tensor& input) {
  return at::globalContext().userEnabledMkldnn() &&
         (input.scalar_type() == at::kFloat || onednn_runs(input.scalar_type()));
}

}  // namespace

RecordedCpuCall recorded_cpu_call(const std::string& qualified_name) {
  using Args = c10::ArrayRef<c10::IValue>;
  static const std::unordered_map<std::string, RecordedCpuCall> calls{
      {"aten::mkldnn_rnn_layer", [](Args) { return true; }},
      {"aten::mkldnn_rnn_layer_backward", [](Args) { return true; }},
      {"aten::convolution", [](Args a) { return !runs_native_convolution(a, false); }},
      {"aten::convolution_backward", [](Args a) { return !runs_native_convolution(a, true); }},
      {"aten::gelu", [](Args a) { return may_run_onednn_eltwise(a[0].toTensor()); }},
      {"aten::gelu_backward", [](Args a) { return may_run_onednn_eltwise(a[1].toTensor()); }},
      {"aten::mm", &may_run_onednn_matmul},
      {"aten::addmm", &may_run_onednn_matmul},
      {"aten::bmm", &may_run_onednn_matmul},
      {"aten::baddbmm", &may_run_onednn_matmul},
      {"aten::addbmm", &may_run_onednn_matmul},
      {"aten::mv", &may_run_onednn_matmul},
      {"aten::addmv", &may_run_onednn_matmul},
      {"aten::dot", &may_run_onednn_matmul}};
  const auto found = calls.find(qualified_name);
  return found == calls.end() ? nullptr : found->second;
}

ScratchPlan recorded_cpu_plan(const std::string& op, c10::ArrayRef<c10::IValue> arguments) {
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
    plan = plan_of(recorded(op, real.stack()), "the CPU's recorded " + op);
  }
  for (const ScratchPlan::Step& step : plan.steps)
    if (step.kind == ScratchPlan::Step::Kind::CublasCall)
      throw std::runtime_error("metamem: the CPU's recorded " + op + " keeps a block that none of its returns holds");
  std::lock_guard<std::mutex> hold(lock);
  return plans.emplace(real.key(), std::move(plan)).first->second;
}

}  // namespace metamem
