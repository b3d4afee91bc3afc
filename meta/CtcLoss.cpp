// CTC loss on both fake devices: libtorch's rule for cuDNN, torch's own
// kernels and cuDNN's, their outputs and, on cuda, what each holds beside
// them in its order (recorded from real torch 2.14.1 and cuDNN 9.24 on the
// fake GPU). Lengths given as tensors are read as the real kernels read
// them, copied to the host: the values the trace knows, or their bounds
// under placeholder values.
#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <algorithm>
#include <string>
#include <vector>

#include "meta/CudaGraphCapture.h"
#include "meta/CudaKernelPlans.h"
#include "meta/KnownValues.h"
#include "meta/MetaMode.h"
#include "meta/MetaTensor.h"
#include "meta/OwnKernel.h"

namespace metamem {
namespace {

using Lengths = std::vector<std::int64_t>;

// The most a target can be long: the padded targets' width, or all of the
// concatenated ones.
std::int64_t longest_possible_target(const at::Tensor& targets) {
  return targets.dim() == 2 ? targets.size(1) : targets.numel();
}

// `lengths`' values (each at most `bound`) as the kernel of `op` reads them.
// A trace knows them when they were made from Python numbers or host data;
// under placeholder values it takes `bound` for each, so that what it
// sizes by them is the most it can be; otherwise it stops.
Lengths read_lengths(const at::Tensor& lengths, std::int64_t bound, const std::string& op) {
  if (std::optional<Lengths> values = known_integers(lengths)) return *std::move(values);
  if (!PlaceholderValues::active())
    report_unknown_values(op, "ctc_loss sizes its buffers and chooses cuDNN by its lengths, which a trace knows "
                              "when they are made from Python numbers or host data; with values=\"placeholder\" "
                              "it takes their bounds (the time steps, the targets' width).");
  return Lengths(static_cast<std::size_t>(lengths.numel()), bound);
}

Lengths input_lengths_of(const at::Tensor& log_probs, const at::Tensor& lengths, const std::string& op) {
  return read_lengths(lengths, log_probs.size(0), op);
}
Lengths target_lengths_of(const at::Tensor& targets, const at::Tensor& lengths, const std::string& op) {
  return read_lengths(lengths, longest_possible_target(targets), op);
}

// ---- the rule --------------------------------------------------------------

// What both of libtorch's rules ask first: cuDNN on a cuda device, blank 0,
// f32 log-probs (T, N, C) and concatenated int32 targets.
bool cudnn_shaped(const at::Tensor& log_probs, const at::Tensor& targets, std::int64_t blank) {
  return fake_device().is_cuda() && at::globalContext().userEnabledCuDNN() && blank == 0 && log_probs.dim() == 3 &&
         log_probs.scalar_type() == at::kFloat && targets.dim() == 1 && targets.scalar_type() == at::kInt &&
         targets.is_contiguous();
}

// With lengths as lists: cuDNN's shapes and dtypes, the targets on the
// host, every input full length and every target no longer than 255 nor
// than its input. A trace's targets are on the host only where they are a
// real tensor beside it (made from data, torch.tensor(...)); those the
// step makes with torch's ops on the host stand on the fake device, and a
// real run that takes cuDNN with them is traced on torch's own kernels
// (docs/cuda-paths.md).
bool takes_cudnn(const at::Tensor& log_probs, const at::Tensor& targets, at::IntArrayRef input_lengths,
                 at::IntArrayRef target_lengths, std::int64_t blank) {
  const bool shaped = cudnn_shaped(log_probs, targets, blank) && targets.is_cpu() && !is_meta_tensor(targets);
  const auto full = [&](std::int64_t length) { return length == log_probs.size(0); };
  if (!shaped || !std::all_of(input_lengths.begin(), input_lengths.end(), full)) return false;
  for (std::size_t b = 0; b < target_lengths.size(); ++b)
    if (b >= input_lengths.size() || target_lengths[b] >= 256 || target_lengths[b] > input_lengths[b]) return false;
  return true;
}
bool use_cudnn_ctc_loss_of_lists(const at::Tensor& log_probs, const at::Tensor& targets, at::IntArrayRef input_lengths,
                                 at::IntArrayRef target_lengths, std::int64_t blank) {
  return takes_cudnn(log_probs, targets, input_lengths, target_lengths, blank);
}

// MIOpen is ROCm's.
bool never(const at::Tensor&, const at::Tensor&, at::IntArrayRef, at::IntArrayRef, std::int64_t) { return false; }
bool never_with_tensors(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, std::int64_t) {
  return false;
}

// With lengths as tensors: cuDNN's shapes and dtypes, then every target no
// longer than 255 nor than its input, read from the lengths' values. Under
// graph capture the real rule asserts that on the device instead, and its
// few bytes of comparisons are not traced.
bool takes_cudnn(const at::Tensor& log_probs, const at::Tensor& targets, const at::Tensor& input_lengths,
                 const at::Tensor& target_lengths, std::int64_t blank) {
  const bool shaped = cudnn_shaped(log_probs, targets, blank) && input_lengths.scalar_type() == at::kInt &&
                      target_lengths.scalar_type() == at::kInt;
  if (!shaped || graph_capture_underway()) return shaped;
  const std::string op = "aten::_use_cudnn_ctc_loss.Tensor";
  const Lengths inputs = input_lengths_of(log_probs, input_lengths, op);
  const Lengths lengths = target_lengths_of(targets, target_lengths, op);
  for (std::size_t b = 0; b < lengths.size(); ++b)
    if (b >= inputs.size() || lengths[b] >= 256 || lengths[b] > inputs[b]) return false;
  return true;
}
bool use_cudnn_ctc_loss(const at::Tensor& log_probs, const at::Tensor& targets, const at::Tensor& input_lengths,
                        const at::Tensor& target_lengths, std::int64_t blank) {
  return takes_cudnn(log_probs, targets, input_lengths, target_lengths, blank);
}

// ---- ctc_loss itself ---------------------------------------------------------

// The losses reduced as asked; the mean divides by the target lengths,
// clamped to 1 (`clamped()` makes them just before the division).
template <class ClampedLengths>
at::Tensor reduced(const at::Tensor& losses, std::int64_t reduction, bool batched, ClampedLengths clamped) {
  if (reduction == at::Reduction::Mean) {
    const at::Tensor lengths = clamped();
    return (losses / lengths).mean();
  }
  if (reduction == at::Reduction::Sum) return losses.sum();
  return batched ? losses : losses.squeeze(0);
}

// libtorch's ctc_loss (LossCTC.cpp) as a trace runs it, in autograd's place
// for MetaTensors: the same ops, less what a trace cannot do and a GPU
// does not hold. With lengths as lists, their tensor for the mean is made
// from them (at::tensor, which writes its values through data_ptr); here
// an empty one of its bytes, made where the real one lands: on the fake
// cuda, the copy of the host tensor at::tensor makes. On cuda the real
// composite copies the targets to the host for MIOpen's rule, always
// false outside ROCm: host memory, left out.
at::Tensor ctc_loss_of_lists(const at::Tensor& log_probs_, const at::Tensor& targets, at::IntArrayRef input_lengths,
                             at::IntArrayRef target_lengths, std::int64_t blank, std::int64_t reduction,
                             bool zero_infinity) {
  const bool batched = log_probs_.dim() == 3;
  const at::Tensor log_probs = batched ? log_probs_ : log_probs_.unsqueeze(1);
  at::Tensor res;
  if (log_probs.is_cuda() && takes_cudnn(log_probs, targets, input_lengths, target_lengths, blank)) {
    res = std::get<0>(
        at::_cudnn_ctc_loss(log_probs, targets, input_lengths, target_lengths, blank, true, zero_infinity));
  } else {
    res = std::get<0>(at::_ctc_loss(log_probs, targets.to(log_probs.device(), at::kLong), input_lengths,
                                    target_lengths, blank, zero_infinity));
    if (zero_infinity)
      res = at::where(res == c10::Scalar(std::numeric_limits<double>::infinity()), at::zeros({}, res.options()), res);
  }
  return reduced(res, reduction, batched, [&] {
    return at::empty({static_cast<std::int64_t>(target_lengths.size())}, res.options()).clamp_min(1);
  });
}

// With lengths as tensors: cuDNN's kernel where the rule picks it, on the
// lengths as they are; otherwise libtorch's fast path, which reads them on
// the host (ctc_loss_of_lists). On a fake cpu that read copies lengths
// that are not int64 and contiguous, and the copies live through the call.
// The rule is asked here, not through its op, so that it reads lengths on
// the host (real tensors beside the trace's) as they are.
at::Tensor ctc_loss_of_tensors(const at::Tensor& log_probs_, const at::Tensor& targets,
                               const at::Tensor& input_lengths, const at::Tensor& target_lengths,
                               std::int64_t blank, std::int64_t reduction, bool zero_infinity) {
  TORCH_CHECK(c10::isIntegralType(input_lengths.scalar_type(), false), "input_lengths must be integral");
  TORCH_CHECK(c10::isIntegralType(target_lengths.scalar_type(), false), "target_lengths must be integral");
  const bool batched = log_probs_.dim() == 3;
  const at::Tensor log_probs = batched ? log_probs_ : log_probs_.unsqueeze(1);
  if (log_probs.is_cuda() && takes_cudnn(log_probs, targets, input_lengths, target_lengths, blank)) {
    TORCH_CHECK(input_lengths.device() == log_probs.device() && target_lengths.device() == log_probs.device(),
                "Expected all tensors to be on the same device, but found at least two devices, ",
                log_probs.device(), " and ", (input_lengths.is_cpu() ? input_lengths : target_lengths).device(), "!");
    const at::Tensor res = std::get<0>(
        at::_cudnn_ctc_loss(log_probs, targets, input_lengths, target_lengths, blank, true, zero_infinity));
    return reduced(res, reduction, batched, [&] { return target_lengths.clamp_min(1); });
  }
  const std::string op = "aten::ctc_loss.Tensor";
  const Lengths inputs = input_lengths_of(log_probs, input_lengths, op);
  const Lengths lengths = target_lengths_of(targets, target_lengths, op);
  std::vector<at::Tensor> host_copies;
  for (const at::Tensor* read : {&input_lengths, &target_lengths})
    if (log_probs.is_cpu() && (read->scalar_type() != at::kLong || !read->is_contiguous()))
      host_copies.push_back(at::empty({read->numel()}, read->options().dtype(at::kLong)));
  return ctc_loss_of_lists(log_probs_, targets, inputs, lengths, blank, reduction, zero_infinity);
}

// ---- torch's own kernels ---------------------------------------------------

// The forward keeps log-alpha, batch x input length x (2 x longest target
// + 1), beside each sample's negative log-likelihood.
std::tuple<at::Tensor, at::Tensor> ctc_loss_outputs(const at::Tensor& log_probs, std::size_t inputs,
                                                    const Lengths& lengths) {
  const std::int64_t batch = log_probs.size(1);
  TORCH_CHECK(static_cast<std::int64_t>(inputs) == batch, "ctc_loss: input_lengths must be of size batch_size");
  const std::int64_t longest = lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
  return {at::empty({batch}, log_probs.options()),
          at::empty({batch, log_probs.size(0), 2 * longest + 1}, log_probs.options())};
}

std::tuple<at::Tensor, at::Tensor> ctc_loss(const at::Tensor& log_probs, const at::Tensor&,
                                            at::IntArrayRef input_lengths, at::IntArrayRef target_lengths,
                                            std::int64_t, bool) {
  return ctc_loss_outputs(log_probs, input_lengths.size(), Lengths(target_lengths.begin(), target_lengths.end()));
}
std::tuple<at::Tensor, at::Tensor> ctc_loss_tensor(const at::Tensor& log_probs, const at::Tensor& targets,
                                                   const at::Tensor& input_lengths, const at::Tensor& target_lengths,
                                                   std::int64_t, bool) {
  const std::string op = "aten::_ctc_loss.Tensor";
  return ctc_loss_outputs(log_probs, input_lengths_of(log_probs, input_lengths, op).size(),
                          target_lengths_of(targets, target_lengths, op));
}

// The backward's gradient, contiguous; log-beta is its temporary.
at::Tensor ctc_loss_backward(const at::Tensor&, const at::Tensor& log_probs, const at::Tensor&, at::IntArrayRef,
                             at::IntArrayRef, const at::Tensor&, const at::Tensor&, std::int64_t, bool) {
  return at::empty_like(log_probs, at::MemoryFormat::Contiguous);
}
at::Tensor ctc_loss_backward_tensor(const at::Tensor&, const at::Tensor& log_probs, const at::Tensor&,
                                    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                    std::int64_t, bool) {
  return at::empty_like(log_probs, at::MemoryFormat::Contiguous);
}

// ---- cuDNN's kernel (lengths as tensors) -----------------------------------

// The costs, and the gradient cuDNN computes with them.
std::tuple<at::Tensor, at::Tensor> cudnn_ctc_loss_outputs(const at::Tensor& log_probs) {
  return {at::empty({log_probs.size(1)}, log_probs.options()),
          at::empty_like(log_probs, at::MemoryFormat::Contiguous)};
}
std::tuple<at::Tensor, at::Tensor> cudnn_ctc_loss(const at::Tensor& log_probs, const at::Tensor&, at::IntArrayRef,
                                                  at::IntArrayRef, std::int64_t, bool, bool) {
  return cudnn_ctc_loss_outputs(log_probs);
}
std::tuple<at::Tensor, at::Tensor> cudnn_ctc_loss_tensor(const at::Tensor& log_probs, const at::Tensor&,
                                                         const at::Tensor&, const at::Tensor&, std::int64_t, bool,
                                                         bool) {
  return cudnn_ctc_loss_outputs(log_probs);
}

// ---- on cuda: what each kernel holds beside its outputs --------------------

// torch's own kernels put the input lengths, target lengths and each
// sample's offset into the targets on the device, int64 each, before their
// outputs, and free them as they return.
constexpr std::size_t kLengthsOnDevice = 3;
std::size_t put_lengths_on_device(ScratchPlan& plan, const at::Tensor& log_probs) {
  const std::size_t first = plan.pieces;
  for (std::size_t i = 0; i < kLengthsOnDevice; ++i) plan.make(log_probs.size(1) * 8);
  return first;
}
void free_lengths_on_device(ScratchPlan& plan, std::size_t first) {
  for (std::size_t piece = first; piece < first + kLengthsOnDevice; ++piece) plan.free(piece);
}

// The forward: those three, log-alpha, then the likelihoods.
ScratchPlan ctc_loss_plan(c10::ArrayRef<c10::IValue> arguments) {
  ScratchPlan plan;
  const std::size_t lengths = put_lengths_on_device(plan, arguments[0].toTensor());
  plan.output(1);
  plan.output(0);
  free_lengths_on_device(plan, lengths);
  return plan;
}

// The backward: those three, log-beta (log-alpha's size), then the
// gradient; log-beta freed first.
ScratchPlan ctc_loss_backward_plan(c10::ArrayRef<c10::IValue> arguments) {
  ScratchPlan plan;
  const std::size_t lengths = put_lengths_on_device(plan, arguments[1].toTensor());
  const std::size_t log_beta = plan.make(static_cast<std::int64_t>(arguments[6].toTensor().nbytes()));
  plan.output(0);
  plan.free(log_beta);
  free_lengths_on_device(plan, lengths);
  return plan;
}

// cuDNN's: the gradient, its workspace, then the costs; the workspace
// freed as it returns.
ScratchPlan cudnn_ctc_loss_plan(std::int64_t workspace_bytes) {
  ScratchPlan plan;
  plan.output(1);
  const std::size_t workspace = plan.make(workspace_bytes);
  plan.output(0);
  plan.free(workspace);
  return plan;
}

// The workspaces cuDNN 9.24 gives for T x N x C log-probabilities, measured
// on the fake GPU. With lengths as tensors, cudnnGetCTCLossWorkspaceSize_v8
// sizes for cuDNN's longest label (255): N x (T x (4C + 4,088) + 2,052)
// bytes (7 shapes, T 50 to 200, N 4 to 32, C 20 to 64). With lengths as
// lists, cudnnGetCTCLossWorkspaceSize for the longest target L:
// N x (T x (4C + 16L + 8) + 12L + 20) bytes (7 shapes, L 10 to 100).
ScratchPlan cudnn_ctc_loss_tensor_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& log_probs = arguments[0].toTensor();
  const std::int64_t steps = log_probs.size(0), batch = log_probs.size(1), classes = log_probs.size(2);
  return cudnn_ctc_loss_plan(batch * (steps * (4 * classes + 4088) + 2052));
}
ScratchPlan cudnn_ctc_loss_lists_plan(c10::ArrayRef<c10::IValue> arguments) {
  const at::Tensor& log_probs = arguments[0].toTensor();
  const std::int64_t steps = log_probs.size(0), batch = log_probs.size(1), classes = log_probs.size(2);
  const std::vector<std::int64_t> lengths = arguments[3].toIntVector();
  const std::int64_t longest = lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
  return cudnn_ctc_loss_plan(batch * (steps * (4 * classes + 16 * longest + 8) + 12 * longest + 20));
}

}  // namespace

std::vector<OwnKernelEntry> ctc_loss_kernels() {
  return {
      own("_use_cudnn_ctc_loss", TORCH_FN(use_cudnn_ctc_loss_of_lists)),
      own("_use_miopen_ctc_loss", TORCH_FN(never)),
      own("_use_miopen_ctc_loss.Tensor", TORCH_FN(never_with_tensors)),
      own("_use_cudnn_ctc_loss.Tensor", TORCH_FN(use_cudnn_ctc_loss)),
      own("_ctc_loss", TORCH_FN(ctc_loss)),
      own("_ctc_loss.Tensor", TORCH_FN(ctc_loss_tensor)),
      own("_ctc_loss_backward", TORCH_FN(ctc_loss_backward)),
      own("_ctc_loss_backward.Tensor", TORCH_FN(ctc_loss_backward_tensor)),
      own("_cudnn_ctc_loss", TORCH_FN(cudnn_ctc_loss)),
      own("_cudnn_ctc_loss.Tensor", TORCH_FN(cudnn_ctc_loss_tensor)),
  };
}

std::vector<std::pair<std::string, c10::KernelFunction>> ctc_loss_composites() {
  return {{"ctc_loss.IntList", c10::KernelFunction::makeFromUnboxedFunction(TORCH_FN(ctc_loss_of_lists))},
          {"ctc_loss.Tensor", c10::KernelFunction::makeFromUnboxedFunction(TORCH_FN(ctc_loss_of_tensors))}};
}

ScratchPlanModel cuda_ctc_loss_plan_model(const std::string& qualified_name) {
  if (qualified_name == "aten::_ctc_loss" || qualified_name == "aten::_ctc_loss.Tensor") return &ctc_loss_plan;
  if (qualified_name == "aten::_ctc_loss_backward" || qualified_name == "aten::_ctc_loss_backward.Tensor")
    return &ctc_loss_backward_plan;
  if (qualified_name == "aten::_cudnn_ctc_loss") return &cudnn_ctc_loss_lists_plan;
  if (qualified_name == "aten::_cudnn_ctc_loss.Tensor") return &cudnn_ctc_loss_tensor_plan;
  return nullptr;
}

}  // namespace metamem
