#include "meta/MetaKernels.h"

#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <ATen/Parallel.h>
#include <ATen/ScalarOps.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

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

// libtorch's native CPU convolution (oneDNN off) unfolds the input into
// columns of batch x (C_in/groups * kernel) x output pixels, except for 1x1
// kernels with unit stride and no padding, where the input is used as is.
std::int64_t cpu_conv_columns_bytes(const at::Tensor& input, const at::Tensor& weight,
                                    at::IntArrayRef output_size, at::IntArrayRef stride,
                                    at::IntArrayRef padding) {
  bool pointwise = true;
  std::int64_t kernel = 1, pixels = 1;
  for (std::int64_t i = 2; i < weight.dim(); ++i) {
    kernel *= weight.size(i);
    pixels *= output_size[i];
    pointwise = pointwise && weight.size(i) == 1;
  }
  for (auto s : stride) pointwise = pointwise && s == 1;
  for (auto p : padding) pointwise = pointwise && p == 0;
  if (pointwise) return 0;
  return input.size(0) * weight.size(1) * kernel * pixels *
         static_cast<std::int64_t>(input.element_size());
}

bool models_cpu() { return fake_device().is_cpu(); }

std::int64_t bytes_of(const at::Tensor& t) {
  return t.numel() * static_cast<std::int64_t>(t.element_size());
}

// A group's slice of a batched NCHW tensor along channels is contiguous only
// for a batch of one; otherwise the native path copies it.
std::int64_t group_copy_bytes(const at::Tensor& t, std::int64_t groups) {
  return t.size(0) > 1 ? bytes_of(t) / groups : 0;
}

// Native CPU convolution with groups > 1 runs group by group: each group's
// input is made contiguous and unfolded, and the per-group outputs live until
// the function returns (after their concatenation into the result).
std::int64_t cpu_grouped_forward_scratch(const at::Tensor& input, const at::Tensor& weight,
                                         at::IntArrayRef output_size, at::IntArrayRef stride,
                                         at::IntArrayRef padding, std::int64_t groups) {
  std::int64_t output = input.element_size();
  for (auto d : output_size) output *= d;
  return std::max(output, group_copy_bytes(input, groups) +
                              cpu_conv_columns_bytes(input, weight, output_size, stride, padding));
}

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
  if (models_cpu() && !transposed)
    note_scratch(groups > 1
                     ? cpu_grouped_forward_scratch(input, weight, size, stride, padding, groups)
                     : cpu_conv_columns_bytes(input, weight, size, stride, padding));
  return at::empty(size, input.options().memory_format(input.suggest_memory_format()));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    at::OptionalIntArrayRef bias_sizes, at::IntArrayRef stride, at::IntArrayRef padding,
    at::IntArrayRef, bool transposed, at::IntArrayRef, std::int64_t groups,
    std::array<bool, 3> output_mask) {
  if (models_cpu() && !transposed) {
    const std::int64_t columns =
        cpu_conv_columns_bytes(input, weight, grad_output.sizes(), stride, padding);
    // Grouped: one group's copies and columns, or all per-group gradients
    // beside their concatenations, whichever is more.
    note_scratch(groups > 1 ? std::max(columns + group_copy_bytes(input, groups) +
                                           group_copy_bytes(grad_output, groups),
                                       (output_mask[0] ? bytes_of(input) : 0) +
                                           (output_mask[1] ? bytes_of(weight) : 0))
                            : columns);
  }
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
  // The CPU kernel gathers each channel's mean and sum of squares first.
  if (models_cpu() && training) note_scratch(2 * stats * static_cast<std::int64_t>(input.element_size()));
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
  // The CPU kernel computes the input gradient through a temporary of its size.
  if (models_cpu() && output_mask[0]) note_scratch(bytes_of(input));
  auto channel = [&] { return at::empty({input.size(1)}, weight->options()); };
  return {output_mask[0] ? at::empty_like(input) : at::Tensor(),
          output_mask[1] ? channel() : at::Tensor(), output_mask[2] ? channel() : at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, at::IntArrayRef normalized_shape,
    const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>& weight,
    const c10::optional<at::Tensor>& bias, std::array<bool, 3> output_mask) {
  // The CPU kernel sums weight and bias gradients in a zeroed buffer of
  // threads x 2 x (normalized elements).
  if (models_cpu() && (output_mask[1] || output_mask[2])) {
    std::int64_t normalized = 1;
    for (auto d : normalized_shape) normalized *= d;
    note_scratch(at::get_num_threads() * 2 * normalized *
                 static_cast<std::int64_t>(input.element_size()));
  }
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

// On CPU, arithmetic with a Scalar wraps it in a 0-dim tensor (double for a
// floating scalar, long for an integral one) and, when the tensor's dtype
// differs, casts it: both live while the op runs. On CUDA they stay on the host.
at::Tensor wrap_scalar(const at::Tensor& self, const at::Scalar& other) {
  at::Tensor wrapped = at::native::wrapped_scalar_tensor(other);
  if (models_cpu())
    note_scratch(bytes_of(wrapped) + (wrapped.scalar_type() == self.scalar_type() ? 0 : self.element_size()));
  return wrapped;
}

at::Tensor add_scalar(const at::Tensor& self, const at::Scalar& other, const at::Scalar& alpha) {
  return at::add(self, wrap_scalar(self, other), alpha);
}
at::Tensor& add_scalar_(at::Tensor& self, const at::Scalar& other, const at::Scalar& alpha) {
  return self.add_(wrap_scalar(self, other), alpha);
}
at::Tensor sub_scalar(const at::Tensor& self, const at::Scalar& other, const at::Scalar& alpha) {
  return at::sub(self, wrap_scalar(self, other), alpha);
}
at::Tensor& sub_scalar_(at::Tensor& self, const at::Scalar& other, const at::Scalar& alpha) {
  return self.sub_(wrap_scalar(self, other), alpha);
}
at::Tensor mul_scalar(const at::Tensor& self, const at::Scalar& other) {
  return at::mul(self, wrap_scalar(self, other));
}
at::Tensor& mul_scalar_(at::Tensor& self, const at::Scalar& other) {
  return self.mul_(wrap_scalar(self, other));
}
at::Tensor div_scalar(const at::Tensor& self, const at::Scalar& other) {
  return at::div(self, wrap_scalar(self, other));
}
at::Tensor& div_scalar_(at::Tensor& self, const at::Scalar& other) {
  return self.div_(wrap_scalar(self, other));
}

at::Tensor hardtanh_backward(const at::Tensor& grad_output, const at::Tensor&, const at::Scalar&,
                             const at::Scalar&) {
  return at::empty_like(grad_output);
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
  add("add", "Scalar", TORCH_FN(add_scalar));
  add("add_", "Scalar", TORCH_FN(add_scalar_));
  add("sub", "Scalar", TORCH_FN(sub_scalar));
  add("sub_", "Scalar", TORCH_FN(sub_scalar_));
  add("mul", "Scalar", TORCH_FN(mul_scalar));
  add("mul_", "Scalar", TORCH_FN(mul_scalar_));
  add("div", "Scalar", TORCH_FN(div_scalar));
  add("div_", "Scalar", TORCH_FN(div_scalar_));
}

}  // namespace metamem
