#pragma once

// The real tensors that were there before a trace (on a fake cpu, a model
// built before the block and trained in it without modules=) are left as
// they were when it ends. An op on real tensors alone runs for real in a
// trace (BatchNorm's num_batches_tracked += 1, AdamW's decay of its real
// parameters): what it writes into them is put back. Backward gives a real
// leaf a traced .grad, which would stop the next real backward where it
// accumulates into it: the .grad it had is put back.

namespace at {
class Tensor;
}

namespace metamem {

// `t`, a real tensor from before the trace that an op running for real is
// about to write: the bytes of its storage as they are, the first time.
void keep_before_real_write(const at::Tensor& t);

// `t`, a real tensor from before the trace reaching a traced op: where it
// is a leaf that requires grad, or a view of one, that leaf's .grad as it
// is, the first time.
void keep_grad_of_leaf(const at::Tensor& t);

// Puts back what was kept, into the tensors and storages still alive, and
// forgets it. The trace has ended: no op of it runs after.
void restore_pre_trace_tensors();

}  // namespace metamem
