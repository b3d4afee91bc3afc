// largest_batch: the answer bisection would give, in fewer trials.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <set>

#include "estimator/BatchSearch.h"

namespace metamem {
namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

// A search over `bytes(batch)` that also records which batches it tried.
template <typename BytesFn>
BatchFit search(const BytesFn& bytes, std::int64_t memory, std::int64_t max_batch, BatchHint hint,
                std::set<std::int64_t>* tried = nullptr) {
  return largest_batch(
      [&](std::int64_t batch) {
        if (tried) EXPECT_TRUE(tried->insert(batch).second) << "batch " << batch << " tried twice";
        const std::int64_t b = bytes(batch);
        return BatchTrial{b <= memory, b};
      },
      memory, max_batch, hint);
}

template <typename BytesFn>
std::int64_t brute_force(const BytesFn& bytes, std::int64_t memory, std::int64_t max_batch) {
  std::int64_t best = 0;
  for (std::int64_t b = 1; b <= max_batch && bytes(b) <= memory; ++b) best = b;
  return best;
}

TEST(BatchSearch, AffineBytesTakeFourTrialsFromNothing) {
  auto bytes = [](std::int64_t b) { return 3000 * kMiB + 700 * kMiB * b; };
  const std::int64_t memory = 80 * 1024 * kMiB;
  const BatchFit fit = search(bytes, memory, 1 << 16, {});
  EXPECT_EQ(fit.batch, (memory - 3000 * kMiB) / (700 * kMiB));  // 112
  EXPECT_EQ(fit.trials, 4);  // 1, 2, then the line's answer and the batch after it
  EXPECT_DOUBLE_EQ(fit.bytes_per_sample, 700.0 * kMiB);
}

// A trial that says which of its bytes do not grow with the batch gives a
// slope by itself.
TEST(BatchSearch, FixedBytesGiveASlopeFromOneTrial) {
  const std::int64_t fixed = 3000 * kMiB, memory = 80 * 1024 * kMiB;
  std::set<std::int64_t> tried;
  const BatchFit fit = largest_batch(
      [&](std::int64_t b) {
        tried.insert(b);
        const std::int64_t bytes = fixed + 700 * kMiB * b;
        return BatchTrial{bytes <= memory, bytes, 0, fixed};
      },
      memory, 1 << 16);
  EXPECT_EQ(fit.batch, 112);
  EXPECT_EQ(tried, (std::set<std::int64_t>{1, 112, 113}));
}

TEST(BatchSearch, AKnownSlopeSavesATrialAndAGoodHintTwo) {
  auto bytes = [](std::int64_t b) { return 3000 * kMiB + 700 * kMiB * b; };
  const std::int64_t memory = 80 * 1024 * kMiB;
  EXPECT_EQ(search(bytes, memory, 1 << 16, {1, 700.0 * kMiB}).trials, 3);
  const BatchFit fit = search(bytes, memory, 1 << 16, {112, 650.0 * kMiB});
  EXPECT_EQ(fit.batch, 112);
  EXPECT_EQ(fit.trials, 2);
}

TEST(BatchSearch, AHintThatDoesNotFitSearchesBelowIt) {
  auto bytes = [](std::int64_t b) { return 100 * kMiB * b; };
  EXPECT_EQ(search(bytes, 1000 * kMiB, 1 << 16, {40, 0}).batch, 10);
  EXPECT_EQ(search(bytes, 1000 * kMiB, 1 << 16, {40, 100.0 * kMiB}).trials, 3);
}

TEST(BatchSearch, NothingFitsAfterOneTrialAtBatchOne) {
  auto bytes = [](std::int64_t b) { return 100 * kMiB * (b + 20); };
  const BatchFit fit = search(bytes, 1000 * kMiB, 64, {});
  EXPECT_EQ(fit.batch, 0);
  EXPECT_EQ(fit.trials, 1);
}

TEST(BatchSearch, StopsAtTheLargestBatchAllowed) {
  auto bytes = [](std::int64_t b) { return kMiB * b; };
  const BatchFit fit = search(bytes, 1 << 30, 48, {});
  EXPECT_EQ(fit.batch, 48);
  EXPECT_LE(fit.trials, 3);  // 1, 2, 48
}

// Trials that measure nothing (a checkpointed plan fitted) leave doubling
// and bisection.
TEST(BatchSearch, UnmeasuredTrialsBisect) {
  std::set<std::int64_t> tried;
  const BatchFit fit = largest_batch(
      [&](std::int64_t b) {
        tried.insert(b);
        return BatchTrial{b <= 37, 0};
      },
      1000, 1 << 16);
  EXPECT_EQ(fit.batch, 37);
  EXPECT_EQ(tried, (std::set<std::int64_t>{1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37}));
}

// A trace that stops as soon as it needs more than the memory measures
// nothing: a line pointing past it bisects instead of stepping down one
// batch per trial, and a trial that measured bytes on both sides then
// takes the secant.
TEST(BatchSearch, AFailureThatMeasuredNothingBisects) {
  const std::int64_t memory = 15500 * kMiB;
  std::set<std::int64_t> tried;
  const BatchFit fit = largest_batch(
      [&](std::int64_t b) {
        tried.insert(b);
        const std::int64_t bytes = 1000 * kMiB * b;
        return b > 20 ? BatchTrial{} : BatchTrial{bytes <= memory, bytes};
      },
      memory, 1 << 16, {7, 400.0 * kMiB});
  EXPECT_EQ(fit.batch, 15);
  EXPECT_EQ(tried, (std::set<std::int64_t>{7, 28, 17, 15, 16}));
}

// The simulated allocator's reserved bytes: an affine line, rounded up to
// 2 MiB segments, with a step where a large buffer starts a new segment.
TEST(BatchSearch, StaircasesMatchBruteForce) {
  for (std::int64_t step_at : {5, 17, 90})
    for (std::int64_t memory = 600 * kMiB; memory < 2000 * kMiB; memory += 37 * kMiB) {
      auto bytes = [&](std::int64_t b) {
        const std::int64_t live = 200 * kMiB + 11 * kMiB * b + 5 * kMiB * (b * b % 3);
        return (live + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB) + (b >= step_at ? 256 * kMiB : 0);
      };
      std::set<std::int64_t> tried;
      const BatchFit fit = search(bytes, memory, 1000, {}, &tried);
      ASSERT_EQ(fit.batch, brute_force(bytes, memory, 1000)) << "memory " << memory << " step " << step_at;
      EXPECT_LE(fit.trials, 16);
    }
}

// Any monotone bytes: random increments, some of them large.
TEST(BatchSearch, RandomMonotoneBytesMatchBruteForce) {
  std::mt19937_64 random(7);
  for (int run = 0; run < 300; ++run) {
    std::vector<std::int64_t> table(301, 0);
    std::uniform_int_distribution<std::int64_t> increment(0, 50), jump(0, 20);
    for (std::size_t b = 1; b < table.size(); ++b)
      table[b] = table[b - 1] + increment(random) + (jump(random) == 0 ? 2000 : 0);
    auto bytes = [&](std::int64_t b) { return table[b]; };
    const std::int64_t memory = std::uniform_int_distribution<std::int64_t>(0, table.back() + 100)(random);
    const BatchHint hint{std::uniform_int_distribution<std::int64_t>(1, 300)(random),
                         static_cast<double>(std::uniform_int_distribution<int>(0, 80)(random))};
    const BatchFit fit = search(bytes, memory, 300, hint);
    ASSERT_EQ(fit.batch, brute_force(bytes, memory, 300)) << "run " << run;
    EXPECT_LE(fit.trials, 1 + 4 + 2 * 9);  // guesses, then doubling and bisection up to 300
  }
}

}  // namespace
}  // namespace metamem
