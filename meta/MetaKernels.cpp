#include "meta/MetaKernels.h"

#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Reduction.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/native/GroupedMMUtils.h>
#include <torch/library.h>

#include <functional>
#include <string>
#include <unordered_map>
#include <utility>

#include "meta/MetaMode.h"
#include "meta/OwnKernel.h"

namespace metamem {
namespace {

at::Tensor relu(const at::Tensor& self) { return at::empty_like(self); }
at::Tensor& relu_(at::Tensor& self) { return self; }

// CUDA's fused dropout returns the output and a bool keep-mask.
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double,
                                                  c10::optional<bool>) {
  return {at::empty_like(input), at::empty_like(input, input.options().dtype(at::kBool))};
}
at::Tensor native_dropout_backward(const at::Tensor& grad, const at::Tensor&, double) {
  return at::empty_like(grad);
}

std::vector<std::int64_t> conv_output_size(const at::Tensor& input, const at::Tensor& weight,
                                           at::IntArrayRef stride, at::IntArrayRef padding,
                                           at::IntArrayRef dilation, bool transposed,
                                           at::IntArrayRef output_padding, std::int64_t groups) {
  const std::int64_t spatial = input.dim() - 2;
  auto at = [](at::IntArrayRef v, std::int64_t i) { return v.size() == 1 ? v[0] : v[i]; };
  std::vector<std::int64_t> size = {input.size(0),
                                    transposed ? weight.size(1) * groups : weight.size(0)};
  for (std::int64_t i = 0; i < spatial; ++i) {
    const std::int64_t in = input.size(i + 2), kernel = weight.size(i + 2);
    const std::int64_t extent = at(dilation, i) * (kernel - 1);
    size.push_back(transposed ? (in - 1) * at(stride, i) - 2 * at(padding, i) + extent +
                                    at(output_padding, i) + 1
                              : (in + 2 * at(padding, i) - extent - 1) / at(stride, i) + 1);
  }
  return size;
}

bool models_cpu() { return fake_device().is_cpu(); }

at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight,
                       const c10::optional<at::Tensor>&, at::IntArrayRef stride,
                       at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                       at::IntArrayRef output_padding, std::int64_t groups) {
  TORCH_CHECK(input.scalar_type() == weight.scalar_type(), "convolution: input type (",
              input.scalar_type(), ") and weight type (", weight.scalar_type(),
              ") should be the same");
  TORCH_CHECK(input.dim() == weight.dim() &&
                  input.size(1) == (transposed ? weight.size(0) : weight.size(1) * groups),
              "convolution: input of shape ", input.sizes(), " does not fit weight of shape ",
              weight.sizes(), " with groups=", groups);
  auto size = conv_output_size(input, weight, stride, padding, dilation, transposed,
                               output_padding, groups);
  // CUDA's own kernels (a fake GPU has no cuDNN) compute contiguously,
  // whatever the input's layout.
  return at::empty(size, input.options().memory_format(models_cpu() ? input.suggest_memory_format()
                                                                    : at::MemoryFormat::Contiguous));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    at::OptionalIntArrayRef bias_sizes, at::IntArrayRef stride, at::IntArrayRef padding,
    at::IntArrayRef, bool transposed, at::IntArrayRef, std::int64_t groups,
    std::array<bool, 3> output_mask) {
  // The CPU's backends compute a 2-d convolution channels last when its
  // input or weight is, and contiguous otherwise, whatever the input's
  // strides (a permuted view, as compiled ConvNeXt blocks pass); CUDA's own
  // kernels always contiguously. Both gradients come out in that layout (and
  // autograd copies the weight's into the parameter's).
  const bool channels_last = models_cpu() && input.dim() == 4 &&
                             (input.suggest_memory_format() == at::MemoryFormat::ChannelsLast ||
                              weight.suggest_memory_format() == at::MemoryFormat::ChannelsLast);
  const auto layout = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  return {output_mask[0] ? at::empty_like(input, layout) : at::Tensor(),
          output_mask[1] ? at::empty_like(weight, layout) : at::Tensor(),
          output_mask[2] ? at::empty(bias_sizes ? bias_sizes->vec() : std::vector<std::int64_t>{weight.size(0)},
                                     weight.options())
                         : at::Tensor()};
}

// aten::convolution is aten::_convolution with the process's cuDNN flags
// (benchmark, deterministic, enabled, TF32); a graph made by
// torch.jit.trace calls _convolution with the flags of the process that
// traced it. So _convolution runs as convolution with the graph's flags
// set for the call: on a fake cuda they choose between cuDNN and torch's
// own kernels and cuDNN's engines; on a CPU no backend reads them. Its
// backward (convolution_backward) reads the process's flags, on both
// sides. TF32 stays as the process has it: torch keeps it per backend and
// op with inherited defaults, which a scoped change could not put back
// exactly (docs/torchscript.md).
class CudnnFlagsForCall {
 public:
  CudnnFlagsForCall(bool benchmark, bool deterministic, bool enabled)
      : benchmark_(context_.benchmarkCuDNN()),
        deterministic_(context_.deterministicCuDNN()),
        enabled_(context_.userEnabledCuDNN()) {
    context_.setBenchmarkCuDNN(benchmark);
    context_.setDeterministicCuDNN(deterministic);
    context_.setUserEnabledCuDNN(enabled);
  }
  ~CudnnFlagsForCall() {
    context_.setBenchmarkCuDNN(benchmark_);
    context_.setDeterministicCuDNN(deterministic_);
    context_.setUserEnabledCuDNN(enabled_);
  }
  CudnnFlagsForCall(const CudnnFlagsForCall&) = delete;
  CudnnFlagsForCall& operator=(const CudnnFlagsForCall&) = delete;

 private:
  at::Context& context_ = at::globalContext();
  const bool benchmark_, deterministic_, enabled_;
};

void convolution_with_flags(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  // _convolution's arguments: convolution's nine, then benchmark,
  // deterministic, cudnn_enabled and allow_tf32.
  const std::size_t flags = stack->size() - 4;
  const CudnnFlagsForCall scope((*stack)[flags].toBool(), (*stack)[flags + 1].toBool(), (*stack)[flags + 2].toBool());
  stack->resize(flags);
  static const c10::OperatorHandle convolution =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution", "");
  convolution.callBoxed(stack);
}

// Norm statistics: on CUDA the accumulate type; on CPU the input's dtype,
// or fp32 where a bf16 input meets fp32 parameters (libtorch's mixed-type
// kernels, which autocast reaches).
at::TensorOptions statistics_options(const at::Tensor& input, const c10::optional<at::Tensor>& parameter) {
  if (!models_cpu()) return input.options().dtype(at::toAccumulateType(input.scalar_type(), /*is_cuda=*/true));
  const bool mixed = input.scalar_type() == at::kBFloat16 && parameter && parameter->defined() &&
                     parameter->scalar_type() == at::kFloat;
  return input.options().dtype(mixed ? at::kFloat : input.scalar_type());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm(
    const at::Tensor& input, const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>&,
    const c10::optional<at::Tensor>& running_mean, const c10::optional<at::Tensor>&, bool training, double,
    double) {
  const std::int64_t stats = training ? input.size(1) : 0;
  const at::TensorOptions options = statistics_options(input, weight && weight->defined() ? weight : running_mean);
  return {at::empty_like(input), at::empty({stats}, options), at::empty({stats}, options)};
}

// cuDNN's batch norm, where torch has cuDNN (and a Python trace runs
// torch's decomposition of it): its output in the input's layout, the
// statistics in the weight's dtype (none out of training), and a reserve
// space of no bytes, which cuDNN 9 asks for a batch norm without an
// activation (equal to real torch on the fake GPU and a real H200).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> cudnn_batch_norm(
    const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>&,
    const c10::optional<at::Tensor>&, const c10::optional<at::Tensor>&, bool training, double, double) {
  const std::int64_t stats = training ? input.size(1) : 0;
  return {at::empty_like(input), at::empty({stats}, weight.options()), at::empty({stats}, weight.options()),
          at::empty({0}, input.options().dtype(at::kByte))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> cudnn_batch_norm_backward(
    const at::Tensor& input, const at::Tensor&, const at::Tensor& weight, const c10::optional<at::Tensor>&,
    const c10::optional<at::Tensor>&, const c10::optional<at::Tensor>&, const c10::optional<at::Tensor>&, double,
    const at::Tensor&) {
  return {at::empty_like(input), at::empty_like(weight), at::empty_like(weight)};
}

// 2.x's functional batch norm with running statistics, as the CPU runs it:
// native_batch_norm's kernel (no statistics out of training).
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm_legit(
    const at::Tensor& input, const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias,
    at::Tensor& running_mean, at::Tensor& running_var, bool training, double momentum, double eps) {
  return (native_batch_norm)(input, weight, bias, running_mean, running_var, training, momentum, eps);  // no ADL: at:: has one
}

// Mean and rstd keep the input's leading dimensions, with ones for the
// normalized ones.
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm(
    const at::Tensor& input, at::IntArrayRef normalized_shape, const c10::optional<at::Tensor>& weight,
    const c10::optional<at::Tensor>&, double) {
  auto stat_shape = input.sizes().vec();
  const std::size_t axis = stat_shape.size() - normalized_shape.size();
  std::fill(stat_shape.begin() + static_cast<std::ptrdiff_t>(axis), stat_shape.end(), 1);
  return {at::empty_like(input, at::MemoryFormat::Contiguous),
          at::empty(stat_shape, statistics_options(input, weight)),
          at::empty(stat_shape, statistics_options(input, weight))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, const c10::optional<at::Tensor>& weight,
    const c10::optional<at::Tensor>&, const c10::optional<at::Tensor>&,
    const c10::optional<at::Tensor>&, const c10::optional<at::Tensor>&, bool, double,
    std::array<bool, 3> output_mask) {
  auto channel = [&] { return at::empty({input.size(1)}, weight->options()); };
  return {output_mask[0] ? at::empty_like(input) : at::Tensor(),
          output_mask[1] ? channel() : at::Tensor(), output_mask[2] ? channel() : at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, at::IntArrayRef normalized_shape,
    const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>& weight,
    const c10::optional<at::Tensor>& bias, std::array<bool, 3> output_mask) {
  // The input gradient is contiguous whatever the input's layout, as the output is.
  return {output_mask[0] ? at::empty_like(input, at::MemoryFormat::Contiguous) : at::Tensor(),
          output_mask[1] && weight ? at::empty_like(*weight) : at::Tensor(),
          output_mask[2] && bias ? at::empty_like(*bias) : at::Tensor()};
}

// Group norm's input gradient is laid out as the input on CPU (whose kernel
// reads channels-last as it is) and contiguous on CUDA (whose kernel reads a
// contiguous copy); torch's Python meta function makes it contiguous.
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_group_norm_backward(
    const at::Tensor&, const at::Tensor& input, const at::Tensor&, const at::Tensor&,
    const c10::optional<at::Tensor>& weight, c10::SymInt, c10::SymInt channels, c10::SymInt, std::int64_t,
    std::array<bool, 3> output_mask) {
  const auto format = models_cpu() ? input.suggest_memory_format() : at::MemoryFormat::Contiguous;
  const auto options = weight && weight->defined() ? weight->options() : input.options();
  auto channel = [&] { return at::empty({channels.expect_int()}, options); };
  return {output_mask[0] ? at::empty_like(input, format) : at::Tensor(),
          output_mask[1] ? channel() : at::Tensor(), output_mask[2] ? channel() : at::Tensor()};
}

at::Tensor adaptive_avg_pool2d(const at::Tensor& self, at::IntArrayRef output_size) {
  auto size = self.sizes().vec();
  size[size.size() - 2] = output_size[0];
  size[size.size() - 1] = output_size[1];
  return at::empty(size, self.options().memory_format(self.suggest_memory_format()));
}

at::Tensor adaptive_avg_pool2d_backward(const at::Tensor& grad_output, const at::Tensor& self) {
  return at::empty_like(self);
}

at::Tensor embedding(const at::Tensor& weight, const at::Tensor& indices, std::int64_t, bool,
                     bool) {
  auto size = indices.sizes().vec();
  size.push_back(weight.size(1));
  return at::empty(size, weight.options());
}

at::Tensor embedding_dense_backward(const at::Tensor& grad_output, const at::Tensor&,
                                    std::int64_t num_weights, std::int64_t, bool) {
  return at::empty({num_weights, grad_output.size(-1)}, grad_output.options());
}

at::Tensor index_select(const at::Tensor& self, std::int64_t dim, const at::Tensor& index) {
  auto size = self.sizes().vec();
  if (!size.empty()) size[c10::maybe_wrap_dim(dim, self.dim())] = index.numel();
  return at::empty(size, self.options());
}

at::Tensor hardtanh_backward(const at::Tensor& grad_output, const at::Tensor&, const at::Scalar&,
                             const at::Scalar&) {
  return at::empty_like(grad_output);
}

// Gradients of pooling and padding that native kernels zero-fill in the
// input's shape, contiguous.
at::Tensor input_shaped_gradient(const at::Tensor&, const at::Tensor& self) {
  return at::empty_like(self, at::MemoryFormat::Contiguous);
}
at::Tensor padding_backward(const at::Tensor& grad_output, const at::Tensor& self, at::IntArrayRef) {
  return input_shaped_gradient(grad_output, self);
}

at::Tensor upsample_nearest3d(const at::Tensor& input, at::OptionalIntArrayRef output_size,
                              c10::optional<at::ArrayRef<double>> scale_factors) {
  auto size = input.sizes().vec();
  for (std::size_t i = 0; i < 3; ++i) {
    const std::size_t d = size.size() - 3 + i;
    size[d] = output_size ? (*output_size)[i]
                          : static_cast<std::int64_t>(std::floor(static_cast<double>(size[d]) * (*scale_factors)[i]));
  }
  return at::empty(size, input.options().memory_format(input.suggest_memory_format()));
}

// Unpooling writes a zeroed (batch,) channels, output_size tensor.
at::Tensor max_unpool(const at::Tensor& self, at::IntArrayRef output_size) {
  auto size = self.sizes().vec();
  size.resize(size.size() - output_size.size());
  size.insert(size.end(), output_size.begin(), output_size.end());
  return at::empty(size, self.options().memory_format(self.suggest_memory_format()));
}
at::Tensor max_unpool2d(const at::Tensor& self, const at::Tensor&, at::IntArrayRef output_size) {
  return max_unpool(self, output_size);
}
at::Tensor max_unpool3d(const at::Tensor& self, const at::Tensor&, at::IntArrayRef output_size,
                        at::IntArrayRef, at::IntArrayRef) {
  return max_unpool(self, output_size);
}

at::Tensor take(const at::Tensor& self, const at::Tensor& index) {
  return at::empty(index.sizes(), self.options());
}

// Without reduction the loss keeps (N, H, W); total_weight is a scalar.
std::tuple<at::Tensor, at::Tensor> nll_loss2d_forward(const at::Tensor& self, const at::Tensor& target,
                                                      const c10::optional<at::Tensor>&,
                                                      std::int64_t reduction, std::int64_t) {
  const bool none = reduction == at::Reduction::None;
  return {none ? at::empty(target.sizes(), self.options()) : at::empty({}, self.options()),
          at::empty({}, self.options())};
}

// The solution is B broadcast against A's batch, column-major (LAPACK's).
at::Tensor linalg_solve_triangular(const at::Tensor& A, const at::Tensor& B, bool, bool, bool) {
  auto size = at::infer_size(A.sizes().slice(0, A.dim() - 2), B.sizes().slice(0, B.dim() - 2));
  size.push_back(B.size(-1));
  size.push_back(B.size(-2));
  return at::empty(size, B.options()).transpose(-2, -1);
}

std::vector<std::int64_t> reduced_size(const at::Tensor& self, std::int64_t dim, bool keepdim) {
  auto size = self.sizes().vec();
  if (size.empty()) return size;
  dim = c10::maybe_wrap_dim(dim, self.dim());
  if (keepdim) size[dim] = 1;
  else size.erase(size.begin() + dim);
  return size;
}

// A value and its int64 index per slice along `dim`.
std::tuple<at::Tensor, at::Tensor> values_indices(const at::Tensor& self, at::IntArrayRef size) {
  return {at::empty(size, self.options()), at::empty(size, self.options().dtype(at::kLong))};
}

std::tuple<at::Tensor, at::Tensor> median_dim(const at::Tensor& self, std::int64_t dim, bool keepdim) {
  return values_indices(self, reduced_size(self, dim, keepdim));
}
at::Tensor median(const at::Tensor& self) { return at::empty({}, self.options()); }
std::tuple<at::Tensor, at::Tensor> kthvalue(const at::Tensor& self, std::int64_t, std::int64_t dim, bool keepdim) {
  return median_dim(self, dim, keepdim);
}
std::tuple<at::Tensor, at::Tensor> cumulative_extreme(const at::Tensor& self, std::int64_t) {
  return values_indices(self, self.sizes());
}
at::Tensor logcumsumexp(const at::Tensor& self, std::int64_t) {
  return at::empty_like(self, at::MemoryFormat::Contiguous);
}

at::Tensor count_nonzero(const at::Tensor& self, at::IntArrayRef dims) {
  auto keep = self.sizes().vec();
  std::vector<bool> reduced(keep.size(), dims.empty());
  if (!keep.empty())
    for (std::int64_t d : dims) reduced[c10::maybe_wrap_dim(d, self.dim())] = true;
  std::vector<std::int64_t> size;
  for (std::size_t i = 0; i < keep.size(); ++i)
    if (!reduced[i]) size.push_back(keep[i]);
  return at::empty(size, self.options().dtype(at::kLong));
}

std::tuple<at::Tensor, at::Tensor> frexp(const at::Tensor& self) {
  return {at::empty_like(self), at::empty_like(self, self.options().dtype(at::kInt))};
}

at::Tensor rrelu_with_noise(const at::Tensor& self, at::Tensor&, const at::Scalar&, const at::Scalar&, bool,
                            c10::optional<at::Generator>) {
  return at::empty_like(self, at::MemoryFormat::Contiguous);
}

// torch.distributions' samplers and reparameterized gradients (Dirichlet,
// Beta, Gamma, Binomial): each a new contiguous tensor of its first
// operand's sizes, on CUDA (empty_like, contiguous) as on CPU (zeros or
// empty of its sizes).
at::Tensor sample_dirichlet(const at::Tensor& alpha, c10::optional<at::Generator>) {
  return at::empty_like(alpha, at::MemoryFormat::Contiguous);
}
at::Tensor standard_gamma_grad(const at::Tensor& self, const at::Tensor&) {
  return at::empty_like(self, at::MemoryFormat::Contiguous);
}
at::Tensor dirichlet_grad(const at::Tensor& x, const at::Tensor&, const at::Tensor&) {
  return at::empty_like(x, at::MemoryFormat::Contiguous);
}
at::Tensor binomial(const at::Tensor& count, const at::Tensor& prob, c10::optional<at::Generator>) {
  TORCH_CHECK_VALUE(at::isFloatingType(count.scalar_type()),
                    "binomial only supports floating-point dtypes for count, got: ", count.scalar_type());
  TORCH_CHECK_VALUE(at::isFloatingType(prob.scalar_type()),
                    "binomial only supports floating-point dtypes for prob, got: ", prob.scalar_type());
  return at::empty_like(count, at::MemoryFormat::Contiguous);
}

at::Tensor unfold_backward(const at::Tensor& grad, at::IntArrayRef input_sizes, std::int64_t, std::int64_t,
                           std::int64_t) {
  return at::empty(input_sizes, grad.options());
}

// Bucket indices: int64, or int32 on request, in the shape of the values.
at::Tensor bucket_indices(const at::Tensor& values, bool out_int32) {
  return at::empty(values.sizes(), values.options().dtype(out_int32 ? at::kInt : at::kLong));
}
at::Tensor bucketize(const at::Tensor& self, const at::Tensor&, bool out_int32, bool) {
  return bucket_indices(self, out_int32);
}
at::Tensor searchsorted(const at::Tensor&, const at::Tensor& self, bool out_int32, bool,
                        c10::optional<c10::string_view>, const c10::optional<at::Tensor>&) {
  return bucket_indices(self, out_int32);
}

at::Tensor smooth_l1_loss_backward(const at::Tensor&, const at::Tensor& self, const at::Tensor&, std::int64_t,
                                   double) {
  return at::empty_like(self, at::MemoryFormat::Contiguous);
}

at::Tensor fractional_max_pool3d_backward(const at::Tensor& grad_output, const at::Tensor& self, at::IntArrayRef,
                                          at::IntArrayRef, const at::Tensor&) {
  return input_shaped_gradient(grad_output, self);
}

// Pooling's output length along one dimension, as ATen computes it.
std::int64_t pooled_size(std::int64_t in, std::int64_t kernel, std::int64_t pad, std::int64_t stride,
                         std::int64_t dilation, bool ceil_mode) {
  std::int64_t out = (in + 2 * pad - dilation * (kernel - 1) - 1 + (ceil_mode ? stride - 1 : 0)) / stride + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

std::tuple<at::Tensor, at::Tensor> max_pool3d_with_indices(const at::Tensor& self, at::IntArrayRef kernel,
                                                           at::IntArrayRef stride, at::IntArrayRef padding,
                                                           at::IntArrayRef dilation, bool ceil_mode) {
  auto pick = [](at::IntArrayRef v, std::size_t i, std::int64_t fallback) {
    return v.empty() ? fallback : v.size() == 1 ? v[0] : v[i];
  };
  auto size = self.sizes().vec();
  for (std::size_t i = 0; i < 3; ++i) {
    const std::size_t d = size.size() - 3 + i;
    const std::int64_t k = pick(kernel, i, 1);
    size[d] = pooled_size(size[d], k, pick(padding, i, 0), pick(stride, i, k), pick(dilation, i, 1), ceil_mode);
  }
  const auto options = self.options().memory_format(self.suggest_memory_format());
  return {at::empty(size, options), at::empty(size, options.dtype(at::kLong))};
}

// Margin losses: one value per sample without reduction, else a scalar.
at::Tensor multi_margin_loss(const at::Tensor& self, const at::Tensor&, const at::Scalar&, const at::Scalar&,
                             const c10::optional<at::Tensor>&, std::int64_t reduction) {
  const bool none = reduction == at::Reduction::None && self.dim() == 2;
  return none ? at::empty({self.size(0)}, self.options()) : at::empty({}, self.options());
}
std::tuple<at::Tensor, at::Tensor> multilabel_margin_loss_forward(const at::Tensor& self, const at::Tensor& target,
                                                                  std::int64_t reduction) {
  const bool none = reduction == at::Reduction::None && self.dim() == 2;
  return {none ? at::empty({self.size(0)}, self.options()) : at::empty({}, self.options()),
          at::empty(target.sizes(), self.options())};
}

// Grid sampling's gradients: the input's (when asked for) and the grid's.
std::tuple<at::Tensor, at::Tensor> grid_sampler_backward(const at::Tensor&, const at::Tensor& input,
                                                            const at::Tensor& grid, std::int64_t, std::int64_t,
                                                            bool, std::array<bool, 2> output_mask) {
  return {output_mask[0] ? at::empty_like(input, at::MemoryFormat::Contiguous) : at::Tensor(),
          at::empty_like(grid, at::MemoryFormat::Contiguous)};
}

at::Tensor pdist_forward(const at::Tensor& self, double) {
  const std::int64_t n = self.size(0);
  return at::empty({n <= 1 ? 0 : n * (n - 1) / 2}, self.options());
}

// x1's gradient over the batch both operands broadcast to.
at::Tensor cdist_backward(const at::Tensor&, const at::Tensor& x1, const at::Tensor& x2, double, const at::Tensor&) {
  auto size = at::infer_size(x1.sizes().slice(0, x1.dim() - 2), x2.sizes().slice(0, x2.dim() - 2));
  size.push_back(x1.size(-2));
  size.push_back(x1.size(-1));
  return at::empty(size, x1.options());
}

at::Tensor grid_sampler_3d(const at::Tensor& input, const at::Tensor& grid, std::int64_t, std::int64_t, bool) {
  return at::empty({input.size(0), input.size(1), grid.size(1), grid.size(2), grid.size(3)}, input.options());
}

at::Tensor max_pool3d_with_indices_backward(const at::Tensor& grad_output, const at::Tensor& self, at::IntArrayRef,
                                            at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, bool,
                                            const at::Tensor&) {
  return at::empty_like(self, self.suggest_memory_format());
}

at::Tensor multi_margin_loss_backward(const at::Tensor&, const at::Tensor& self, const at::Tensor&,
                                      const at::Scalar&, const at::Scalar&, const c10::optional<at::Tensor>&,
                                      std::int64_t) {
  return at::empty_like(self, at::MemoryFormat::Contiguous);
}

at::Tensor multilabel_margin_loss_backward(const at::Tensor&, const at::Tensor& self, const at::Tensor&,
                                           std::int64_t, const at::Tensor&) {
  return at::empty_like(self, at::MemoryFormat::Contiguous);
}

at::Tensor pdist_backward(const at::Tensor&, const at::Tensor& self, double, const at::Tensor&) {
  return at::empty_like(self, at::MemoryFormat::Contiguous);
}

std::tuple<at::Tensor, at::Tensor> mode(const at::Tensor& self, std::int64_t dim, bool keepdim) {
  return median_dim(self, dim, keepdim);
}

at::Tensor histc(const at::Tensor& self, std::int64_t bins, const at::Scalar&, const at::Scalar&) {
  return at::empty({bins}, self.options());
}

// polar(abs, angle): a complex tensor of their broadcast shape.
at::Tensor polar(const at::Tensor& abs, const at::Tensor& angle) {
  return at::empty(at::infer_size(abs.sizes(), angle.sizes()),
                   abs.options().dtype(c10::toComplexType(abs.scalar_type())));
}

// im2col and col2im write into empty_like(input) resized to their output
// (storage shrinks never): col2im's output keeps its input's size.
at::Tensor unfold_output(const at::Tensor& input, std::vector<std::int64_t> size) {
  return at::empty_like(input, at::MemoryFormat::Contiguous).resize_(size);
}

// The shape checks of torch's own kernels (im2col_shape_check), in their
// words: without them a stride of 0 divided by zero.
void check_unfold(const char* op, at::IntArrayRef kernel, at::IntArrayRef dilation, at::IntArrayRef padding,
                  at::IntArrayRef stride) {
  const auto pair = [op](at::IntArrayRef values, const char* name) {
    TORCH_CHECK(values.size() == 2, op, ": ", name, " must have 2 values, but got ", values.size());
  };
  pair(kernel, "kernel_size");
  pair(dilation, "dilation");
  pair(padding, "padding");
  pair(stride, "stride");
  TORCH_CHECK(kernel[0] > 0 && kernel[1] > 0, "kernel size should be greater than zero, but got ", kernel);
  TORCH_CHECK(stride[0] > 0 && stride[1] > 0, "stride should be greater than zero, but got ", stride);
  TORCH_CHECK(dilation[0] > 0 && dilation[1] > 0, "dilation should be greater than zero, but got ", dilation);
  TORCH_CHECK(padding[0] >= 0 && padding[1] >= 0, "padding should be non-negative, but got ", padding);
}

at::Tensor im2col(const at::Tensor& input, at::IntArrayRef kernel, at::IntArrayRef dilation, at::IntArrayRef padding,
                  at::IntArrayRef stride) {
  check_unfold("im2col", kernel, dilation, padding, stride);
  TORCH_CHECK((input.dim() == 3 || input.dim() == 4) && input.size(-1) > 0 && input.size(-2) > 0 &&
                  input.size(-3) > 0,
              "im2col: expected a 3-d or 4-d input of non-zero channels, height and width, but got sizes ",
              input.sizes());
  const bool batched = input.dim() == 4;
  std::int64_t blocks = 1;
  for (std::size_t i = 0; i < 2; ++i) {
    const std::int64_t in = input.size(input.dim() - 2 + static_cast<std::int64_t>(i));
    blocks *= (in + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) / stride[i] + 1;
  }
  std::vector<std::int64_t> size{input.size(-3) * kernel[0] * kernel[1], blocks};
  if (batched) size.insert(size.begin(), input.size(0));
  return unfold_output(input, size);
}

at::Tensor col2im(const at::Tensor& input, at::IntArrayRef output_size, at::IntArrayRef kernel,
                  at::IntArrayRef dilation, at::IntArrayRef padding, at::IntArrayRef stride) {
  check_unfold("col2im", kernel, dilation, padding, stride);
  TORCH_CHECK(output_size.size() == 2, "col2im: output_size must have 2 values, but got ", output_size.size());
  TORCH_CHECK(input.dim() == 2 || input.dim() == 3, "col2im: expected a 2-d or 3-d input, but got sizes ",
              input.sizes());
  const bool batched = input.dim() == 3;
  std::vector<std::int64_t> size{input.size(-2) / (kernel[0] * kernel[1]), output_size[0], output_size[1]};
  if (batched) size.insert(size.begin(), input.size(0));
  return unfold_output(input, size);
}

// A reduced binary cross entropy shrinks its elementwise loss to 0-dim.
at::Tensor binary_cross_entropy(const at::Tensor& self, const at::Tensor&, const c10::optional<at::Tensor>&,
                                std::int64_t reduction) {
  at::Tensor loss = at::empty_like(self, at::MemoryFormat::Contiguous);
  return reduction == at::Reduction::None ? loss : loss.resize_({});
}

// huber_loss_backward's only meta is Python's (torch._meta_registrations),
// which the engine without Python (the CLI, the C++ tests) does not load.
at::Tensor huber_loss_backward(const at::Tensor&, const at::Tensor& self, const at::Tensor&, std::int64_t,
                               double) {
  return at::empty_like(self, at::MemoryFormat::Contiguous);
}

// The native flip writes into empty_like(self, Preserve): dense strides in
// the input's order, also for an expanded input (Python's meta keeps its
// zero strides).
at::Tensor flip(const at::Tensor& self, at::IntArrayRef) {
  return at::empty_like(self, at::MemoryFormat::Preserve);
}

// narrow_copy writes a contiguous tensor of the narrowed size.
at::Tensor narrow_copy(const at::Tensor& self, std::int64_t dim, c10::SymInt, c10::SymInt length) {
  auto size = self.sizes().vec();
  size[c10::maybe_wrap_dim(dim, self.dim())] = length.expect_int();
  return at::empty(size, self.options());
}

// The CPU flash attention (SDPA's CPU backend; its only meta is Python's)
// writes its output laid out as the query, and its log-sum-exp, in the
// accumulation type, as [batch, seq, heads] seen transposed. Its gradients
// are [batch, seq, heads, dim] seen transposed.
std::tuple<at::Tensor, at::Tensor> cpu_flash_attention(const at::Tensor& query, const at::Tensor&,
                                                       const at::Tensor&, double, bool,
                                                       const c10::optional<at::Tensor>&, c10::optional<double>) {
  const auto accumulate = at::toOpMathType(query.scalar_type());
  at::Tensor logsumexp =
      at::empty({query.size(0), query.size(2), query.size(1)}, query.options().dtype(accumulate));
  return {at::empty_like(query), logsumexp.transpose(1, 2)};
}

at::Tensor heads_second(const at::Tensor& like) {
  return at::empty({like.size(0), like.size(2), like.size(1), like.size(3)}, like.options()).transpose(1, 2);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> cpu_flash_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor&, const at::Tensor&, double, bool, const c10::optional<at::Tensor>&, c10::optional<double>) {
  if (!grad_out.defined()) return {};
  return {heads_second(query), heads_second(key), heads_second(value)};
}

// geqrf factors a column-major copy of each matrix in place, beside its
// Householder scalars (min(m, n) per matrix).
std::tuple<at::Tensor, at::Tensor> geqrf(const at::Tensor& self) {
  auto batch = self.sizes().vec();
  const std::int64_t m = self.size(-2), n = self.size(-1);
  batch.resize(batch.size() - 2);
  auto tau = batch;
  tau.push_back(std::min(m, n));
  return {at::empty_like(self).mT().contiguous().mT(), at::empty(tau, self.options())};
}

// Pixel (un)shuffle always writes a new tensor, laid out as the input.
at::Tensor pixel_shuffle(const at::Tensor& self, std::int64_t factor) {
  auto size = self.sizes().vec();
  const std::size_t c = size.size() - 3;
  size[c] /= factor * factor;
  size[c + 1] *= factor;
  size[c + 2] *= factor;
  return at::empty(size, self.options().memory_format(self.suggest_memory_format()));
}
at::Tensor pixel_unshuffle(const at::Tensor& self, std::int64_t factor) {
  auto size = self.sizes().vec();
  const std::size_t c = size.size() - 3;
  size[c] *= factor * factor;
  size[c + 1] /= factor;
  size[c + 2] /= factor;
  return at::empty(size, self.options().memory_format(self.suggest_memory_format()));
}

// torch's Python meta function for _grouped_mm (mixture-of-experts layers)
// takes bfloat16 and float16 only, cuBLAS's grouped GEMM; the CPU kernel
// takes float32 too. The output as both backends make it: the last
// dimension's stride padded to 16 bytes.
at::Tensor grouped_mm(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& offs,
                      const std::optional<at::Tensor>& bias, std::optional<at::ScalarType> out_dtype) {
  TORCH_CHECK(a.dim() == 2 || a.dim() == 3, "mat_a has to be 2 or 3d");
  TORCH_CHECK(b.dim() == 2 || b.dim() == 3, "mat_b has to be 2 or 3d");
  TORCH_CHECK(offs.has_value() == (a.dim() == 2 || b.dim() == 2),
              "Have to provide offsets if there is a 2d matrix, or no offset if both matrices are 3d");
  TORCH_CHECK(!bias.has_value(), "Bias not supported yet");
  return at::native::create_grouped_gemm_output_tensor(a, b, offs,
                                                       at::native::_resolve_grouped_mm_out_dtype(a, b, out_dtype));
}

// A fake device runs nothing; the tracer sees the op and records the use
// (a free then waits for the stream, as the caching allocator makes it).
void record_stream(at::Tensor&, c10::Stream) {}

// torch.optim's fused steps (fused=True) update their lists in place and
// allocate nothing, on CUDA (one multi-tensor kernel launch, its metadata
// passed as kernel arguments) and on CPU alike; a learning rate given as a
// tensor is read there as it is. Their schemas return nothing: the kernel
// takes its arguments off the stack.
void fused_optimizer_step(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  torch::jit::drop(*stack, op.schema().arguments().size());
}

void register_fused_optimizer_step(torch::Library& lib, const char* name) {
  lib.impl(name, torch::CppFunction::makeFromBoxedFunction<&fused_optimizer_step>());
}

OwnKernelEntry own_fused_optimizer_step(const char* qualified) {
  return {qualified,
          {c10::KernelFunction::makeFromBoxedFunction<&fused_optimizer_step>(), &register_fused_optimizer_step}};
}

const std::unordered_map<std::string, OwnKernel>& own_kernels() {
  static const std::unordered_map<std::string, OwnKernel> kernels = [] {
    std::unordered_map<std::string, OwnKernel> all = {
        own("relu", TORCH_FN(relu)),
        own("relu_", TORCH_FN(relu_)),
        own("record_stream", TORCH_FN(record_stream)),
        own("native_dropout", TORCH_FN(native_dropout)),
        own("native_dropout_backward", TORCH_FN(native_dropout_backward)),
        own("convolution", TORCH_FN(convolution)),
        own("convolution_backward", TORCH_FN(convolution_backward)),
        own("native_batch_norm", TORCH_FN(native_batch_norm)),
        own("native_batch_norm_backward", TORCH_FN(native_batch_norm_backward)),
        own("_native_batch_norm_legit", TORCH_FN(native_batch_norm_legit)),
        own("cudnn_batch_norm", TORCH_FN(cudnn_batch_norm)),
        own("cudnn_batch_norm_backward", TORCH_FN(cudnn_batch_norm_backward)),
        own("native_layer_norm", TORCH_FN(native_layer_norm)),
        own("native_layer_norm_backward", TORCH_FN(native_layer_norm_backward)),
        own("native_group_norm_backward", TORCH_FN(native_group_norm_backward)),
        own("_adaptive_avg_pool2d", TORCH_FN(adaptive_avg_pool2d)),
        own("_adaptive_avg_pool2d_backward", TORCH_FN(adaptive_avg_pool2d_backward)),
        own("embedding", TORCH_FN(embedding)),
        own("embedding_dense_backward", TORCH_FN(embedding_dense_backward)),
        own("index_select", TORCH_FN(index_select)),
        own("hardtanh_backward", TORCH_FN(hardtanh_backward)),
        own("upsample_nearest3d.vec", TORCH_FN(upsample_nearest3d)),
        own("reflection_pad2d_backward", TORCH_FN(padding_backward)),
        own("replication_pad2d_backward", TORCH_FN(padding_backward)),
        own("_adaptive_avg_pool3d_backward", TORCH_FN(input_shaped_gradient)),
        own("max_unpool2d", TORCH_FN(max_unpool2d)),
        own("max_unpool3d", TORCH_FN(max_unpool3d)),
        own("take", TORCH_FN(take)),
        own("nll_loss2d_forward", TORCH_FN(nll_loss2d_forward)),
        own("linalg_solve_triangular", TORCH_FN(linalg_solve_triangular)),
        own("huber_loss_backward", TORCH_FN(huber_loss_backward)),
        own("_scaled_dot_product_flash_attention_for_cpu", TORCH_FN(cpu_flash_attention)),
        own("_scaled_dot_product_flash_attention_for_cpu_backward", TORCH_FN(cpu_flash_attention_backward)),
        own("im2col", TORCH_FN(im2col)),
        own("col2im", TORCH_FN(col2im)),
        own("binary_cross_entropy", TORCH_FN(binary_cross_entropy)),
        own("mode", TORCH_FN(mode)),
        own("histc", TORCH_FN(histc)),
        own("polar", TORCH_FN(polar)),
        own("median", TORCH_FN(median)),
        own("median.dim", TORCH_FN(median_dim)),
        own("kthvalue", TORCH_FN(kthvalue)),
        own("cummax", TORCH_FN(cumulative_extreme)),
        own("cummin", TORCH_FN(cumulative_extreme)),
        own("logcumsumexp", TORCH_FN(logcumsumexp)),
        own("count_nonzero.dim_IntList", TORCH_FN(count_nonzero)),
        own("frexp.Tensor", TORCH_FN(frexp)),
        own("rrelu_with_noise", TORCH_FN(rrelu_with_noise)),
        own("_sample_dirichlet", TORCH_FN(sample_dirichlet)),
        own("_standard_gamma_grad", TORCH_FN(standard_gamma_grad)),
        own("_dirichlet_grad", TORCH_FN(dirichlet_grad)),
        own("binomial", TORCH_FN(binomial)),
        own("unfold_backward", TORCH_FN(unfold_backward)),
        own("bucketize.Tensor", TORCH_FN(bucketize)),
        own("searchsorted.Tensor", TORCH_FN(searchsorted)),
        own("smooth_l1_loss_backward", TORCH_FN(smooth_l1_loss_backward)),
        own("fractional_max_pool3d_backward", TORCH_FN(fractional_max_pool3d_backward)),
        own("replication_pad3d_backward", TORCH_FN(padding_backward)),
        own("max_pool3d_with_indices", TORCH_FN(max_pool3d_with_indices)),
        own("multi_margin_loss", TORCH_FN(multi_margin_loss)),
        own("multilabel_margin_loss_forward", TORCH_FN(multilabel_margin_loss_forward)),
        own("grid_sampler_2d_backward", TORCH_FN(grid_sampler_backward)),
        own("_pdist_forward", TORCH_FN(pdist_forward)),
        own("_cdist_backward", TORCH_FN(cdist_backward)),
        own("grid_sampler_3d", TORCH_FN(grid_sampler_3d)),
        own("grid_sampler_3d_backward", TORCH_FN(grid_sampler_backward)),
        own("max_pool3d_with_indices_backward", TORCH_FN(max_pool3d_with_indices_backward)),
        own("multi_margin_loss_backward", TORCH_FN(multi_margin_loss_backward)),
        own("multilabel_margin_loss_backward", TORCH_FN(multilabel_margin_loss_backward)),
        own("_pdist_backward", TORCH_FN(pdist_backward)),
        own("flip", TORCH_FN(flip)),
        own("narrow_copy", TORCH_FN(narrow_copy)),
        own("geqrf", TORCH_FN(geqrf)),
        own("_grouped_mm", TORCH_FN(grouped_mm)),
        own("pixel_shuffle", TORCH_FN(pixel_shuffle)),
        own("pixel_unshuffle", TORCH_FN(pixel_unshuffle)),
        own_fused_optimizer_step("_fused_sgd_"),
        own_fused_optimizer_step("_fused_sgd_.tensor_lr"),
        own_fused_optimizer_step("_fused_adagrad_"),
        own_fused_optimizer_step("_fused_adagrad_.tensor_lr"),
        own_fused_optimizer_step("_fused_adam_"),
        own_fused_optimizer_step("_fused_adam_.tensor_lr"),
        own_fused_optimizer_step("_fused_adamw_"),
        own_fused_optimizer_step("_fused_adamw_.tensor_lr"),
    };
    for (auto& entry : layer_kernels()) all.insert(std::move(entry));
    for (auto& entry : cuda_attention_kernels()) all.insert(std::move(entry));
    for (auto& entry : ctc_loss_kernels()) all.insert(std::move(entry));
    for (auto& entry : cudnn_rnn_kernels()) all.insert(std::move(entry));
    for (auto& entry : onednn_rnn_kernels()) all.insert(std::move(entry));
    return all;
  }();
  return kernels;
}

}  // namespace

std::vector<std::pair<std::string, c10::KernelFunction>> traced_convolution_kernels() {
  return {{"_convolution", c10::KernelFunction::makeFromBoxedFunction<&convolution_with_flags>()}};
}

void register_missing_meta_kernels() {
  auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__,
                                 __LINE__);
  for (const auto& [name, own] : own_kernels()) {
    const std::size_t dot = name.find('.');
    const std::string op = "aten::" + name.substr(0, dot);
    const std::string overload = dot == std::string::npos ? "" : name.substr(dot + 1);
    const auto handle = c10::Dispatcher::singleton().findSchema({op, overload});
    if (handle && !handle->hasKernelForDispatchKey(c10::DispatchKey::Meta))
      own.register_on(*lib, name.c_str());
  }
}

const c10::KernelFunction* own_meta_kernel(const std::string& qualified_name) {
  if (qualified_name.rfind("aten::", 0) != 0) return nullptr;
  const auto it = own_kernels().find(qualified_name.substr(6));
  return it == own_kernels().end() ? nullptr : &it->second.kernel;
}

}  // namespace metamem
