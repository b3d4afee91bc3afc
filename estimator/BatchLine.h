// A step's trace as a line in its batch size. A training step's buffers
// hold either what does not depend on the batch (model states, their
// gradients and optimizer states) or per-sample data, which grows by the
// same bytes with every sample; so two traces of one step at consecutive
// batches whose events match one for one give its trace at any larger
// batch without running it: the allocator's rounding and fragmentation
// follow from replaying it. A batch search needs two traces, then
// milliseconds per batch.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "estimator/BatchSearch.h"
#include "profiler/Trace.h"

namespace metamem {

class BatchLine {
 public:
  // The line through `at` (batch `batch`) and `next` (batch + 1); nullopt
  // when their events, buffers or ops differ beyond their bytes and flops
  // (the step branched on the batch), or a buffer shrinks as it grows.
  static std::optional<BatchLine> through(Trace at, std::int64_t batch, const Trace& next);

  std::int64_t first_batch() const { return batch_; }
  // The step's trace at `batch` (at least the first batch).
  Trace at(std::int64_t batch) const;
  // The largest batch whose measured step never holds more than `bytes`
  // live (what it needs on any device: an allocator only adds to them);
  // first_batch() - 1 when not even the first batch's does, INT64_MAX when
  // no batch's ever passes them.
  std::int64_t largest_batch_live_within(std::int64_t bytes) const;

 private:
  BatchLine(Trace base, std::int64_t batch) : base_(std::move(base)), batch_(batch) {}

  Trace base_;
  std::int64_t batch_;
  std::vector<std::int64_t> bytes_per_sample_;  // of each buffer
  std::vector<std::int64_t> flops_per_sample_;  // of each op
  std::vector<std::int64_t> live_per_sample_;   // after each event
};

// A batch search's trials of one step, each batch once: traced until two
// consecutive batches fit (a larger batch asked for first traces the one
// after the largest that fitted), then read off their line.
class LineTrials {
 public:
  // A traced batch and what it needs against the memory.
  struct Traced {
    Trace trace;
    BatchTrial trial;
  };
  // Traces the step at a batch: nullopt when it stopped, needing more
  // memory than there is. What the trace needs comes with it (an allocator
  // run alongside the trace has measured it already).
  using TraceAt = std::function<std::optional<Traced>(std::int64_t batch)>;
  // What a trace read off the line needs against the memory.
  using Measure = std::function<BatchTrial(const Trace&)>;

  LineTrials(TraceAt trace, Measure measure) : trace_(std::move(trace)), measure_(std::move(measure)) {}

  BatchTrial operator()(std::int64_t batch);
  // With a line, the largest batch up to `max_batch` that fits, read off it
  // (the allocator's fragmentation can let a batch fit past one that does
  // not): the batches below the most whose live bytes fit in `memory` are
  // tried from the top, a few dozen at most; the one found and the next are
  // then traced to confirm the line there, and where it does not hold the
  // answer is bisected with traces. Otherwise, or when none of those fits,
  // `fits`: a batch known to fit.
  std::int64_t largest_fitting(std::int64_t fits, std::int64_t memory, std::int64_t max_batch);
  int traces() const { return traces_; }
  int line_reads() const { return line_reads_; }  // batches read off the line

 private:
  BatchTrial traced(std::int64_t batch);
  BatchTrial read_off_line(std::int64_t batch);
  // Whether `batch` fits, as its trace says (traced now if it was read off
  // the line, or not tried).
  bool fits_when_traced(std::int64_t batch);

  TraceAt trace_;
  Measure measure_;
  std::map<std::int64_t, BatchTrial> trials_;
  std::optional<std::pair<std::int64_t, Trace>> largest_fit_;  // the largest batch traced that fitted
  std::optional<BatchLine> line_;
  std::set<std::int64_t> read_;  // the batches of trials_ read off the line
  bool line_failed_ = false;     // a line did not hold: every batch is traced
  int traces_ = 0, line_reads_ = 0;
};

}  // namespace metamem
