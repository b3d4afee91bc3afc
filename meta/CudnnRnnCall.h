// How torch calls cuDNN's RNN kernel: at::native's _cudnn_impl
// (aten/src/ATen/native/cudnn/RNN.cpp), the CUDA dispatch of at::lstm,
// at::gru, at::rnn_tanh and at::rnn_relu where cuDNN takes them, as a
// fake-cuda trace that follows the fake GPU's recordings runs it: Python's
// traces from torch._VF (metamem/_cuda.py), the C++ front end's through
// libtorch's dispatch stubs (CudnnRnnStubsScope).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <tuple>

namespace metamem {

// cudnnRNNMode_t.
enum class CudnnRnnMode : std::int64_t { RnnRelu = 0, RnnTanh = 1, Lstm = 2, Gru = 3 };

// One call: the hidden size is the cell state's where a projection makes
// the hidden state smaller; the weights' buffer is passed where they are
// views of one (else _cudnn_rnn copies them into one, at each call); the
// dropout state, where the RNN drops out in training, comes before the
// call; under CUDA autocast the weights are copied into a new half buffer
// and the input and states cast to half (at::autocast's
// _cudnn_rnn_cast_reflatten). `cx` is undefined but for an LSTM,
// `batch_sizes` empty but for a packed sequence. `reseeded()`, asked where
// the RNN drops out in training, says whether the device's generator was
// seeded (or its state set) since the dropout state was made. Returns the
// output and the last hidden and cell states.
std::tuple<at::Tensor, at::Tensor, at::Tensor> run_cudnn_rnn(
    CudnnRnnMode mode, const at::Tensor& input, const at::Tensor& hx, const at::Tensor& cx, at::TensorList weights,
    bool has_biases, std::int64_t num_layers, double dropout, bool train, bool bidirectional, bool batch_first,
    at::IntArrayRef batch_sizes, const std::function<bool()>& reseeded);

// The elements of cuDNN's weight space: the weights, and room for the
// biases also where the RNN has none (what flatten_parameters makes).
std::int64_t cudnn_rnn_weight_space(at::TensorList weights, CudnnRnnMode mode, std::int64_t hidden_size,
                                    std::int64_t num_layers, bool bidirectional, bool has_biases);

// While alive, in a process without libtorch's CUDA library (whose stubs
// would be taken otherwise), at::lstm & co. on fake cuda reach
// run_cudnn_rnn where cuDNN takes them.
class CudnnRnnStubsScope {
 public:
  CudnnRnnStubsScope();
  ~CudnnRnnStubsScope();
  CudnnRnnStubsScope(const CudnnRnnStubsScope&) = delete;
  CudnnRnnStubsScope& operator=(const CudnnRnnStubsScope&) = delete;
};

}  // namespace metamem
