// Meta kernels for torch::nn layers whose ops libtorch's C++ Meta backend
// lacks (Python registers them from torch/_decomp when it is loaded; a C++
// program has none). Each lays out its outputs as the native kernel of the
// fake device does.
#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <ATen/Context.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/Reduction.h>

#include <vector>

#include "meta/CudaKernelPlans.h"
#include "meta/MetaMode.h"
#include "meta/OwnKernel.h"

namespace metamem {
namespace {

bool models_cpu() { return fake_device().is_cpu(); }

// What a TensorIterator allocates for an op over `operands`: their broadcast
// shape, common dtype and the layout of the densest operand.
at::Tensor iterator_output(std::initializer_list<at::Tensor> operands) {
  at::TensorIteratorConfig config;
  config.add_owned_output(at::Tensor());
  for (const auto& operand : operands) config.add_owned_input(operand);
  config.promote_inputs_to_common_dtype(true).cast_common_dtype_to_outputs(true);
  return config.build().output();
}

at::Tensor unary(const at::Tensor& self) { return iterator_output({self}); }

// abs of a complex tensor is of its real value type, laid out as
// empty_like lays it (libtorch's unary_op_impl_with_complex_to_float: a
// spectrogram's magnitude, torch.stft(...).abs()); of a real one, as
// TensorIterator lays its output.
at::Tensor abs(const at::Tensor& self) {
  if (self.is_complex()) return at::empty_like(self, self.options().dtype(c10::toRealValueType(self.scalar_type())));
  return unary(self);
}
at::Tensor& abs_(at::Tensor& self) {
  TORCH_CHECK(!self.is_complex(), "In-place abs is not supported for complex tensors.");
  return self;
}

// where(condition, self, other) promotes self and other only; its out=
// form (which _safe_softmax calls) lays out a resized out the same way.
at::Tensor& where_out(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other,
                      at::Tensor& out) {
  at::TensorIteratorConfig()
      .check_all_same_dtype(false)
      .add_output(out)
      .add_owned_input(condition)
      .add_owned_input(self)
      .add_owned_input(other)
      .build();
  return out;
}
at::Tensor where(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other) {
  at::Tensor result = at::empty({0}, self.options().dtype(at::result_type(self, other)));
  return where_out(condition, self, other, result);
}
at::Tensor& in_place(at::Tensor& self) { return self; }
at::Tensor binary(const at::Tensor& a, const at::Tensor& b) { return iterator_output({a, b}); }
at::Tensor contiguous_like(const at::Tensor& self) { return at::empty_like(self, at::MemoryFormat::Contiguous); }

// ---- activations -----------------------------------------------------------

at::Tensor hardtanh(const at::Tensor& self, const at::Scalar&, const at::Scalar&) {
  return at::empty_like(self);
}
at::Tensor& hardtanh_(at::Tensor& self, const at::Scalar&, const at::Scalar&) { return self; }

// CPU keeps a contiguous buffer beside the output for the backward; CUDA
// keeps none.
std::tuple<at::Tensor, at::Tensor> log_sigmoid_forward(const at::Tensor& self) {
  if (models_cpu()) return {contiguous_like(self), contiguous_like(self)};
  return {at::empty_like(self), at::empty({0}, self.options())};
}
at::Tensor log_sigmoid_backward(const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor&) {
  return models_cpu() ? at::empty_like(grad_output) : binary(self, grad_output);
}

at::Tensor prelu(const at::Tensor& self, const at::Tensor&) {
  return at::empty_like(self, self.suggest_memory_format());
}
// PReLU's kernel (weight broadcast to the input's rank): a TensorIterator
// whose outputs, the input gradient and the weight gradient before autograd
// sums it down to the weight's shape, both take the input's shape.
std::tuple<at::Tensor, at::Tensor> prelu_kernel_backward(const at::Tensor&, const at::Tensor& self,
                                                         const at::Tensor&) {
  return {at::empty_like(self, self.suggest_memory_format()), at::empty_like(self, self.suggest_memory_format())};
}
at::Tensor glu_backward(const at::Tensor&, const at::Tensor& self, std::int64_t) { return contiguous_like(self); }

// ---- losses ----------------------------------------------------------------

// The elementwise loss, or its 0-dim reduction.
at::Tensor pointwise_loss(const at::Tensor& self, const at::Tensor& target, std::int64_t reduction) {
  if (reduction == at::Reduction::None) return binary(self, target);
  return at::empty({}, self.options());
}
at::Tensor huber_loss(const at::Tensor& self, const at::Tensor& target, std::int64_t reduction, double) {
  return pointwise_loss(self, target, reduction);
}

// Loss gradients are written into a contiguous input-shaped tensor.
at::Tensor mse_loss_backward(const at::Tensor&, const at::Tensor& self, const at::Tensor&, std::int64_t) {
  return contiguous_like(self);
}
at::Tensor binary_cross_entropy_backward(const at::Tensor&, const at::Tensor& self, const at::Tensor&,
                                         const c10::optional<at::Tensor>&, std::int64_t) {
  return contiguous_like(self);
}
at::Tensor nll_loss2d_backward(const at::Tensor&, const at::Tensor& self, const at::Tensor&,
                               const c10::optional<at::Tensor>&, std::int64_t, std::int64_t,
                               const at::Tensor&) {
  return contiguous_like(self);
}


// ---- padding and pooling ---------------------------------------------------

at::Tensor reflection_pad2d(const at::Tensor& self, at::IntArrayRef padding) {
  auto size = self.sizes().vec();
  const std::size_t h = size.size() - 2;
  size[h] += padding[2] + padding[3];
  size[h + 1] += padding[0] + padding[1];
  return at::empty(size, self.options().memory_format(self.suggest_memory_format()));
}

at::Tensor adaptive_avg_pool3d(const at::Tensor& self, at::IntArrayRef output_size) {
  auto size = self.sizes().vec();
  std::copy(output_size.begin(), output_size.end(), size.end() - 3);
  return at::empty(size, self.options());
}

// ---- normalization ---------------------------------------------------------

// The output in the input's layout on CPU, contiguous on CUDA; per
// (sample, group) statistics in the parameters' dtype where they are fp32
// beside a low-precision input.
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_group_norm(const at::Tensor& input,
                                                                 const c10::optional<at::Tensor>& weight,
                                                                 const c10::optional<at::Tensor>&, c10::SymInt batch,
                                                                 c10::SymInt, c10::SymInt, std::int64_t group, double) {
  const auto dtype = weight && weight->defined() ? weight->scalar_type() : input.scalar_type();
  const auto statistics = input.options().dtype(dtype);
  const auto format = models_cpu() ? input.suggest_memory_format() : at::MemoryFormat::Contiguous;
  return {at::empty_like(input, format), at::empty({batch.expect_int(), group}, statistics),
          at::empty({batch.expect_int(), group}, statistics)};
}

// SyncBatchNorm's ops (torch.nn.modules._functions.SyncBatchNorm), laid
// out as CUDA's kernels lay them out (Normalization.cu). A rank's
// statistics in the accumulation type; the statistics gathered from every
// rank's ([ranks, C]) reduced into their dtype (float for 16-bit ones).
std::tuple<at::Tensor, at::Tensor> batch_norm_stats(const at::Tensor& input, double) {
  const auto options = input.options().dtype(at::toAccumulateType(input.scalar_type(), /*is_cuda=*/true));
  return {at::empty({input.size(1)}, options), at::empty({input.size(1)}, options)};
}

std::tuple<at::Tensor, at::Tensor> batch_norm_gather_stats_with_counts(
    const at::Tensor&, const at::Tensor& mean, const at::Tensor&, const c10::optional<at::Tensor>&,
    const c10::optional<at::Tensor>&, double, double, const at::Tensor&) {
  const bool sixteen_bit = mean.scalar_type() == at::kHalf || mean.scalar_type() == at::kBFloat16;
  const auto options = mean.options().dtype(sixteen_bit ? at::kFloat : mean.scalar_type());
  return {at::empty({mean.size(1)}, options), at::empty({mean.size(1)}, options)};
}

at::Tensor batch_norm_elemt(const at::Tensor& input, const c10::optional<at::Tensor>&,
                            const c10::optional<at::Tensor>&, const at::Tensor&, const at::Tensor&, double) {
  return at::empty_like(input, input.suggest_memory_format());
}

// The channels-last kernel makes all four (the parameters' gradients empty
// without a weight); the other makes those asked for.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_backward_reduce(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const c10::optional<at::Tensor>& weight, bool input_g, bool weight_g, bool bias_g) {
  const std::int64_t channels = input.size(1);
  const bool has_weight = weight && weight->defined();
  if (batch_norm_backward_reduce_is_channels_last(grad_out, input, mean, invstd, weight)) {
    const auto parameters = has_weight ? weight->options() : mean.options();
    const std::int64_t gradients = has_weight ? channels : 0;
    return {at::empty({channels}, mean.options()), at::empty({channels}, mean.options()),
            at::empty({gradients}, parameters), at::empty({gradients}, parameters)};
  }
  auto statistic = [&](bool made) { return made ? at::empty_like(mean, at::MemoryFormat::Contiguous) : at::Tensor(); };
  auto parameter = [&](bool made) { return made ? at::empty({channels}, weight->options()) : at::Tensor(); };
  return {statistic(input_g), statistic(input_g), parameter(weight_g), parameter(bias_g)};
}

at::Tensor batch_norm_backward_elemt(const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor&,
                                     const at::Tensor&, const c10::optional<at::Tensor>&, const at::Tensor&,
                                     const at::Tensor&, const at::Tensor&) {
  return at::empty_like(input, batch_norm_uses_channels_last_kernels(grad_out) ? input.suggest_memory_format()
                                                                               : at::MemoryFormat::Contiguous);
}

// ---- embedding bags --------------------------------------------------------

// Outputs (bags x dim), offset2bag, bag_size, max_indices. CPU's sum over
// float rows with unit strides skips offset2bag; otherwise CPU builds it one
// longer (a cumulative sum over offsets marked in it) and shrinks it, so its
// storage keeps the extra element. bag_size has an element per offset
// (include_last_offset's last too). CPU's max_indices is per bag unless the
// mode is max. CUDA always fills offset2bag and keeps max_indices only for
// max.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> embedding_bag(
    const at::Tensor& weight, const at::Tensor& indices, const at::Tensor& offsets, bool, std::int64_t mode,
    bool, const c10::optional<at::Tensor>& per_sample_weights, bool include_last_offset,
    std::int64_t padding_idx) {
  constexpr std::int64_t kSum = 0, kMax = 2;
  const std::int64_t bags = offsets.size(0) - (include_last_offset ? 1 : 0);
  const std::int64_t dim = weight.size(1);
  at::Tensor output = at::empty({bags, dim}, weight.options());
  if (!models_cpu()) {
    return {output, at::empty({indices.size(0)}, indices.options()), at::empty({offsets.size(0)}, indices.options()),
            at::empty(mode == kMax ? std::vector<std::int64_t>{bags, dim} : std::vector<std::int64_t>{0},
                      indices.options())};
  }
  const bool scaled = per_sample_weights && per_sample_weights->defined();
  const bool fast_sum = (weight.scalar_type() == at::kFloat || weight.scalar_type() == at::kHalf) &&
                        weight.stride(1) == 1 && padding_idx < 0 && (!scaled || per_sample_weights->stride(0) == 1);
  const at::Tensor offset2bag =
      mode == kSum && fast_sum ? at::empty({0}, offsets.options())
                               : at::empty({indices.size(0) + 1}, offsets.options()).resize_({indices.size(0)});
  return {output, offset2bag, at::empty({offsets.size(0)}, offsets.options()),
          at::empty(mode == kMax ? std::vector<std::int64_t>{bags, dim} : std::vector<std::int64_t>{bags},
                    offsets.options())};
}

at::Tensor embedding_bag_dense_backward(const at::Tensor& grad, const at::Tensor&, const at::Tensor&,
                                        const at::Tensor&, const at::Tensor&, std::int64_t num_weights, bool,
                                        std::int64_t, const c10::optional<at::Tensor>&, std::int64_t) {
  return at::empty({num_weights, grad.size(1)}, grad.options());
}

at::Tensor embedding_bag_per_sample_weights_backward(const at::Tensor& grad, const at::Tensor&,
                                                     const at::Tensor& indices, const at::Tensor&,
                                                     const at::Tensor&, std::int64_t, std::int64_t) {
  return at::empty({indices.size(0)}, grad.options());
}

// ---- recurrent cells (CUDA's fused kernels) ---------------------------------

// hy, cy and the workspace the backward reads (the four gates).
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(const at::Tensor& input_gates, const at::Tensor&,
                                                               const at::Tensor& cx,
                                                               const c10::optional<at::Tensor>&,
                                                               const c10::optional<at::Tensor>&) {
  return {contiguous_like(cx), contiguous_like(cx), contiguous_like(input_gates)};
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_backward(
    const c10::optional<at::Tensor>&, const c10::optional<at::Tensor>&, const at::Tensor& cx, const at::Tensor&,
    const at::Tensor& workspace, bool has_bias) {
  return {contiguous_like(workspace), contiguous_like(cx),
          has_bias ? at::empty({workspace.size(1)}, workspace.options()) : at::Tensor()};
}

// hy and a workspace of five gate-sized slices (r, z, n, the hidden n, hx).
std::tuple<at::Tensor, at::Tensor> fused_gru_cell(const at::Tensor& input_gates, const at::Tensor&,
                                                  const at::Tensor& hx, const c10::optional<at::Tensor>&,
                                                  const c10::optional<at::Tensor>&) {
  return {contiguous_like(hx), at::empty({hx.size(0), hx.size(1) * 5}, input_gates.options())};
}
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  const std::int64_t batch = grad_hy.size(0), hidden = grad_hy.size(1);
  auto gates = [&] { return at::empty({batch, 3 * hidden}, workspace.options()); };
  at::Tensor grad_input_gates = gates(), grad_hidden_gates = gates();
  auto bias = [&] { return has_bias ? at::empty({3 * hidden}, workspace.options()) : at::Tensor(); };
  return {grad_input_gates, grad_hidden_gates, at::empty({batch, hidden}, workspace.options()), bias(), bias()};
}

// ---- shifted windows (Swin) ------------------------------------------------

// libtorch's roll_common: flatten for no dims; one dim at a time for several
// (each roll's result is the next one's input). One dim: CPU concatenates
// the two narrowed halves; CUDA copies into a contiguous tensor, after making
// a non-contiguous input contiguous.
at::Tensor roll(const at::Tensor& self, at::IntArrayRef shifts, at::IntArrayRef dims) {
  TORCH_CHECK(!shifts.empty(), "`shifts` required");
  if (dims.empty() && shifts.size() == 1)
    return at::roll(self.contiguous().view(self.numel()), shifts, {0}).view(self.sizes());
  TORCH_CHECK(shifts.size() == dims.size(), "shifts and dimensions must align. shifts: ", shifts.size(),
              ", dims:", dims.size());
  if (dims.size() > 1) return at::roll(at::roll(self, shifts[0], dims[0]), shifts.slice(1), dims.slice(1));
  if (!models_cpu()) return contiguous_like(self.contiguous());
  if (self.numel() == 0) return self.clone(at::MemoryFormat::Preserve);
  const std::int64_t dim = dims[0], size = self.size(dim);
  const std::int64_t start = ((size - shifts[0]) % size + size) % size;
  return at::cat({self.narrow(dim, start, size - start), self.narrow(dim, 0, start)}, dim);
}

// ---- comparisons -----------------------------------------------------------

// torch::nn::MultiheadAttention asks whether query, key and value are equal
// to pick its self-attention path: a tensor is equal to itself, and tensors
// of different shapes never are; anything else needs the data.
bool equal(const at::Tensor& self, const at::Tensor& other) {
  if (self.sizes() != other.sizes()) return false;
  TORCH_CHECK_NOT_IMPLEMENTED(self.is_same(other),
                              "equal on two different tensors reads their values, which a trace does not have.");
  return true;
}

// isnan is self != self on both devices: a comparison's bool output. A
// training loop asks it of its loss (with values="placeholder").
at::Tensor isnan(const at::Tensor& self) {
  at::TensorBase out;
  return at::TensorIterator::comparison_op(out, self, self).output();
}

}  // namespace

std::vector<OwnKernelEntry> layer_kernels() {
  return {
      own("abs", TORCH_FN(abs)),
      own("where.self", TORCH_FN(where)),
      own("where.self_out", TORCH_FN(where_out)),
      own("abs_", TORCH_FN(abs_)),
      own("hardtanh", TORCH_FN(hardtanh)),
      own("hardtanh_", TORCH_FN(hardtanh_)),
      own("hardswish", TORCH_FN(unary)),
      own("hardswish_", TORCH_FN(in_place)),
      own("hardswish_backward", TORCH_FN(binary)),
      own("log_sigmoid_forward", TORCH_FN(log_sigmoid_forward)),
      own("log_sigmoid_backward", TORCH_FN(log_sigmoid_backward)),
      own("prelu", TORCH_FN(prelu)),
      own("_prelu_kernel", TORCH_FN(prelu)),
      own("_prelu_kernel_backward", TORCH_FN(prelu_kernel_backward)),
      own("glu_backward", TORCH_FN(glu_backward)),
      own("huber_loss", TORCH_FN(huber_loss)),
      own("mse_loss_backward", TORCH_FN(mse_loss_backward)),
      own("binary_cross_entropy_backward", TORCH_FN(binary_cross_entropy_backward)),
      own("nll_loss2d_backward", TORCH_FN(nll_loss2d_backward)),
      own("reflection_pad2d", TORCH_FN(reflection_pad2d)),
      own("roll", TORCH_FN(roll)),
      own("_adaptive_avg_pool3d", TORCH_FN(adaptive_avg_pool3d)),
      own("native_group_norm", TORCH_FN(native_group_norm)),
      own("batch_norm_stats", TORCH_FN(batch_norm_stats)),
      own("batch_norm_gather_stats_with_counts", TORCH_FN(batch_norm_gather_stats_with_counts)),
      own("batch_norm_elemt", TORCH_FN(batch_norm_elemt)),
      own("batch_norm_backward_reduce", TORCH_FN(batch_norm_backward_reduce)),
      own("batch_norm_backward_elemt", TORCH_FN(batch_norm_backward_elemt)),
      own("_embedding_bag", TORCH_FN(embedding_bag)),
      own("_embedding_bag_forward_only", TORCH_FN(embedding_bag)),
      own("_embedding_bag_dense_backward", TORCH_FN(embedding_bag_dense_backward)),
      own("_embedding_bag_per_sample_weights_backward", TORCH_FN(embedding_bag_per_sample_weights_backward)),
      own("_thnn_fused_lstm_cell", TORCH_FN(fused_lstm_cell)),
      own("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(fused_lstm_cell_backward)),
      own("_thnn_fused_gru_cell", TORCH_FN(fused_gru_cell)),
      own("_thnn_fused_gru_cell_backward", TORCH_FN(fused_gru_cell_backward)),
      own("equal", TORCH_FN(equal)),
      own("isnan", TORCH_FN(isnan)),
  };
}

}  // namespace metamem
