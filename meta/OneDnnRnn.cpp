// oneDNN's RNN layer on a CPU trace: the shapes of its returns. What it
// holds and how large its workspace is, a recording of the real layer
// gives (meta/CpuKernelRecording.h).
#include <ATen/ATen.h>

#include <optional>
#include <tuple>

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

}  // namespace

std::vector<OwnKernelEntry> onednn_rnn_kernels() {
  return {own("mkldnn_rnn_layer", TORCH_FN(mkldnn_rnn_layer)),
          own("mkldnn_rnn_layer_backward", TORCH_FN(mkldnn_rnn_layer_backward))};
}

}  // namespace metamem
