// memonger: planners, lower bound, verification, CSV. No libtorch here.
#include <gtest/gtest.h>

#include <random>
#include <sstream>

#include "memonger/Plan.h"
#include "memonger/RangeCsv.h"
#include "tests/RangeGenerators.h"

namespace memonger {
namespace {

Plan plan_with(const std::string& algorithm, const Problem& problem) {
  Plan plan = make_planner(algorithm)->plan(problem);
  EXPECT_EQ(verify(problem, plan), std::vector<std::string>{}) << algorithm;
  EXPECT_GE(plan.planned_bytes, lower_bound_bytes(problem)) << algorithm;
  return plan;
}

// Caffe2's memonger tests.
TEST(Memonger, Caffe2GoldenCases) {
  const Problem first({{1, 1, 3, 10}, {2, 3, 4, 1}, {3, 5, 6, 1}, {4, 5, 7, 10}});
  EXPECT_EQ(plan_with("greedy", first).planned_bytes, 11);
  EXPECT_EQ(plan_with("dp", first).planned_bytes, 11);
  EXPECT_EQ(plan_with("greedy", first).buffers, 2);

  const Problem second({{1, 1, 2, 10}, {2, 4, 6, 1}, {3, 5, 6, 10}});
  EXPECT_EQ(plan_with("dp", second).planned_bytes, 11);
  EXPECT_EQ(plan_with("greedy", second).planned_bytes, 20);  // the reason for dp
}

TEST(Memonger, LowerBoundIsMaxLiveBytes) {
  // Steps 1..7: live 10, 10, 11, 1, 12, 11, 10.
  const Problem problem({{1, 1, 3, 10}, {2, 3, 4, 1}, {3, 5, 6, 2}, {4, 5, 7, 10}});
  EXPECT_EQ(lower_bound_bytes(problem), 12);
  const Statistics stats = compute_statistics(problem, plan_with("bestfit", problem));
  EXPECT_EQ(stats.baseline_bytes, 23);
  EXPECT_EQ(stats.lower_bound_bytes, 12);
  EXPECT_EQ(stats.planned_bytes, 12);
  EXPECT_DOUBLE_EQ(stats.ratio(), 1.0);
}

TEST(Memonger, ClosedIntervalsCannotReuseAtTheSameStep) {
  const Problem problem({{1, 0, 2, 8}, {2, 2, 4, 8}});
  EXPECT_EQ(lower_bound_bytes(problem), 16);
  EXPECT_EQ(plan_with("greedy", problem).planned_bytes, 16);
}

TEST(Memonger, AlignmentRoundsSizesUp) {
  const Problem problem({{1, 0, 0, 1}, {2, 0, 0, 65}}, 64);
  EXPECT_EQ(problem.bytes(0), 64);
  EXPECT_EQ(problem.bytes(1), 128);
  EXPECT_EQ(plan_with("bestfit", problem).planned_bytes, 192);
}

TEST(Memonger, PinnedRangesShareNothing) {
  // The input is dead after step 0, yet its bytes stay its own.
  const Problem problem({{1, 0, 0, 100, true}, {2, 1, 2, 50}, {3, 3, 4, 50}});
  EXPECT_EQ(lower_bound_bytes(problem), 150);
  for (const char* algorithm : {"greedy", "dp", "bestfit", "auto"})
    EXPECT_EQ(plan_with(algorithm, problem).planned_bytes, 150) << algorithm;
}

TEST(Memonger, ChainIsPlannedAtItsLargestAdjacentPair) {
  for (std::uint32_t seed = 0; seed < 20; ++seed) {
    const auto ranges = testing::chain(200, seed);
    const Problem problem(ranges);
    EXPECT_EQ(lower_bound_bytes(problem), testing::largest_adjacent_pair(ranges));
    EXPECT_EQ(plan_with("bestfit", problem).planned_bytes, testing::largest_adjacent_pair(ranges))
        << "seed " << seed;
  }
}

// Cut from a 10,000-byte rectangle: the optimum is 10,000. Best fit plus
// the two-ended packing lands at 1.015x on average here, 1.14x at worst.
TEST(Memonger, PerfectPackingIsPlannedNearItsWidth) {
  double total = 0;
  for (std::uint32_t seed = 0; seed < 20; ++seed) {
    const Problem problem(testing::perfect_packing(10'000, 200, 60, seed));
    EXPECT_EQ(lower_bound_bytes(problem), 10'000);
    const std::int64_t planned = plan_with("bestfit", problem).planned_bytes;
    EXPECT_LE(planned, 11'500) << "seed " << seed;
    total += static_cast<double>(planned) / 10'000;
  }
  EXPECT_LE(total / 20, 1.03);
}

TEST(Memonger, RandomInstancesAlwaysVerify) {
  std::mt19937 rng(7);
  for (std::uint32_t seed = 0; seed < 30; ++seed) {
    auto ranges = testing::random_ranges(300, seed, 100);
    for (LiveRange& r : ranges) r.pinned = rng() % 20 == 0;
    const Problem problem(ranges, 1 + seed % 3 * 63);
    for (const char* algorithm : {"greedy", "bestfit", "auto"}) plan_with(algorithm, problem);
  }
}

TEST(Memonger, DpNeverLosesToGreedy) {
  for (std::uint32_t seed = 0; seed < 200; ++seed) {
    const Problem problem(testing::random_ranges(10, seed, 12));
    const Plan dp = plan_with("dp", problem);
    EXPECT_LE(dp.planned_bytes, plan_with("greedy", problem).planned_bytes) << "seed " << seed;
    EXPECT_GE(dp.planned_bytes, lower_bound_bytes(problem));
  }
}

TEST(Memonger, DpGivesUpClearlyOnLargeInstances) {
  const Problem problem(testing::random_ranges(400, 3, 40));
  try {
    make_planner("dp")->plan(problem);
    FAIL() << "expected PlanLimitError";
  } catch (const PlanLimitError& e) {
    EXPECT_NE(std::string(e.what()).find("use greedy or bestfit"), std::string::npos);
  }
}

TEST(Memonger, VerifyCatchesBrokenPlans) {
  const Problem problem({{1, 0, 2, 8}, {2, 1, 3, 8}, {3, 5, 6, 8, true}});
  Plan plan{"hand", {0, 4, 16}, 24, 3};
  const auto errors = verify(problem, plan);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0], "range 2 and range 1 are alive together and overlap");
  plan.offsets = {0, 8, 0};
  EXPECT_EQ(verify(problem, plan), std::vector<std::string>{"pinned range 3 shares bytes with range 1"});
  plan.offsets = {0, 8, 20};
  EXPECT_EQ(verify(problem, plan), std::vector<std::string>{"range 3 lies outside the arena"});
}

TEST(Memonger, UnknownAlgorithmIsAnInputError) {
  EXPECT_THROW(make_planner("magic"), InputError);
}

TEST(RangeCsv, RoundTrips) {
  const std::vector<LiveRange> ranges = {{3, 0, 4, 1024, false}, {9, 2, 2, 0, true}};
  std::stringstream csv;
  write_ranges_csv(csv, ranges);
  const auto back = read_ranges_csv(csv);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].id, 3);
  EXPECT_EQ(back[0].last, 4);
  EXPECT_EQ(back[0].bytes, 1024);
  EXPECT_TRUE(back[1].pinned);
}

std::string csv_error(const std::string& text) {
  std::istringstream in(text);
  try {
    read_ranges_csv(in);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(RangeCsv, NamesTheBadLine) {
  EXPECT_EQ(csv_error("id,first,last,bytes\n1,0,1,8\n2,0,x,8\n"),
            "line 3: last is not an integer: 'x'");
  EXPECT_EQ(csv_error("1,0,1\n"), "line 1: expected id,first,last,bytes[,pinned], got 3 fields");
  EXPECT_EQ(csv_error("# comment\n\n1,0,1,-8\n"), "line 3: negative bytes");
  EXPECT_EQ(csv_error("1,5,1,8\n"), "line 1: last step before first step");
  EXPECT_EQ(csv_error("1,0,1,8\n1,2,3,8\n"), "line 2: duplicate id 1 (first on line 1)");
  EXPECT_EQ(csv_error("1,0,1,8,2\n"), "line 1: pinned must be 0 or 1");
  EXPECT_EQ(csv_error("1,0,1,99999999999999999999\n"),
            "line 1: bytes is not an integer: '99999999999999999999'");
}

// Random bytes and mutated valid files: an InputError or ranges, never a crash.
TEST(RangeCsv, SurvivesFuzzing) {
  std::mt19937 rng(42);
  const std::string alphabet = "0123456789,-#\n \t\rx";
  const std::string valid = "id,first,last,bytes\n1,0,3,64\n2,1,2,128,1\n";
  int parsed = 0, rejected = 0;
  for (int round = 0; round < 5000; ++round) {
    std::string text = valid;
    const int edits = 1 + static_cast<int>(rng() % 6);
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = rng() % (text.size() + 1);
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0: text.insert(text.begin() + static_cast<std::ptrdiff_t>(at), c); break;
        case 1: if (at < text.size()) text.erase(at, 1); break;
        default: if (at < text.size()) text[at] = c;
      }
    }
    std::istringstream in(text);
    try {
      const Problem problem(read_ranges_csv(in));
      make_planner("auto")->plan(problem);
      ++parsed;
    } catch (const InputError&) {
      ++rejected;
    }
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(rejected, 0);
}

}  // namespace
}  // namespace memonger
