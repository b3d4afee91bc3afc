// What CUDA's embedding lookup and its gradient hold beside their outputs,
// in their order. Recorded from real torch 2.14.1 on the fake GPU (a BERT's
// token type embedding, whose ids are an expanded buffer; GPT-2's and
// BERT's embeddings over 4,096 to 16,384 ids).
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/OpMathType.h>
#include <ATen/TensorUtils.h>

#include <algorithm>

#include "meta/CudaAttention.h"
#include "meta/CudaKernelPlans.h"

namespace metamem {
namespace {

// aten::embedding(weight, indices, padding_idx, scale_grad_by_freq,
// sparse): weight.index_select(0, indices.reshape(-1)), whose reshape
// copies ids it cannot view flat before the output exists.
ScratchPlan embedding_plan(c10::ArrayRef<c10::IValue> arguments) {
  ScratchPlan plan;
  plan.make(copy_unless_viewable_flat(arguments[1].toTensor()));
  plan.before_outputs = plan.steps.size();
  return plan;
}

// aten::_embedding_bag and _embedding_bag_forward_only (weight, indices,
// offsets, ...): CUDA makes the bags' sizes, then each id's bag, then the
// output, then (max pooling) the maximum's positions, where it returns the
// output first.
ScratchPlan embedding_bag_plan(c10::ArrayRef<c10::IValue>) {
  ScratchPlan plan;
  for (const std::size_t r : {2, 1, 0, 3}) plan.output(r);
  return plan;
}

// Past 3,072 ids, or scaled by frequency, CUDA sorts the ids (with their
// positions) and sums the gradient's rows by runs of equal ids
// (embedding_backward_cuda_kernel). It sizes every buffer by the number of
// ids and of weights, not by how many are distinct (it reads nothing
// back): runs of at most min(ids, weights) segments, split into partial
// segments of 10 rows. Where few segments would leave the GPU's SMs idle
// (a token-type embedding of 2 rows), it accumulates the partial segments
// into the weight's gradient by atomics instead, in float for 16-bit
// weights. cub's temporary storage as cub sizes it for the GPU, for the
// sort, the runs (unique_by_key, meta/CudaSort.cpp) and the partial
// segments' offsets (an exclusive sum, meta/CudaScan.cpp).
// With `bags` (EmbeddingBag's sum and mean), always by the partial sums.
void sort_and_sum_by_id(ScratchPlan& plan, const at::Tensor& grad, const at::Tensor& indices,
                        std::int64_t num_weights, bool scale_grad_by_freq, bool bags) {
  constexpr std::int64_t kRowsPerThread = 10, kWarp = 32, kMaxBlock = 1024, kAtomicBlocksPerSm = 4;
  const std::int64_t ids = indices.numel(), id_bytes = static_cast<std::int64_t>(indices.element_size());
  const std::int64_t index_list = ids * id_bytes;
  plan.make(index_list);                           // the sorted ids
  plan.make(index_list);                           // their positions
  const std::size_t in_order = plan.make(index_list);  // the positions in order, sorted with them
  make_cub_radix_sort_storage(plan, ids, id_bytes, id_bytes, cub_num_bits(num_weights));  // on the ids' bits alone
  plan.free(in_order);
  if (scale_grad_by_freq) {
    plan.make(index_list);  // each id's count: a run's running count, then its largest
    for (int scan = 0; scan < 2; ++scan) make_cub_scan_by_key_storage(plan, ids, id_bytes);
  }
  plan.output(0);                                  // the weight's gradient, zeros
  plan.make(index_list);                           // where each run of equal ids begins
  plan.make(8);                                    // how many runs
  const std::size_t run_ids = plan.make(index_list);  // the runs' ids
  make_cub_unique_storage(plan, ids, id_bytes, /*by_key=*/true);
  plan.free(run_ids);
  const std::int64_t segments = std::min(ids, num_weights);
  plan.make(segments * id_bytes);  // partial segments per run
  plan.make(segments * id_bytes);  // their offsets, an exclusive sum of them
  make_cumulative_sum_storage(plan, segments, indices.scalar_type());
  plan.make(8);  // how many partial segments
  const std::int64_t partials = ids / kRowsPerThread + segments;
  plan.make(partials * id_bytes);  // where each begins
  const std::int64_t width = grad.size(-1), warped = (width + kWarp - 1) / kWarp * kWarp;
  const std::int64_t block = std::min(warped, kMaxBlock), scatter_grid = (segments * warped + block - 1) / block;
  const bool atomics = !bags &&
                       scatter_grid < std::int64_t{traced_gpu().multi_processor_count} * kAtomicBlocksPerSm &&
                       partials > scatter_grid * 4 && !at::globalContext().deterministicAlgorithms();
  const at::ScalarType accumulate = at::toOpMathType(grad.scalar_type());
  const std::int64_t accumulate_bytes = static_cast<std::int64_t>(c10::elementSize(accumulate));
  if (!atomics) {
    plan.make(partials * width * accumulate_bytes);  // each partial segment's sum
    return;
  }
  plan.make(partials * id_bytes);  // each partial segment's run
  if (accumulate != grad.scalar_type()) plan.free(plan.make(num_weights * width * accumulate_bytes));
}

// aten::embedding_dense_backward(grad_output, indices, num_weights,
// padding_idx, scale_grad_by_freq): the ids, then the gradient, made
// contiguous before the weight's gradient; past 3,072 ids, or scaled by
// frequency, sorted and summed by id.
ScratchPlan embedding_backward_plan(c10::ArrayRef<c10::IValue> arguments) {
  ScratchPlan plan;
  const at::Tensor &grad = arguments[0].toTensor(), &indices = arguments[1].toTensor();
  plan.make(copy_unless_contiguous(indices));
  plan.make(copy_unless_contiguous(grad));
  plan.before_outputs = plan.steps.size();
  const bool scale_grad_by_freq = arguments[4].toBool();
  if (indices.numel() > 3072 || scale_grad_by_freq)
    sort_and_sum_by_id(plan, grad, indices, arguments[2].toInt(), scale_grad_by_freq, /*bags=*/false);
  return plan;
}

// aten::_embedding_bag_dense_backward(grad, indices, offset2bag, bag_size,
// maximum_indices, num_weights, scale_grad_by_freq, mode,
// per_sample_weights, padding_idx): the gradient made contiguous, then for
// sums and means the ids sorted and summed by id whatever their number;
// max pooling scatters the gradient by the maximum's positions alone.
ScratchPlan embedding_bag_backward_plan(c10::ArrayRef<c10::IValue> arguments) {
  constexpr std::int64_t kMax = 2;
  ScratchPlan plan;
  const at::Tensor &grad = arguments[0].toTensor(), &indices = arguments[1].toTensor();
  plan.make(copy_unless_contiguous(grad));
  plan.before_outputs = plan.steps.size();
  if (arguments[7].toInt() != kMax && indices.numel() > 0)
    sort_and_sum_by_id(plan, grad, indices, arguments[5].toInt(), arguments[6].toBool(), /*bags=*/true);
  return plan;
}

}  // namespace

ScratchPlanModel cuda_embedding_plan_model(const std::string& qualified_name) {
  if (qualified_name == "aten::embedding") return &embedding_plan;
  if (qualified_name == "aten::_embedding_bag" || qualified_name == "aten::_embedding_bag_forward_only")
    return &embedding_bag_plan;
  if (qualified_name == "aten::_embedding_bag_dense_backward") return &embedding_bag_backward_plan;
  return qualified_name == "aten::embedding_dense_backward" ? &embedding_backward_plan : nullptr;
}

}  // namespace metamem
