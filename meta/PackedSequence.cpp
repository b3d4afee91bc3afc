// Packing padded sequences (nn.utils.rnn.pack_padded_sequence) in a trace:
// libtorch's kernel reads the lengths on the host, as a trace reads the
// values it knows of them (made from Python numbers or host data), and
// answers the batch sizes as a host tensor, which the RNN and unpacking
// read in turn. The packed data is made as the kernel makes it: each run of
// time steps with one batch size copied contiguous (where it is not), then
// all concatenated. The kernel runs on the caller's tensors, below
// autograd (which records its backward), where the lengths are still the
// host tensor the caller gave.
#include <ATen/ATen.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "meta/KnownValues.h"
#include "meta/MetaMode.h"
#include "meta/OwnKernel.h"

namespace metamem {
namespace {

std::tuple<at::Tensor, at::Tensor> pack_padded_sequence(const at::Tensor& input, const at::Tensor& lengths,
                                                        bool batch_first) {
  const std::string op = "aten::_pack_padded_sequence";
  TORCH_CHECK(lengths.dim() == 1 && lengths.scalar_type() == at::kLong,
              "'lengths' argument should be a 1D CPU int64 tensor, but got ", lengths.dim(), "D ",
              lengths.scalar_type(), " tensor");
  const std::optional<std::vector<std::int64_t>> known = known_integers(lengths);
  if (!known)
    report_unknown_values(op, "packing sizes the packed data and the batch sizes by the sequences' lengths, which "
                              "a trace knows when they are made from Python numbers or host data.");
  const std::vector<std::int64_t>& length = *known;
  const at::Tensor steps_first = batch_first ? input.transpose(0, 1) : input;
  TORCH_CHECK(steps_first.numel() > 0, "Cannot pack empty tensors.");
  const std::int64_t batch = steps_first.size(1);
  TORCH_CHECK(static_cast<std::int64_t>(length.size()) == batch, "Expected `len(lengths)` to be equal to batch_size, ",
              "but got ", length.size(), " (batch_size=", batch, ")");
  TORCH_CHECK(length.back() > 0,
              "Length of all samples has to be greater than 0, but found an element in 'lengths' that is <= 0");
  for (std::size_t i = 1; i < length.size(); ++i)
    TORCH_CHECK(length[i - 1] >= length[i],
                "`lengths` array must be sorted in decreasing order when `enforce_sorted` is True. You can pass "
                "`enforce_sorted=False` to pack_padded_sequence and/or pack_sequence to sidestep this requirement "
                "if you do not need ONNX exportability.");
  TORCH_CHECK(length.front() <= steps_first.size(0), "Expected sequence length to be larger than or equal to ",
              length.front(), ", but got ", steps_first.size(0));
  // Batch size at each time step: how many sequences are still running.
  at::Tensor batch_sizes;
  {
    OutsideMetaMode outside;  // a host tensor, as the kernel's
    batch_sizes = at::empty({length.front()}, at::TensorOptions().dtype(at::kLong));
  }
  std::int64_t* sizes = batch_sizes.data_ptr<std::int64_t>();
  for (std::int64_t t = 0; t < length.front(); ++t)
    sizes[t] = std::count_if(length.begin(), length.end(), [t](std::int64_t l) { return l > t; });
  std::vector<std::int64_t> step_shape = steps_first.sizes().slice(1).vec();
  step_shape[0] = -1;
  std::vector<at::Tensor> steps;
  for (std::int64_t i = 0, previous = 0; i < batch; ++i) {
    const std::int64_t l = length[batch - 1 - i];
    if (l == previous) continue;
    steps.push_back(steps_first.slice(0, previous, l).slice(1, 0, batch - i).contiguous().view(step_shape));
    previous = l;
  }
  return {at::cat(steps), batch_sizes};
}

// Unpacking: libtorch's composite, its steps as it takes them (a padded
// output, each run of equal batch sizes copied in), with the lengths it
// answers on the host, where libtorch's writes them through data_ptr.
std::tuple<at::Tensor, at::Tensor> pad_packed_sequence(const at::Tensor& data, const at::Tensor& batch_sizes,
                                                       bool batch_first, const at::Scalar& padding_value,
                                                       int64_t total_length) {
  TORCH_CHECK(batch_sizes.dim() == 1 && batch_sizes.scalar_type() == at::kLong && batch_sizes.numel() > 0,
              "batch_sizes should be a 1D int64 tensor with an element per time step");
  const std::optional<std::vector<std::int64_t>> known = known_integers(batch_sizes);
  if (!known)
    report_unknown_values("aten::_pad_packed_sequence", "unpacking sizes the padded output by the batch sizes, "
                                                        "which a trace knows where packing made them.");
  const std::vector<std::int64_t>& sizes = *known;
  const std::int64_t steps = static_cast<std::int64_t>(sizes.size()), batch = sizes.front();
  if (total_length != -1)
    TORCH_CHECK(total_length >= steps, "Expected total_length to be at least the length of the longest sequence in ",
                "the input, but got total_length=", total_length, " and max sequence length being ", steps);
  std::vector<std::int64_t> view_sizes = data.sizes().vec();
  view_sizes.insert(view_sizes.begin(), total_length == -1 ? steps : total_length);
  view_sizes[1] = batch;
  at::Tensor output = at::full(view_sizes, padding_value, data.options());
  at::Tensor lengths;
  {
    OutsideMetaMode outside;  // a host tensor, as the composite's
    lengths = at::empty({batch}, at::TensorOptions().dtype(at::kLong));
  }
  std::int64_t* length = lengths.data_ptr<std::int64_t>() + batch - 1;
  std::int64_t offset = 0, previous = batch, start = 0;
  for (std::int64_t i = 0; i <= steps; ++i) {
    const std::int64_t size = i != steps ? sizes[i] : 0;
    if (size != previous) {
      const std::int64_t n = previous * (i - start);
      view_sizes[0] = i - start;
      view_sizes[1] = previous;
      output.slice(0, start, i).slice(1, 0, previous).copy_(data.slice(0, offset, offset + n).view(view_sizes));
      offset += n;
      start = i;
    }
    for (std::int64_t ended = previous - size; ended > 0; --ended) *length-- = i;
    previous = size;
  }
  return {batch_first ? output.transpose(0, 1) : output, lengths};
}

}  // namespace

std::vector<std::pair<std::string, c10::KernelFunction>> packed_sequence_kernels() {
  return {{"_pack_padded_sequence", c10::KernelFunction::makeFromUnboxedFunction(TORCH_FN(pack_padded_sequence))}};
}

std::vector<std::pair<std::string, c10::KernelFunction>> packed_sequence_composites() {
  return {{"_pad_packed_sequence", c10::KernelFunction::makeFromUnboxedFunction(TORCH_FN(pad_packed_sequence))}};
}

}  // namespace metamem
