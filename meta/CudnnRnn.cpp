// cuDNN's RNN kernels as a fake-cuda trace runs them where the fake GPU
// records cuDNN (called as meta/CudnnRnnCall.cpp calls them): the shapes
// of their returns. What they hold inside (a workspace each) and the sizes
// of the forward's reserve space and of the dropout state, which cuDNN
// chooses, come from the recording of the same call (meta/MetaMode.cpp);
// without one the trace cannot size them and stops.
#include <ATen/ATen.h>

#include <array>
#include <tuple>
#include <vector>

#include "meta/MetaMode.h"
#include "meta/OwnKernel.h"

namespace metamem {
namespace {

// Where a call has no recording.
constexpr const char* kNoRecording =
    " sizes what it holds as cuDNN chooses, which a trace learns from the fake GPU "
    "(trace(fake_gpu=...)). It has no recording of this call.";

// A contiguous tensor like `like`, or none like none (an RNN's cell state).
at::Tensor empty_like_defined(const at::Tensor& like) {
  return like.defined() ? at::empty_like(like, at::MemoryFormat::Contiguous) : at::Tensor();
}

// Forward: the output (the input's time and batch, in its order, or a
// packed sequence's steps; directions x the hidden or projected size), the
// last hidden and cell states, the reserve space (its size recorded) and
// the flat weights: the buffer given, or a copy whose size the recording
// gives.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> cudnn_rnn(
    const at::Tensor& input, at::TensorList, int64_t, const std::optional<at::Tensor>& weight_buf,
    const at::Tensor& hx, const std::optional<at::Tensor>& cx, int64_t, c10::SymInt, c10::SymInt, int64_t,
    bool, double, bool, bool bidirectional, c10::SymIntArrayRef, const std::optional<at::Tensor>&) {
  check_recorded_call("aten::_cudnn_rnn", kNoRecording);
  std::vector<int64_t> sizes = input.sizes().vec();
  sizes.back() = hx.size(2) * (bidirectional ? 2 : 1);
  const at::TensorOptions bytes = input.options().dtype(at::kByte);
  return {at::empty(sizes, input.options()), at::empty_like(hx, at::MemoryFormat::Contiguous),
          empty_like_defined(cx.value_or(at::Tensor())), at::empty({0}, bytes),
          weight_buf && weight_buf->defined() ? *weight_buf : at::empty({0}, input.options())};
}

// Backward, where a gradient comes in: the gradients of the input and the
// initial states (whatever is asked: libtorch's backward of the input runs
// unconditionally, since it writes the reserve space), and of the weights:
// views of one buffer of the flat weights' size where cuDNN's layout is the
// weights' own (weights and biases: weight_stride0 4, or 5 with an LSTM's
// projections), else each copied out of it into a buffer of its own (the
// copy's source is a temporary of the recording).
std::tuple<at::Tensor, at::Tensor, at::Tensor, std::vector<at::Tensor>> cudnn_rnn_backward(
    const at::Tensor& input, at::TensorList weight, int64_t weight_stride0, const at::Tensor& weight_buf,
    const at::Tensor& hx,
    const std::optional<at::Tensor>& cx, const at::Tensor&, const std::optional<at::Tensor>& grad_output,
    const std::optional<at::Tensor>& grad_hy, const std::optional<at::Tensor>& grad_cy, int64_t, c10::SymInt,
    c10::SymInt, int64_t,
    bool, double, bool, bool, c10::SymIntArrayRef, const std::optional<at::Tensor>&, const at::Tensor&,
    std::array<bool, 4> output_mask) {
  check_recorded_call("aten::_cudnn_rnn_backward", kNoRecording);
  auto given = [](const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); };
  if (!given(grad_output) && !given(grad_hy) && !given(grad_cy))
    return {at::Tensor(), at::Tensor(), at::Tensor(), std::vector<at::Tensor>(weight.size())};
  std::vector<at::Tensor> weight_grads;
  if (output_mask[3] && (weight_stride0 == 4 || weight_stride0 == 5)) {
    const at::Tensor flat = at::empty_like(weight_buf, at::MemoryFormat::Contiguous).view(-1);
    int64_t offset = 0;
    for (const at::Tensor& w : weight) {
      weight_grads.push_back(flat.narrow(0, offset, w.numel()).view(w.sizes()));
      offset += w.numel();
    }
  } else if (output_mask[3]) {
    for (const at::Tensor& w : weight) weight_grads.push_back(at::empty_like(w, at::MemoryFormat::Contiguous));
  }
  return {empty_like_defined(input), empty_like_defined(hx), empty_like_defined(cx.value_or(at::Tensor())),
          std::move(weight_grads)};
}

// cuDNN's dropout state: bytes, as many as cuDNN asks for the GPU (recorded).
at::Tensor cudnn_init_dropout_state(double, bool, int64_t, std::optional<at::ScalarType>,
                                    std::optional<at::Layout>, std::optional<at::Device>, std::optional<bool>) {
  check_recorded_call("aten::_cudnn_init_dropout_state", kNoRecording);
  return at::empty({0}, at::TensorOptions().dtype(at::kByte).device(at::kMeta));
}

}  // namespace

std::vector<OwnKernelEntry> cudnn_rnn_kernels() {
  return {own("_cudnn_rnn", TORCH_FN(cudnn_rnn)), own("_cudnn_rnn_backward", TORCH_FN(cudnn_rnn_backward)),
          own("_cudnn_init_dropout_state", TORCH_FN(cudnn_init_dropout_state))};
}

}  // namespace metamem
