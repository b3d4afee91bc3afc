#include "estimator/BatchSearch.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <optional>

namespace metamem {
namespace {

// Guesses before the search falls back to bisection: enough for lines that
// bend a little (the allocator's rounding), few enough that one bending a
// lot costs little.
constexpr int kGuesses = 4;

// What a trial measured, by batch.
using Measured = std::map<std::int64_t, BatchTrial>;

std::int64_t even_or_bytes(const BatchTrial& t) { return t.even_bytes > 0 ? t.even_bytes : t.bytes; }

// The slope between two trials: of their even bytes where both have them,
// unless `even` is false.
double slope(Measured::const_iterator a, Measured::const_iterator b, bool even = true) {
  even = even && a->second.even_bytes > 0 && b->second.even_bytes > 0;
  const std::int64_t rise = even ? b->second.even_bytes - a->second.even_bytes : b->second.bytes - a->second.bytes;
  return static_cast<double>(rise) / static_cast<double>(b->first - a->first);
}

// Where the line from the measured trial nearest the memory meets it: the
// trial at `fits`, else the one at `fails`. Its slope is the secant of the
// bytes at `fits` and `fails` when both were measured (the allocator's
// fragmentation makes them grow faster than the even bytes do), else the
// even slope of the two nearest on the side that was, else, with one trial
// that fits, its bytes above its fixed bytes per sample, else the hint's.
std::optional<std::int64_t> interpolate(const Measured& measured, std::int64_t fits, std::int64_t fails,
                                        std::int64_t memory, double hinted_slope) {
  const auto below = measured.find(fits), above = measured.find(fails);
  Measured::const_iterator anchor;
  double per_sample = hinted_slope;
  if (below != measured.end()) {
    anchor = below;
    if (above != measured.end())
      per_sample = slope(below, above, false);
    else if (below != measured.begin())
      per_sample = slope(std::prev(below), below);
    else if (below->second.fixed_bytes > 0)
      per_sample = static_cast<double>(even_or_bytes(below->second) - below->second.fixed_bytes) /
                   static_cast<double>(below->first);
  } else if (above != measured.end()) {
    anchor = above;
    if (std::next(above) != measured.end()) per_sample = slope(above, std::next(above));
  } else {
    return std::nullopt;
  }
  if (!(per_sample > 0)) return std::nullopt;
  const double samples = std::floor(static_cast<double>(memory - anchor->second.bytes) / per_sample);
  return anchor->first + static_cast<std::int64_t>(std::clamp(samples, -1e15, 1e15));
}

}  // namespace

BatchFit largest_batch(const std::function<BatchTrial(std::int64_t)>& trial, std::int64_t memory,
                       std::int64_t max_batch, BatchHint hint) {
  BatchFit result;
  if (max_batch < 1) return result;
  Measured measured;
  std::int64_t fits = 0, fails = max_batch + 1;  // the largest batch that fits, the smallest known not to
  bool bounded = false;                          // a trial failed
  std::int64_t next = std::clamp<std::int64_t>(hint.fits_at, 1, max_batch);
  for (int guesses = 0;; ++guesses) {
    const BatchTrial t = trial(next);
    ++result.trials;
    if (t.bytes > 0) measured[next] = t;
    (t.fits ? fits : fails) = next;
    bounded |= !t.fits;
    if (fits + 1 >= fails) break;
    std::optional<std::int64_t> guess;
    if (guesses < kGuesses) guess = interpolate(measured, fits, fails, memory, hint.bytes_per_sample);
    // A line that still points at or past a failure that measured nothing
    // learnt nothing from it: bisect rather than step down one at a time.
    if (guess && *guess >= fails && !t.fits && t.bytes == 0) guess.reset();
    if (!guess) guess = bounded ? fits + (fails - fits) / 2 : 2 * fits;
    next = std::clamp(*guess, fits + 1, fails - 1);
  }
  result.batch = fits;
  result.bytes_per_sample = measured.size() >= 2 ? slope(measured.begin(), std::prev(measured.end()))
                                                 : hint.bytes_per_sample;
  return result;
}

}  // namespace metamem
