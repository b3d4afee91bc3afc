// The largest batch whose step fits in memory, with few traces: a trace
// costs milliseconds to a second, and a step's bytes are nearly affine in
// its batch (activations grow with it, model states do not).
#pragma once

#include <cstdint>
#include <functional>

namespace metamem {

// What one batch needs, and what its step computes.
struct BatchTrial {
  bool fits = false;
  // What the trial measured against the memory; 0 when it says nothing
  // about the batch's size (a checkpointed plan fitted below it).
  std::int64_t bytes = 0;
  // A measure that grows more evenly with the batch, whose slope guesses
  // take: the live bytes under the CUDA allocator's reserved ones, which
  // jump where it takes a new segment. 0: take the slope of `bytes`.
  std::int64_t even_bytes = 0;
  // Of those, the bytes that do not grow with the batch (model states live
  // when the step began): with them, one trial gives a slope. 0: unknown.
  std::int64_t fixed_bytes = 0;
  // The FLOPs the step runs, and of them the forward FLOPs run again to
  // recompute checkpointed activations. 0: not measured.
  std::int64_t flops = 0, recompute_flops = 0;
};

// What a search may start from: a batch likely to fit and the bytes one
// more sample likely costs (0: unknown), e.g. from a similar layout.
struct BatchHint {
  std::int64_t fits_at = 1;
  double bytes_per_sample = 0;
};

struct BatchFit {
  std::int64_t batch = 0;  // 0: not even batch 1 fits
  // The slope over the widest pair of batches traced (the hint's without
  // two), of even_bytes where the trials gave them.
  double bytes_per_sample = 0;
  int trials = 0;
};

// The largest batch up to `max_batch` whose trial fits, assuming fitting
// is monotone in the batch: every answer is proven by a trial that fits
// at it and one that does not at the next batch (or it is `max_batch`).
// Guesses where the line from the trial nearest `memory`, with the slope
// of the two nearest (the secant across `memory` once it has one), meets it
// (doubling while it knows no slope), and bisects once guessing has not
// closed in after a few trials, or while it points past a failure that
// measured nothing.
BatchFit largest_batch(const std::function<BatchTrial(std::int64_t)>& trial, std::int64_t memory,
                       std::int64_t max_batch, BatchHint hint = {});

}  // namespace metamem
