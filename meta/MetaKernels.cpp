#include "meta/MetaKernels.h"

#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <string>
#include <unordered_map>

#include "meta/MetaMode.h"

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
  return at::empty(size, input.options().memory_format(input.suggest_memory_format()));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    at::OptionalIntArrayRef bias_sizes, at::IntArrayRef stride, at::IntArrayRef padding,
    at::IntArrayRef, bool transposed, at::IntArrayRef, std::int64_t groups,
    std::array<bool, 3> output_mask) {
  return {output_mask[0] ? at::empty_like(input) : at::Tensor(),
          output_mask[1] ? at::empty_like(weight) : at::Tensor(),
          output_mask[2] ? at::empty({weight.size(0)}, weight.options()) : at::Tensor()};
}

// Norm statistics: the input's dtype on CPU, the accumulate type on CUDA.
at::TensorOptions statistics_options(const at::Tensor& input) {
  return input.options().dtype(models_cpu() ? input.scalar_type()
                                            : at::toAccumulateType(input.scalar_type(), /*is_cuda=*/true));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm(
    const at::Tensor& input, const c10::optional<at::Tensor>&, const c10::optional<at::Tensor>&,
    const c10::optional<at::Tensor>&, const c10::optional<at::Tensor>&, bool training, double,
    double) {
  const std::int64_t stats = training ? input.size(1) : 0;
  return {at::empty_like(input), at::empty({stats}, statistics_options(input)),
          at::empty({stats}, statistics_options(input))};
}

// Mean and rstd keep the input's leading dimensions, with ones for the
// normalized ones.
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm(
    const at::Tensor& input, at::IntArrayRef normalized_shape, const c10::optional<at::Tensor>&,
    const c10::optional<at::Tensor>&, double) {
  auto stat_shape = input.sizes().vec();
  const std::size_t axis = stat_shape.size() - normalized_shape.size();
  std::fill(stat_shape.begin() + static_cast<std::ptrdiff_t>(axis), stat_shape.end(), 1);
  return {at::empty_like(input, at::MemoryFormat::Contiguous),
          at::empty(stat_shape, statistics_options(input)),
          at::empty(stat_shape, statistics_options(input))};
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
  return {output_mask[0] ? at::empty_like(input) : at::Tensor(),
          output_mask[1] && weight ? at::empty_like(*weight) : at::Tensor(),
          output_mask[2] && bias ? at::empty_like(*bias) : at::Tensor()};
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

// The native flip writes into empty_like(self, Preserve): dense strides in
// the input's order, also for an expanded input (Python's meta keeps its
// zero strides).
at::Tensor flip(const at::Tensor& self, at::IntArrayRef) {
  return at::empty_like(self, at::MemoryFormat::Preserve);
}

// The native narrow_copy narrows a copy of the whole input: its storage
// keeps the input's size.
at::Tensor narrow_copy(const at::Tensor& self, std::int64_t dim, c10::SymInt, c10::SymInt length) {
  auto size = self.sizes().vec();
  size[c10::maybe_wrap_dim(dim, self.dim())] = length.expect_int();
  return at::empty_like(self).resize_(size);
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

bool has_meta_kernel(const char* name, const char* overload) {
  auto op = c10::Dispatcher::singleton().findSchema({name, overload});
  return op && op->hasKernelForDispatchKey(c10::DispatchKey::Meta);
}

}  // namespace

// Newer libtorch versions have some of these: theirs win.
void register_missing_meta_kernels() {
  auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__,
                                 __LINE__);
  auto add = [&](const char* name, const char* overload, auto fn) {
    if (has_meta_kernel((std::string("aten::") + name).c_str(), overload)) return;
    const std::string qualified = *overload ? std::string(name) + "." + overload : name;
    lib->impl(qualified.c_str(), fn);
  };
  add("relu", "", TORCH_FN(relu));
  add("relu_", "", TORCH_FN(relu_));
  add("native_dropout", "", TORCH_FN(native_dropout));
  add("native_dropout_backward", "", TORCH_FN(native_dropout_backward));
  add("convolution", "", TORCH_FN(convolution));
  add("convolution_backward", "", TORCH_FN(convolution_backward));
  add("native_batch_norm", "", TORCH_FN(native_batch_norm));
  add("native_batch_norm_backward", "", TORCH_FN(native_batch_norm_backward));
  add("native_layer_norm", "", TORCH_FN(native_layer_norm));
  add("native_layer_norm_backward", "", TORCH_FN(native_layer_norm_backward));
  add("_adaptive_avg_pool2d", "", TORCH_FN(adaptive_avg_pool2d));
  add("_adaptive_avg_pool2d_backward", "", TORCH_FN(adaptive_avg_pool2d_backward));
  add("embedding", "", TORCH_FN(embedding));
  add("embedding_dense_backward", "", TORCH_FN(embedding_dense_backward));
  add("index_select", "", TORCH_FN(index_select));
  add("hardtanh_backward", "", TORCH_FN(hardtanh_backward));
  add("upsample_nearest3d", "vec", TORCH_FN(upsample_nearest3d));
  add("reflection_pad2d_backward", "", TORCH_FN(padding_backward));
  add("replication_pad2d_backward", "", TORCH_FN(padding_backward));
  add("_adaptive_avg_pool3d_backward", "", TORCH_FN(input_shaped_gradient));
  add("max_unpool2d", "", TORCH_FN(max_unpool2d));
  add("max_unpool3d", "", TORCH_FN(max_unpool3d));
  add("take", "", TORCH_FN(take));
  add("nll_loss2d_forward", "", TORCH_FN(nll_loss2d_forward));
  add("linalg_solve_triangular", "", TORCH_FN(linalg_solve_triangular));
}

bool call_native_layout_kernel(const c10::OperatorHandle& op, torch::jit::Stack& stack) {
  static const std::unordered_map<std::string, c10::KernelFunction> kernels = {
      {"aten::flip", c10::KernelFunction::makeFromUnboxedFunction(TORCH_FN(flip))},
      {"aten::narrow_copy", c10::KernelFunction::makeFromUnboxedFunction(TORCH_FN(narrow_copy))},
      {"aten::pixel_shuffle", c10::KernelFunction::makeFromUnboxedFunction(TORCH_FN(pixel_shuffle))},
      {"aten::pixel_unshuffle", c10::KernelFunction::makeFromUnboxedFunction(TORCH_FN(pixel_unshuffle))},
  };
  const auto it = kernels.find(op.schema().name());
  if (it == kernels.end() || !op.schema().overload_name().empty()) return false;
  it->second.callBoxed(op, c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
  return true;
}

}  // namespace metamem
