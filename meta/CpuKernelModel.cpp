// The CPU kernel model (CpuKernelModel.h) of tensor ops: TensorIterator's
// casts for elementwise ops and reductions, indexing, sorting, sampling,
// distances and statistics; and the table that names every family's model
// (the layers' in CpuLayerModel.cpp, linear algebra's in CpuLinalgModel.cpp).
#include "meta/CpuKernelModel.h"

#include <ATen/Context.h>
#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>
#include <ATen/TensorUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/TypeProperties.h>
#include <c10/core/WrapDimMinimal.h>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "meta/TensorBytes.h"

namespace metamem {
namespace {

using Args = c10::ArrayRef<c10::IValue>;

// TensorIterator, building an elementwise op on CPU, copies each operand
// whose dtype differs from the operands' common dtype into that dtype, and
// computes into a temporary when a given output (in place, out=) has another
// dtype. A Scalar operand is first wrapped in a 0-dim tensor (double, long,
// bool or complex double). Meta kernels skip all of it: the copies are CPU's.
enum class Promotion : std::uint8_t { Common, ToFloat, Comparison };

struct IteratorOperands {
  std::size_t first = 0, count = 2;  // the operands among the arguments
  Promotion promotion = Promotion::Common;
};

c10::ScalarType wrapped_type(const c10::Scalar& scalar) {
  return scalar.isFloatingPoint() ? c10::kDouble
         : scalar.isIntegral(false) ? c10::kLong
         : scalar.isBoolean()       ? c10::kBool
                                    : c10::kComplexDouble;
}

std::int64_t iterator_casts(Args args, Args returns, IteratorOperands operands) {
  const std::size_t end = std::min(args.size(), operands.first + operands.count);
  at::native::ResultTypeState state;
  for (std::size_t i = operands.first; i < end; ++i) {
    if (args[i].isTensor() && args[i].toTensor().defined())
      state = at::native::update_result_type_state(args[i].toTensor(), state);
    else if (args[i].isScalar())
      state = at::native::update_result_type_state(args[i].toScalar(), state);
  }
  c10::ScalarType common = at::native::result_type(state);
  if (operands.promotion == Promotion::ToFloat && c10::isIntegralType(common, /*includeBool=*/true))
    common = c10::typeMetaToScalarType(c10::get_default_dtype());
  const auto common_size = static_cast<std::int64_t>(c10::elementSize(common));
  std::int64_t bytes = 0;
  for (std::size_t i = operands.first; i < end; ++i) {
    if (args[i].isScalar()) {
      const c10::ScalarType wrapped = wrapped_type(args[i].toScalar());
      bytes += static_cast<std::int64_t>(c10::elementSize(wrapped)) + (wrapped == common ? 0 : common_size);
    } else if (args[i].isTensor()) {
      const at::Tensor& t = args[i].toTensor();
      if (t.defined() && t.scalar_type() != common) bytes += t.numel() * common_size;
    }
  }
  // A given output is its own argument: self in place, or out.
  const at::Tensor& out = returns[0].toTensor();
  const bool given = (args[0].isTensor() && out.is_same(args[0].toTensor())) ||
                     (args.back().isTensor() && out.is_same(args.back().toTensor()));
  const bool cast_out = operands.promotion != Promotion::Comparison || out.scalar_type() != c10::kBool;
  if (given && cast_out && out.scalar_type() != common) bytes += out.numel() * common_size;
  return bytes;
}

template <std::size_t kFirst, std::size_t kCount, Promotion kPromotion>
std::int64_t elementwise(Args args, Args returns) {
  return iterator_casts(args, returns, {kFirst, kCount, kPromotion});
}

// Division rounds (trunc, floor) in the operands' common dtype and divides
// truly in a floating one.
std::int64_t div(Args args, Args returns) {
  const bool rounds = args.size() > 2 && args[2].isString();
  return iterator_casts(args, returns, {0, 2, rounds ? Promotion::Common : Promotion::ToFloat});
}

// Sums, products, all and any reduce in their result's dtype: an input of
// another dtype is copied into it first.
std::int64_t reduction_cast(Args args, Args returns) {
  const at::Tensor &self = args[0].toTensor(), &result = returns[0].toTensor();
  return self.scalar_type() == result.scalar_type()
             ? 0
             : self.numel() * static_cast<std::int64_t>(c10::elementSize(result.scalar_type()));
}

// The CPU mean is a sum into the result, then div_ by the count (a wrapped long).
std::int64_t mean(Args args, Args returns) {
  const at::Tensor& result = returns[0].toTensor();
  return reduction_cast(args, returns) + static_cast<std::int64_t>(c10::elementSize(c10::kLong)) +
         (result.scalar_type() == c10::kLong ? 0 : element_size(result));
}

// A copy of a transposed matrix (src.t() contiguous, 3,600 elements or
// more) into a contiguous one of its type goes through a square block
// buffer (copy_same_type_transpose_: 60 x 60, 120 x 120 for bytes).
std::int64_t transposed_copy_buffer(const at::Tensor& src) {
  constexpr std::int64_t kMinElements = 60 * 60;
  const bool transposed = src.defined() && src.dim() == 2 && src.numel() >= kMinElements && src.stride(0) == 1 &&
                          src.stride(1) == src.size(0);
  if (!transposed || c10::isBitsType(src.scalar_type())) return 0;
  const std::int64_t block = src.scalar_type() == c10::kByte ? 120 : 60;
  return block * block * element_size(src);
}

std::int64_t transposed_copy_buffer(const at::Tensor& dst, const at::Tensor& src) {
  const bool as_its_type = dst.is_contiguous() && dst.scalar_type() == src.scalar_type() &&
                           dst.sizes().equals(src.sizes()) && dst.is_neg() == src.is_neg() &&
                           dst.is_conj() == src.is_conj();
  return as_its_type ? transposed_copy_buffer(src) : 0;
}

// aten::copy_(self, src).
std::int64_t copy_into(Args args, Args) { return transposed_copy_buffer(args[0].toTensor(), args[1].toTensor()); }

// aten::clone and aten::_to_copy: the result made, then copied into.
std::int64_t copy_of(Args args, Args returns) {
  return transposed_copy_buffer(returns[0].toTensor(), args[0].toTensor());
}

// A whole tensor's max and min read it contiguous (self.contiguous()), its
// argmax and argmin without a dim flat (self.reshape(-1)): a copy where
// it is not, through the transposed copy's buffer where it applies.
template <bool flattened>
std::int64_t whole_tensor_copy(Args args, Args) {
  const std::int64_t copy = whole_tensor_read_copy(args, flattened);
  return copy == 0 ? 0 : copy + transposed_copy_buffer(args[0].toTensor());
}

// Kernels that read their first argument contiguous: upsampling's
// gradients, narrow_copy's input.
std::int64_t contiguous_first(Args args, Args) { return copy_unless_contiguous(args[0].toTensor()); }

// tril and triu copy an input whose matrices are not laid out one after
// another (a 2-d input always is, in their sense).
std::int64_t triangle(Args args, Args returns) {
  const at::Tensor& self = args[0].toTensor();
  if (self.is_contiguous() || self.dim() < 3) return 0;
  const bool in_place = returns[0].toTensor().is_same(self);
  if (in_place) return 0;
  std::int64_t expected = self.size(-1) * self.size(-2);
  for (std::int64_t i = self.dim() - 3; i >= 0; --i) {
    if (self.stride(i) != expected) return bytes_of(self);
    expected *= self.size(i);
  }
  return 0;
}

// index_select reads a contiguous index; selecting along dim 1 into a
// contiguous result takes a contiguous copy of the input too.
std::int64_t index_select(Args args, Args returns) {
  const at::Tensor &self = args[0].toTensor(), &index = args[2].toTensor(), &result = returns[0].toTensor();
  const std::int64_t dim = c10::maybe_wrap_dim(args[1].toInt(), std::max<std::int64_t>(self.dim(), 1));
  const bool dim1 = self.dim() > 1 && index.numel() > 0 && self.numel() > 0 && dim == 1 && result.is_contiguous();
  return copy_unless_contiguous(index) + (dim1 ? copy_unless_contiguous(self) : 0);
}

// The scatter/gather kernel reads an int64 index (a copy of any other) and,
// for a half-precision result, accumulates in a float copy of it. The
// result is gather's output, or the tensor scattered into.
std::int64_t scatter_gather(Args args, Args returns) {
  const at::Tensor &index = args[2].toTensor(), &result = returns[0].toTensor();
  const std::int64_t long_index = index.scalar_type() == at::kLong ? 0 : index.numel() * 8;
  const bool reduced = at::isReducedFloatingType(result.scalar_type());
  return long_index + (reduced ? result.numel() * 4 : 0);
}

// scatter_reduce runs the same kernel; with "mean" it then counts what
// each element of the result took: ones like src and the counts like the
// result, scattered by scatter_add_ (a float copy of 16-bit counts), then
// count == 0 (a wrapped int64 0, cast to a count that is not int64, and
// the bool mask).
std::int64_t scatter_reduce(Args args, Args returns) {
  const std::int64_t kernel = scatter_gather(args, returns);
  if (args[4].toStringRef() != "mean") return kernel;
  const at::Tensor &src = args[3].toTensor(), &result = returns[0].toTensor();
  const std::int64_t counted = at::isReducedFloatingType(result.scalar_type()) ? result.numel() * 4 : 0;
  const std::int64_t cast = result.scalar_type() == at::kLong ? 0 : element_size(result);
  const std::int64_t ones_and_counts = src.numel() * element_size(src) + result.numel() * element_size(result);
  return std::max(kernel, ones_and_counts + std::max(counted, 8 + cast + result.numel()));
}

// _chunk_cat on CPU zero-pads each tensor whose length along dim is not a
// multiple of num_chunks and concatenates the padded copies (CUDA has a
// kernel of its own that pads as it writes).
std::int64_t chunk_cat(Args args, Args) {
  const auto tensors = args[0].toTensorVector();
  if (tensors.empty()) return 0;
  const std::int64_t dim = c10::maybe_wrap_dim(args[1].toInt(), tensors[0].dim());
  const std::int64_t chunks = args[2].toInt();
  std::int64_t bytes = 0;
  for (const at::Tensor& t : tensors) {
    const std::int64_t length = t.size(dim), padded = (length + chunks - 1) / chunks * chunks;
    if (padded != length) bytes += t.numel() / std::max<std::int64_t>(length, 1) * padded * element_size(t);
  }
  return bytes;
}

// repeat (2.14) orders the dimensions of its unfolded result through int64
// CPU tensors: arange(n) and arange(n) + n (a wrapped Scalar) over the n
// repeats, then their interleaving cat, all live at once. A zero repeat
// returns the empty result first.
std::int64_t repeat(Args args, Args) {
  const auto repeats = args[1].toIntVector();
  if (std::find(repeats.begin(), repeats.end(), 0) != repeats.end()) return 0;
  const auto n = static_cast<std::int64_t>(repeats.size());
  return std::max(8 * n + 8 + 8 * n, 8 * n + 8 * n + 16 * n);
}

// unfold's backward copies straight into non-overlapping windows; with
// overlapping ones (step < size) its kernel walks the input positions the
// windows cover through an int64 arange of them.
std::int64_t unfold_backward(Args args, Args) {
  const auto input_sizes = args[1].toIntVector();
  const std::int64_t size = args[3].toInt(), step = args[4].toInt();
  if (step >= size) return 0;
  const std::int64_t length =
      input_sizes[c10::maybe_wrap_dim(args[2].toInt(), static_cast<std::int64_t>(input_sizes.size()))];
  const std::int64_t windows = (length - size) / step + 1;
  return 8 * ((windows - 1) * step + size);
}

// vector_norm first casts its input to a requested dtype. A 0-norm over
// dims of length one is (x != 0) written into the result: a wrapped Scalar
// and its cast to the result's dtype.
std::int64_t linalg_vector_norm(Args args, Args returns) {
  const at::Tensor &self = args[0].toTensor(), &result = returns[0].toTensor();
  const bool cast = !args[4].isNone() && args[4].toScalarType() != self.scalar_type();
  std::vector<std::int64_t> dims = args[2].isNone() ? std::vector<std::int64_t>{} : args[2].toIntVector();
  // A 0-dim input takes this path only over all (no) dims.
  const bool trivial = self.dim() == 0 ? dims.empty() : std::all_of(dims.begin(), dims.end(), [&](std::int64_t d) {
    return self.size(c10::maybe_wrap_dim(d, self.dim())) == 1;
  }) && (!dims.empty() || self.numel() == 1);
  const bool elementwise_zero_norm = trivial && args[1].toScalar().toDouble() == 0.0;
  return (cast ? self.numel() * static_cast<std::int64_t>(c10::elementSize(args[4].toScalarType())) : 0) +
         (elementwise_zero_norm ? 8 + element_size(result) : 0);
}

// Out of training, rrelu's slope is (lower + upper) / 2 computed in 0-dim
// tensors: both (floating) bounds wrapped as doubles, their sum, a wrapped
// 2 (int64) cast to double and the quotient, six of 8 bytes live at once.
std::int64_t rrelu_with_noise(Args args, Args) { return args[4].toBool() ? 0 : 6 * 8; }

// segment_reduce checks lengths it may not trust before its result exists:
// their min, then all(lengths.sum(-1) == data.size(axis)) through a
// wrapped Scalar and a bool per segment list. Both directions read their
// tensors contiguous.
std::int64_t segment_reduce(Args args, Args returns) {
  const at::Tensor& data = args[0].toTensor();
  const bool lengths = args[2].isTensor() && args[2].toTensor().defined();
  const bool unsafe = args[6].toBool();
  std::int64_t checks = 0;
  if (lengths && !unsafe) {
    const at::Tensor& l = args[2].toTensor();
    const std::int64_t lists = l.dim() > 0 && l.size(-1) > 0 ? l.numel() / l.size(-1) : 1;
    checks = std::max<std::int64_t>(8, 8 * lists + 8 + lists) - bytes_of(returns[0].toTensor());
  }
  return std::max(checks, copy_unless_contiguous(data));
}

std::int64_t segment_reduce_backward(Args args, Args) {
  std::int64_t bytes = 0;
  for (std::size_t i : {0, 1, 2, 4, 5})
    if (args[i].isTensor() && args[i].toTensor().defined()) bytes += copy_unless_contiguous(args[i].toTensor());
  return bytes;
}

// roll over no dims rolls the flattened input; over several dims it rolls
// one at a time, keeping every intermediate.
std::int64_t roll(Args args, Args returns) {
  const at::Tensor& self = args[0].toTensor();
  const std::int64_t dims = static_cast<std::int64_t>(args[2].toIntVector().size());
  if (dims == 0) return copy_unless_contiguous(self);
  return std::max<std::int64_t>(dims - 1, 0) * bytes_of(returns[0].toTensor());
}

// Sorting fills the indices from an arange along the sorted dimension.
std::int64_t sort(Args args, Args) {
  const at::Tensor& self = args[0].toTensor();
  if (self.dim() == 0) return 0;
  for (const c10::IValue& arg : args.slice(1))
    if (arg.isInt()) return self.size(c10::maybe_wrap_dim(arg.toInt(), self.dim())) * 8;
  return 0;
}

// normal with a std tensor checks std.min() >= 0 (a 0-dim minimum, a
// wrapped and cast 0, a bool) once more after allocating its output; with a
// mean number it then fills a 0-dim tensor with it.
std::int64_t std_check(const at::Tensor& std) { return std.numel() > 0 ? 2 * element_size(std) + 8 + 1 : 0; }

std::int64_t normal_tensors(Args args, Args) { return std_check(args[1].toTensor()); }

std::int64_t normal_mean_number(Args args, Args returns) {
  return std::max(std_check(args[1].toTensor()), element_size(returns[0].toTensor()));
}

// With a std number, the kernel makes an (unused) tensor like its output.
std::int64_t normal_std_number(Args, Args returns) { return bytes_of(returns[0].toTensor()); }

// Dirichlet's samples (_s_dirichlet_cpu) are drawn as doubles beside the
// result, then summed over the last dimension, both held to the end.
std::int64_t sample_dirichlet(Args args, Args) {
  const at::Tensor& alpha = args[0].toTensor();
  const std::int64_t rows = alpha.numel() == 0 ? 0 : alpha.numel() / alpha.size(-1);
  return static_cast<std::int64_t>(sizeof(double)) * (alpha.numel() + rows);
}

// count_nonzero over dims is (self != 0).sum(dims): a wrapped and cast 0
// beside the bool mask, then the mask beside its int64 copy that the sum
// reads. Over all dims it counts in place.
std::int64_t count_nonzero(Args args, Args returns) {
  const at::Tensor& self = args[0].toTensor();
  if (args[1].isNone() || (args[1].isIntList() && args[1].toIntVector().empty())) return 0;
  const std::int64_t mask = self.numel();
  return std::max(8 + element_size(self) + mask - bytes_of(returns[0].toTensor()), mask + 8 * mask);
}

// multinomial without replacement, or of one sample, checks self's
// aminmax (two 0-dim) into a bool, the sums of its distributions into
// another, then divides self by exponential noise like it, whose topk goes
// into the result through values of the result's shape. With replacement
// it sums each distribution into one buffer of its categories (float for
// 16-bit types).
std::int64_t multinomial(Args args, Args returns) {
  const at::Tensor& self = args[0].toTensor();
  if (self.numel() == 0) return 0;
  const std::int64_t samples = args[1].toInt();
  if (args[2].toBool() && samples > 1)
    return self.size(-1) * (at::isReducedFloatingType(self.scalar_type()) ? 4 : element_size(self));
  const std::int64_t values = samples > 1 ? returns[0].toTensor().numel() * element_size(self) : 0;
  return 2 * element_size(self) + 2 + bytes_of(self) + values;
}

// median over all elements partitions a clone; along a dim it works on a
// copy unless that dim is already contiguous.
std::int64_t median_all(Args args, Args) { return bytes_of(args[0].toTensor()); }

std::int64_t median_dim(Args args, Args) {
  const at::Tensor& self = args[0].toTensor();
  if (self.dim() == 0) return 0;
  return self.stride(c10::maybe_wrap_dim(args[1].toInt(), self.dim())) > 1 ? bytes_of(self) : 0;
}

// im2col and col2im write into empty_like(input) resized to their output:
// growing it reallocates (both live for a moment); they read the input
// contiguous.
std::int64_t unfold_columns(Args args, Args returns) {
  const at::Tensor &input = args[0].toTensor(), &output = returns[0].toTensor();
  return copy_unless_contiguous(input) + (bytes_of(output) > bytes_of(input) ? bytes_of(input) : 0);
}

// kthvalue selects in a contiguous clone with an int64 index per element.
std::int64_t kthvalue(Args args, Args) {
  const at::Tensor& self = args[0].toTensor();
  return bytes_of(self) + self.numel() * 8;
}

// Binary searches read the sorted sequence and the values contiguous; a
// Scalar value is wrapped in a 0-dim tensor and cast to the sequence's
// dtype. A sorter is first checked in range through its aminmax (two
// 0-dim), before the result exists.
std::int64_t searchsorted(Args args, Args returns) {
  const at::Tensor& sequence = args[0].toTensor();
  std::int64_t values = 0;
  if (args[1].isScalar()) {
    const c10::ScalarType wrapped = wrapped_type(args[1].toScalar());
    values = static_cast<std::int64_t>(c10::elementSize(wrapped)) +
             (wrapped == sequence.scalar_type() ? 0 : element_size(sequence));
  } else {
    values = copy_unless_contiguous(args[1].toTensor());
  }
  const std::int64_t bytes = copy_unless_contiguous(sequence) + values;
  if (!args[5].isTensor()) return bytes;
  const at::Tensor& sorter = args[5].toTensor();
  const std::int64_t range_check = sorter.numel() > 0 ? 2 * element_size(sorter) : 0;
  return std::max(range_check - bytes_of(returns[0].toTensor()), bytes + copy_unless_contiguous(sorter));
}

std::int64_t bucketize(Args args, Args) {
  return copy_unless_contiguous(args[0].toTensor()) + copy_unless_contiguous(args[1].toTensor());
}

// cdist and its gradient read both operands expanded to their common batch,
// contiguous; the gradient also a contiguous gradient and distance.
std::int64_t cdist_operands(const at::Tensor& x1, const at::Tensor& x2) {
  auto batch = at::infer_size(x1.sizes().slice(0, x1.dim() - 2), x2.sizes().slice(0, x2.dim() - 2));
  auto expanded = [&](const at::Tensor& x) {
    auto size = batch;
    size.push_back(x.size(-2));
    size.push_back(x.size(-1));
    return copy_unless_contiguous(x.expand(size));
  };
  return expanded(x1) + expanded(x2);
}

std::int64_t cdist_backward(Args args, Args) {
  return copy_unless_contiguous(args[0].toTensor()) + cdist_operands(args[1].toTensor(), args[2].toTensor()) +
         copy_unless_contiguous(args[4].toTensor());
}

// (p = 2 on more than 25 rows takes the matmul path, whose temporaries are
// its own ops.)
std::int64_t cdist_forward(Args args, Args) {
  const at::Tensor &x1 = args[0].toTensor(), &x2 = args[1].toTensor();
  const bool matmul = args[2].toDouble() == 2.0 && args[3].isInt() &&
                      (args[3].toInt() == 1 || (args[3].toInt() == 0 && (x1.size(-2) > 25 || x2.size(-2) > 25)));
  return matmul ? 0 : cdist_operands(x1, x2);
}

// cumsum and cumprod scan self.to(the result's dtype) (impl_func_cum_ops):
// a copy where the dtypes differ (an integer input's sum in int64).
std::int64_t cumulative_cast(Args args, Args returns) {
  const at::Tensor& self = args[0].toTensor();
  const at::Tensor& result = returns[0].toTensor();
  return self.dim() > 0 && self.scalar_type() != result.scalar_type() ? bytes_of(result) : 0;
}

// histc keeps bins + 1 edges and counts through one bins-long buffer per
// thread; with min == max it first finds the input's range (two 0-dim).
std::int64_t histc(Args args, Args) {
  const at::Tensor& self = args[0].toTensor();
  const std::int64_t bins = args[1].toInt();
  const bool data_range = self.numel() > 0 && args[2].toScalar().toDouble() == args[3].toScalar().toDouble();
  return (bins + 1) * element_size(self) +
         std::max(data_range ? 2 * element_size(self) : 0, at::get_num_threads() * bins * element_size(self));
}

// Elementwise families: every overload of the op and of its in-place form.
ScratchModel elementwise_model(const std::string& op) {
  static const std::unordered_map<std::string, ScratchModel> families = {
      {"aten::add", &elementwise<0, 2, Promotion::Common>},
      {"aten::sub", &elementwise<0, 2, Promotion::Common>},
      {"aten::rsub", &elementwise<0, 2, Promotion::Common>},
      {"aten::mul", &elementwise<0, 2, Promotion::Common>},
      {"aten::remainder", &elementwise<0, 2, Promotion::Common>},
      {"aten::fmod", &elementwise<0, 2, Promotion::Common>},
      {"aten::maximum", &elementwise<0, 2, Promotion::Common>},
      {"aten::minimum", &elementwise<0, 2, Promotion::Common>},
      {"aten::fmax", &elementwise<0, 2, Promotion::Common>},
      {"aten::fmin", &elementwise<0, 2, Promotion::Common>},
      {"aten::hypot", &elementwise<0, 2, Promotion::Common>},
      {"aten::nextafter", &elementwise<0, 2, Promotion::Common>},
      {"aten::heaviside", &elementwise<0, 2, Promotion::Common>},
      {"aten::floor_divide", &elementwise<0, 2, Promotion::Common>},
      {"aten::logaddexp", &elementwise<0, 2, Promotion::Common>},
      {"aten::logaddexp2", &elementwise<0, 2, Promotion::Common>},
      {"aten::bitwise_and", &elementwise<0, 2, Promotion::Common>},
      {"aten::bitwise_or", &elementwise<0, 2, Promotion::Common>},
      {"aten::bitwise_xor", &elementwise<0, 2, Promotion::Common>},
      {"aten::addcmul", &elementwise<0, 3, Promotion::Common>},
      {"aten::addcdiv", &elementwise<0, 3, Promotion::Common>},
      {"aten::where", &elementwise<1, 2, Promotion::Common>},
      {"aten::div", &div},
      {"aten::atan2", &elementwise<0, 2, Promotion::ToFloat>},
      {"aten::copysign", &elementwise<0, 2, Promotion::ToFloat>},
      {"aten::xlogy", &elementwise<0, 2, Promotion::ToFloat>},
      {"aten::special_xlog1py", &elementwise<0, 2, Promotion::ToFloat>},
      {"aten::special_zeta", &elementwise<0, 2, Promotion::ToFloat>},
      {"aten::igamma", &elementwise<0, 2, Promotion::ToFloat>},
      {"aten::igammac", &elementwise<0, 2, Promotion::ToFloat>},
      {"aten::eq", &elementwise<0, 2, Promotion::Comparison>},
      {"aten::ne", &elementwise<0, 2, Promotion::Comparison>},
      {"aten::lt", &elementwise<0, 2, Promotion::Comparison>},
      {"aten::le", &elementwise<0, 2, Promotion::Comparison>},
      {"aten::gt", &elementwise<0, 2, Promotion::Comparison>},
      {"aten::ge", &elementwise<0, 2, Promotion::Comparison>},
      {"aten::logical_and", &elementwise<0, 2, Promotion::Comparison>},
      {"aten::logical_or", &elementwise<0, 2, Promotion::Comparison>},
      {"aten::logical_xor", &elementwise<0, 2, Promotion::Comparison>},
      {"aten::sum", &reduction_cast},
      {"aten::nansum", &reduction_cast},
      {"aten::prod", &reduction_cast},
      {"aten::all", &reduction_cast},
      {"aten::any", &reduction_cast},
      {"aten::mean", &mean},
  };
  std::string family = op;
  if (!family.empty() && family.back() == '_') family.pop_back();
  const auto it = families.find(family);
  return it == families.end() ? nullptr : it->second;
}

}  // namespace

std::int64_t copy_unless_contiguous(const at::Tensor& t, at::MemoryFormat format) {
  return t.defined() && !t.is_contiguous(format) ? bytes_of(t) : 0;
}

std::int64_t copy_unless_viewable_flat(const at::Tensor& t) {
  const std::int64_t flat[] = {t.numel()};
  const bool viewable = t.dim() <= 1 || at::detail::computeStride(t.sizes(), t.strides(), at::IntArrayRef(flat));
  return viewable ? 0 : bytes_of(t);
}

std::int64_t whole_tensor_read_copy(c10::ArrayRef<c10::IValue> arguments, bool flattened) {
  if (arguments.size() > 1 && !arguments[1].isNone()) return 0;
  const at::Tensor& self = arguments[0].toTensor();
  return flattened ? copy_unless_viewable_flat(self) : copy_unless_contiguous(self);
}

std::int64_t deterministic_resize_fill(const at::Tensor& grown) {
  const at::Context& context = at::globalContext();
  const bool fills = context.deterministicAlgorithms() && context.deterministicFillUninitializedMemory();
  return fills && grown.numel() > 0 ? static_cast<std::int64_t>(grown.element_size()) : 0;
}

ScratchModel cpu_scratch_model(const std::string& qualified_name) {
  static const std::unordered_map<std::string, ScratchModel> models = {
      {"aten::tril", &triangle},
      {"aten::triu", &triangle},
      {"aten::index_select", &index_select},
      {"aten::gather", &scatter_gather},
      {"aten::scatter.src", &scatter_gather},
      {"aten::scatter.value", &scatter_gather},
      {"aten::scatter.reduce", &scatter_gather},
      {"aten::scatter.value_reduce", &scatter_gather},
      {"aten::scatter_.src", &scatter_gather},
      {"aten::scatter_.value", &scatter_gather},
      {"aten::scatter_.reduce", &scatter_gather},
      {"aten::scatter_.value_reduce", &scatter_gather},
      {"aten::scatter_add", &scatter_gather},
      {"aten::scatter_add_", &scatter_gather},
      {"aten::scatter_reduce.two", &scatter_reduce},
      {"aten::scatter_reduce_.two", &scatter_reduce},
      {"aten::scatter_reduce.two_out", &scatter_reduce},
      {"aten::_chunk_cat", &chunk_cat},
      {"aten::repeat", &repeat},
      {"aten::narrow_copy", &contiguous_first},
      {"aten::unfold_backward", &unfold_backward},
      {"aten::linalg_vector_norm", &linalg_vector_norm},
      {"aten::rrelu_with_noise", &rrelu_with_noise},
      {"aten::segment_reduce", &segment_reduce},
      {"aten::_segment_reduce_backward", &segment_reduce_backward},
      {"aten::roll", &roll},
      {"aten::sort", &sort},
      {"aten::sort.stable", &sort},
      {"aten::normal.Tensor_Tensor", &normal_tensors},
      {"aten::normal.float_Tensor", &normal_mean_number},
      {"aten::normal.Tensor_float", &normal_std_number},
      {"aten::_sample_dirichlet", &sample_dirichlet},
      {"aten::count_nonzero.dim_IntList", &count_nonzero},
      {"aten::count_nonzero", &count_nonzero},
      {"aten::median", &median_all},
      {"aten::nanmedian", &median_all},
      {"aten::median.dim", &median_dim},
      {"aten::nanmedian.dim", &median_dim},
      {"aten::im2col", &unfold_columns},
      {"aten::col2im", &unfold_columns},
      {"aten::_cdist_forward", &cdist_forward},
      {"aten::kthvalue", &kthvalue},
      {"aten::searchsorted.Tensor", &searchsorted},
      {"aten::searchsorted.Scalar", &searchsorted},
      {"aten::bucketize.Tensor", &bucketize},
      {"aten::_cdist_backward", &cdist_backward},
      {"aten::grid_sampler_2d_backward", &contiguous_first},
      {"aten::histc", &histc},
      {"aten::histc.out", &histc},
      {"aten::copy_", &copy_into},
      {"aten::clone", &copy_of},
      {"aten::_to_copy", &copy_of},
      {"aten::max", &whole_tensor_copy<false>},
      {"aten::min", &whole_tensor_copy<false>},
      {"aten::argmax", &whole_tensor_copy<true>},
      {"aten::argmin", &whole_tensor_copy<true>},
      {"aten::multinomial", &multinomial},
      {"aten::multinomial.out", &multinomial},
      {"aten::cumsum", &cumulative_cast},
      {"aten::cumsum.out", &cumulative_cast},
      {"aten::cumprod", &cumulative_cast},
      {"aten::cumprod.out", &cumulative_cast},
      {"aten::_upsample_bilinear2d_aa_backward", &contiguous_first},
      {"aten::_upsample_bicubic2d_aa_backward", &contiguous_first},
      {"aten::upsample_nearest1d_backward", &contiguous_first},
      {"aten::upsample_nearest2d_backward", &contiguous_first},
      {"aten::upsample_nearest3d_backward", &contiguous_first},
      {"aten::upsample_linear1d_backward", &contiguous_first},
      {"aten::upsample_bilinear2d_backward", &contiguous_first},
      {"aten::upsample_trilinear3d_backward", &contiguous_first},
      {"aten::upsample_bicubic2d_backward", &contiguous_first},
      {"aten::_upsample_nearest_exact1d_backward", &contiguous_first},
      {"aten::_upsample_nearest_exact2d_backward", &contiguous_first},
      {"aten::_upsample_nearest_exact3d_backward", &contiguous_first},
      // pow with a Scalar exponent captures it; a Scalar base is wrapped.
      {"aten::pow.Scalar", &elementwise<0, 2, Promotion::Common>},
      {"aten::pow.Tensor_Tensor", &elementwise<0, 2, Promotion::Common>},
      {"aten::pow_.Tensor", &elementwise<0, 2, Promotion::Common>},
  };
  const auto it = models.find(qualified_name);
  if (it != models.end()) return it->second;
  if (const ScratchModel model = cpu_layer_scratch_model(qualified_name)) return model;
  if (const ScratchModel model = cpu_linalg_scratch_model(qualified_name)) return model;
  return elementwise_model(qualified_name.substr(0, qualified_name.find('.')));
}

}  // namespace metamem
