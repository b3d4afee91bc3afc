#include "estimator/BatchLine.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <tuple>

namespace metamem {
namespace {

// Whether two traces record the same step but for bytes and flops. Autograd
// node ids are left out: sequence numbers go on counting from one trace to
// the next.
bool same_structure(const Trace& a, const Trace& b) {
  auto event = [](const Event& e) { return std::tie(e.kind, e.index); };
  auto buffer = [](const Buffer& x) {
    return std::tie(x.alloc_event, x.free_event, x.producer_op, x.phase, x.category);
  };
  auto op = [](const OpEvent& o) {
    return std::tie(o.name, o.scope, o.phase, o.first_input, o.n_inputs, o.first_output, o.n_outputs);
  };
  auto step = [](const StepSpan& s) { return s.begin; };
  auto region = [](const Region& r) {
    return std::tie(r.kind, r.first, r.last, r.grad, r.begin, r.end, r.input, r.output);
  };
  auto match = [](const auto& x, const auto& y, auto key) {
    if (x.size() != y.size()) return false;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (key(x[i]) != key(y[i])) return false;
    return true;
  };
  return match(a.events, b.events, event) && match(a.buffers, b.buffers, buffer) && match(a.ops, b.ops, op) &&
         match(a.steps, b.steps, step) && match(a.regions, b.regions, region) && a.op_buffers == b.op_buffers &&
         a.op_names == b.op_names && a.scopes == b.scopes && a.forward_begins == b.forward_begins &&
         a.backward_begins == b.backward_begins && a.backward_ends == b.backward_ends &&
         a.parameter_bytes == b.parameter_bytes && a.parameter_count == b.parameter_count;
}

}  // namespace

std::optional<BatchLine> BatchLine::through(Trace at, std::int64_t batch, const Trace& next) {
  if (batch < 1) throw std::invalid_argument("a batch line starts at batch 1 or more");
  if (!same_structure(at, next)) return std::nullopt;
  BatchLine line(std::move(at), batch);
  const Trace& base = line.base_;
  line.bytes_per_sample_.reserve(base.buffers.size());
  for (std::size_t i = 0; i < base.buffers.size(); ++i) {
    const std::int64_t growth = next.buffers[i].bytes - base.buffers[i].bytes;
    if (growth < 0) return std::nullopt;
    line.bytes_per_sample_.push_back(growth);
  }
  line.flops_per_sample_.reserve(base.ops.size());
  for (std::size_t i = 0; i < base.ops.size(); ++i)
    line.flops_per_sample_.push_back(next.ops[i].flops - base.ops[i].flops);
  line.live_per_sample_.reserve(base.events.size());
  for (std::size_t e = 0; e < base.events.size(); ++e)
    line.live_per_sample_.push_back(next.events[e].live_bytes - base.events[e].live_bytes);
  return line;
}

Trace BatchLine::at(std::int64_t batch) const {
  if (batch < batch_) throw std::invalid_argument("a batch line runs from its first batch up");
  const std::int64_t samples = batch - batch_;
  Trace trace = base_;
  for (std::size_t i = 0; i < trace.buffers.size(); ++i) trace.buffers[i].bytes += bytes_per_sample_[i] * samples;
  for (std::size_t i = 0; i < trace.ops.size(); ++i) trace.ops[i].flops += flops_per_sample_[i] * samples;
  trace.recount_live_bytes();
  return trace;
}

std::int64_t BatchLine::largest_batch_live_within(std::int64_t bytes) const {
  std::int64_t samples = std::numeric_limits<std::int64_t>::max() - batch_;  // beyond the first batch
  for (std::size_t e = base_.measured().begin; e < base_.events.size(); ++e) {
    const std::int64_t live = base_.events[e].live_bytes, growth = live_per_sample_[e];
    if (live > bytes) return batch_ - 1;
    if (growth > 0) samples = std::min(samples, (bytes - live) / growth);
  }
  return batch_ + samples;
}

BatchTrial LineTrials::operator()(std::int64_t batch) {
  if (const auto found = trials_.find(batch); found != trials_.end()) return found->second;
  if (line_ && batch >= line_->first_batch()) return read_off_line(batch);
  if (line_failed_) return traced(batch);
  if (largest_fit_ && largest_fit_->first + 1 < batch && trials_.count(largest_fit_->first + 1) == 0) {
    // A line needs consecutive batches; if the next one fails, so does this.
    if (!traced(largest_fit_->first + 1).fits) return trials_[batch] = BatchTrial{};
    if (line_) return read_off_line(batch);
  }
  return traced(batch);
}

BatchTrial LineTrials::read_off_line(std::int64_t batch) {
  ++line_reads_;
  read_.insert(batch);
  return trials_[batch] = measure_(line_->at(batch));
}

std::int64_t LineTrials::largest_fitting(std::int64_t fits, std::int64_t memory, std::int64_t max_batch) {
  constexpr int kTries = 32;
  if (!line_) return fits;
  const std::int64_t most = std::min(max_batch, line_->largest_batch_live_within(memory));
  std::int64_t found = fits;
  for (std::int64_t batch = most; batch > fits && most - batch < kTries; --batch)
    if ((*this)(batch).fits) {
      found = batch;
      break;
    }
  // A line holds while the step keeps the buffers of its two batches, and a
  // larger batch can change them: a CUDA reduction splits its rows over
  // more blocks, with a staging buffer, past some batch. So its answer and
  // the batch after it are traced; where the first does not fit or the
  // second does, the line and what was read off it are dropped, and the
  // answer is bisected with traces.
  if (fits_when_traced(found) && (found == max_batch || !fits_when_traced(found + 1))) return found;
  line_.reset();
  line_failed_ = true;
  for (const std::int64_t batch : read_) trials_.erase(batch);
  read_.clear();
  std::int64_t low = 0, high = max_batch + 1;  // the largest traced batch that fits, the next that does not
  for (const auto& [batch, trial] : trials_)
    if (trial.fits) low = std::max(low, batch);
  for (const auto& [batch, trial] : trials_)
    if (!trial.fits && batch > low) high = std::min(high, batch);
  while (high - low > 1) {
    const std::int64_t middle = low + (high - low) / 2;
    (traced(middle).fits ? low : high) = middle;
  }
  return low;
}

bool LineTrials::fits_when_traced(std::int64_t batch) {
  if (read_.erase(batch) != 0) trials_.erase(batch);
  const auto known = trials_.find(batch);
  return (known != trials_.end() ? known->second : traced(batch)).fits;
}

BatchTrial LineTrials::traced(std::int64_t batch) {
  ++traces_;
  std::optional<Traced> traced = trace_(batch);
  if (!traced) return trials_[batch] = BatchTrial{};
  const BatchTrial trial = trials_[batch] = traced->trial;
  if (!trial.fits) return trial;
  if (largest_fit_ && largest_fit_->first + 1 == batch && !line_ && !line_failed_)
    line_ = BatchLine::through(std::move(largest_fit_->second), largest_fit_->first, traced->trace);
  if (!largest_fit_ || batch > largest_fit_->first) largest_fit_.emplace(batch, std::move(traced->trace));
  return trial;
}

}  // namespace metamem
