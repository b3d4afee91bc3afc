// How metamem's meta kernels are listed (internal to meta/): a boxed kernel
// for the meta layer and a way to register it on the Meta key.
#pragma once

#include <ATen/core/boxing/KernelFunction.h>
#include <torch/library.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace metamem {

struct OwnKernel {
  c10::KernelFunction kernel;
  std::function<void(torch::Library&, const char*)> register_on;
};

using OwnKernelEntry = std::pair<const std::string, OwnKernel>;

// `qualified` is the op's name without "aten::", with its overload:
// "flip", "upsample_nearest3d.vec".
template <class Fn>
OwnKernelEntry own(const char* qualified, Fn fn) {
  return {qualified, {c10::KernelFunction::makeFromUnboxedFunction(fn),
                      [fn](torch::Library& lib, const char* name) { lib.impl(name, fn); }}};
}

// The torch::nn layers' kernels (meta/LayerKernels.cpp): activations,
// losses, padding, pooling, normalization, embedding bags, recurrent cells.
std::vector<OwnKernelEntry> layer_kernels();

// CTC loss's rule, torch's own kernels and cuDNN's (meta/CtcLoss.cpp).
std::vector<OwnKernelEntry> ctc_loss_kernels();

// ctc_loss's own composites, which read their lengths through data_ptr,
// as a trace runs them in autograd's place ("ctc_loss.Tensor", ...).
std::vector<std::pair<std::string, c10::KernelFunction>> ctc_loss_composites();

// pack_padded_sequence's kernel, which reads the lengths' values, as a
// trace runs it below autograd ("_pack_padded_sequence";
// meta/PackedSequence.cpp).
std::vector<std::pair<std::string, c10::KernelFunction>> packed_sequence_kernels();

// aten::_convolution, which torch.jit.trace records where Python called
// convolution, as a trace runs it below autograd: as aten::convolution,
// whose models and recordings are metamem's, under the cuDNN flags the
// graph carries ("_convolution"; meta/MetaKernels.cpp).
std::vector<std::pair<std::string, c10::KernelFunction>> traced_convolution_kernels();

// pad_packed_sequence's composite, which writes the lengths it answers
// through data_ptr, as a trace runs it in autograd's place
// ("_pad_packed_sequence").
std::vector<std::pair<std::string, c10::KernelFunction>> packed_sequence_composites();

// cuDNN's RNN forward and backward, whose recordings size what they hold
// (meta/CudnnRnn.cpp).
std::vector<OwnKernelEntry> cudnn_rnn_kernels();

// oneDNN's RNN layer, forward and backward, whose recordings size what they
// hold (meta/OneDnnRnn.cpp).
std::vector<OwnKernelEntry> onednn_rnn_kernels();

// scaled_dot_product_attention's CUDA kernels (meta/CudaAttention.cpp):
// FlashAttention, memory-efficient and cuDNN attention, forward and backward.
std::vector<OwnKernelEntry> cuda_attention_kernels();

}  // namespace metamem
