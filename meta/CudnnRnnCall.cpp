#include "meta/CudnnRnnCall.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/native/RNN.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <mutex>
#include <vector>

#include "meta/KnownValues.h"
#include "meta/MetaMode.h"

namespace metamem {
namespace {

// Each layer's matrices per hidden unit.
std::int64_t gates(CudnnRnnMode mode) {
  return mode == CudnnRnnMode::Lstm ? 4 : mode == CudnnRnnMode::Gru ? 3 : 1;
}

// The buffer the weights are views of, whole, as try_get_weight_buf finds
// it, or undefined.
at::Tensor weight_buffer(at::TensorList weights) {
  const c10::Storage& storage = weights[0].storage();
  for (const at::Tensor& w : weights)
    if (w.storage().unsafeGetStorageImpl() != storage.unsafeGetStorageImpl() || !w.is_contiguous()) return {};
  const auto elements = static_cast<std::int64_t>(storage.nbytes()) / weights[0].element_size();
  return at::empty({0}, weights[0].options()).set_(storage, 0, {elements}, {1});
}

bool half_eligible(const at::Tensor& t) {
  return t.defined() && t.is_floating_point() && t.scalar_type() != at::kDouble;
}

at::Tensor half(const at::Tensor& t) { return half_eligible(t) ? t.to(at::kHalf) : t; }

// cuDNN's dropout state as get_dropout_state keeps it, per device for the
// process, which a trace stands for: made (after an 8-byte seed drawn on
// the device) at a trace's first RNN that drops out in training, and
// again after each new seed, the one before freed.
at::Tensor dropout_state(double dropout, bool train, c10::Device device, bool reseeded) {
  static std::mutex lock;
  static std::uint64_t made_in = 0;
  static at::Tensor state;
  std::lock_guard<std::mutex> hold(lock);
  if (state.defined() && made_in == trace_number() && !reseeded) return state;
  std::int64_t seed = 0;
  {
    PlaceholderValues placeholder;  // the seed's value changes no size
    seed = at::empty({}, at::TensorOptions().dtype(at::kLong).device(device)).random_().item<std::int64_t>();
  }
  state = at::_cudnn_init_dropout_state(dropout, train, seed, at::kByte, std::nullopt, device, std::nullopt);
  made_in = trace_number();
  return state;
}

}  // namespace

std::int64_t cudnn_rnn_weight_space(at::TensorList weights, CudnnRnnMode mode, std::int64_t hidden_size,
                                    std::int64_t num_layers, bool bidirectional, bool has_biases) {
  std::int64_t elements = has_biases ? 0 : 2 * gates(mode) * hidden_size * num_layers * (bidirectional ? 2 : 1);
  for (const at::Tensor& w : weights) elements += w.numel();
  return elements;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> run_cudnn_rnn(
    CudnnRnnMode mode, const at::Tensor& input, const at::Tensor& hx, const at::Tensor& cx, at::TensorList weights,
    bool has_biases, std::int64_t num_layers, double dropout, bool train, bool bidirectional, bool batch_first,
    at::IntArrayRef batch_sizes, const std::function<bool()>& reseeded) {
  std::int64_t hidden_size = hx.size(2), proj_size = 0;
  if (cx.defined() && cx.size(2) != hx.size(2)) hidden_size = cx.size(2), proj_size = hx.size(2);
  const std::int64_t weight_stride0 = (has_biases ? 4 : 2) + (proj_size != 0);
  std::vector<at::Tensor> params = weights.vec();
  at::Tensor flat = weight_buffer(weights);
  const at::Tensor state =
      train && dropout > 0 ? dropout_state(dropout, train, input.device(), reseeded()) : at::Tensor();
  at::Tensor x = input, h = hx, c = cx;
  if (at::autocast::is_autocast_enabled(at::kCUDA)) {
    const at::Tensor& source = flat.defined() ? flat : params[0];
    if (half_eligible(source) && source.scalar_type() != at::kHalf) {
      // Tensors on the new buffer's storage, not views of it: each copy is
      // the weight's own step in autograd, the buffer in none.
      flat = at::zeros({cudnn_rnn_weight_space(weights, mode, hidden_size, num_layers, bidirectional, has_biases)},
                       params[0].options().dtype(at::kHalf));
      std::vector<at::Tensor> pieces;
      std::int64_t offset = 0;
      for (const at::Tensor& w : params) {
        pieces.push_back(at::empty({0}, flat.options()).set_(flat.storage(), offset, w.sizes()));
        offset += w.numel();
      }
      for (std::size_t i = 0; i < params.size(); ++i) pieces[i].copy_(params[i]);
      params = std::move(pieces);
    }
    x = half(x), h = half(h), c = half(c);
  }
  // Autocast's kernel of _cudnn_rnn would ask cuDNN: its cast is above.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
  auto [output, hy, cy, reserve, weights_used] =
      at::_cudnn_rnn(x, params, weight_stride0, flat.defined() ? std::optional<at::Tensor>(flat) : std::nullopt, h,
                     c.defined() ? std::optional<at::Tensor>(c) : std::nullopt, static_cast<std::int64_t>(mode),
                     hidden_size, proj_size, num_layers, batch_first, dropout, train, bidirectional, batch_sizes,
                     state.defined() ? std::optional<at::Tensor>(state) : std::nullopt);
  return {output, hy, cy};
}

namespace {

// A stub's call. The C++ front end's CUDA generator keeps no RNN state for
// a new seed to reset.
template <CudnnRnnMode mode>
std::tuple<at::Tensor, at::Tensor, at::Tensor> call(const at::Tensor& input, const at::Tensor& batch_sizes,
                                                   const at::Tensor& hx, const at::Tensor& cx, at::TensorList params,
                                                   bool has_biases, std::int64_t num_layers, double dropout, bool train,
                                                   bool bidirectional, bool batch_first) {
  std::vector<std::int64_t> sizes;
  if (batch_sizes.defined()) {
    const auto known = known_integers(batch_sizes);
    TORCH_CHECK(known.has_value(), "metamem: a packed sequence's batch sizes are not known to the trace");
    sizes = *known;
  }
  return run_cudnn_rnn(mode, input, hx, cx, params, has_biases, num_layers, dropout, train, bidirectional,
                       batch_first, sizes, [] { return false; });
}

void lstm(at::Tensor& output, at::Tensor& hy, at::Tensor& cy, const at::Tensor& input, at::TensorList hx,
          at::TensorList params, bool has_biases, std::int64_t num_layers, double dropout, bool train,
          bool bidirectional, bool batch_first) {
  std::tie(output, hy, cy) = call<CudnnRnnMode::Lstm>(input, {}, hx[0], hx[1], params, has_biases, num_layers,
                                                      dropout, train, bidirectional, batch_first);
}

void lstm_packed(at::Tensor& output, at::Tensor& hy, at::Tensor& cy, const at::Tensor& data,
                 const at::Tensor& batch_sizes, at::TensorList hx, at::TensorList params, bool has_biases,
                 std::int64_t num_layers, double dropout, bool train, bool bidirectional) {
  std::tie(output, hy, cy) = call<CudnnRnnMode::Lstm>(data, batch_sizes, hx[0], hx[1], params, has_biases,
                                                      num_layers, dropout, train, bidirectional, false);
}

template <CudnnRnnMode mode>
void one_hidden(at::Tensor& output, at::Tensor& hy, const at::Tensor& input, const at::Tensor& hx,
                at::TensorList params, bool has_biases, std::int64_t num_layers, double dropout, bool train,
                bool bidirectional, bool batch_first) {
  std::tie(output, hy, std::ignore) =
      call<mode>(input, {}, hx, {}, params, has_biases, num_layers, dropout, train, bidirectional, batch_first);
}

template <CudnnRnnMode mode>
void one_hidden_packed(at::Tensor& output, at::Tensor& hy, const at::Tensor& data, const at::Tensor& batch_sizes,
                       const at::Tensor& hx, at::TensorList params, bool has_biases, std::int64_t num_layers,
                       double dropout, bool train, bool bidirectional) {
  std::tie(output, hy, std::ignore) =
      call<mode>(data, batch_sizes, hx, {}, params, has_biases, num_layers, dropout, train, bidirectional, false);
}

// Sets (or, with `install` false, clears) the stubs' CUDA kernels.
void set_stubs(bool install) {
  auto kernel = [install](auto function) { return install ? function : nullptr; };
  at::native::lstm_cudnn_stub.set_cuda_dispatch_ptr(kernel(&lstm));
  at::native::lstm_packed_cudnn_stub.set_cuda_dispatch_ptr(kernel(&lstm_packed));
  at::native::gru_cudnn_stub.set_cuda_dispatch_ptr(kernel(&one_hidden<CudnnRnnMode::Gru>));
  at::native::gru_packed_cudnn_stub.set_cuda_dispatch_ptr(kernel(&one_hidden_packed<CudnnRnnMode::Gru>));
  at::native::rnn_tanh_cudnn_stub.set_cuda_dispatch_ptr(kernel(&one_hidden<CudnnRnnMode::RnnTanh>));
  at::native::rnn_tanh_packed_cudnn_stub.set_cuda_dispatch_ptr(
      kernel(&one_hidden_packed<CudnnRnnMode::RnnTanh>));
  at::native::rnn_relu_cudnn_stub.set_cuda_dispatch_ptr(kernel(&one_hidden<CudnnRnnMode::RnnRelu>));
  at::native::rnn_relu_packed_cudnn_stub.set_cuda_dispatch_ptr(
      kernel(&one_hidden_packed<CudnnRnnMode::RnnRelu>));
}

}  // namespace

CudnnRnnStubsScope::CudnnRnnStubsScope() { set_stubs(true); }
CudnnRnnStubsScope::~CudnnRnnStubsScope() { set_stubs(false); }

}  // namespace metamem
