// Planning instances with known structure, for memonger's tests and bench.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "memonger/LiveRange.h"
#include "memonger/RangeCsv.h"

namespace memonger::testing {

// Sizes with a heavy tail (Pareto), lifetimes mostly short.
inline std::vector<LiveRange> random_ranges(std::size_t n, std::uint32_t seed,
                                            std::int64_t horizon = 0) {
  std::mt19937_64 rng(seed);
  if (horizon == 0) horizon = static_cast<std::int64_t>(n);
  std::uniform_int_distribution<std::int64_t> start(0, horizon - 1);
  std::exponential_distribution<double> length(1.0 / 8);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<LiveRange> ranges;
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t first = start(rng);
    const auto bytes = static_cast<std::int64_t>(64.0 / std::pow(1.0 - unit(rng), 1.0 / 1.2));
    ranges.push_back({static_cast<std::int64_t>(i), first,
                      first + static_cast<std::int64_t>(length(rng)), std::min<std::int64_t>(bytes, 1 << 26)});
  }
  return ranges;
}

// Range i lives over steps i and i+1: only neighbours overlap.
inline std::vector<LiveRange> chain(std::size_t n, std::uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> bytes(1, 1000);
  std::vector<LiveRange> ranges;
  for (std::size_t i = 0; i < n; ++i) {
    const auto step = static_cast<std::int64_t>(i);
    ranges.push_back({step, step, step + 1, bytes(rng)});
  }
  return ranges;
}

inline std::int64_t largest_adjacent_pair(const std::vector<LiveRange>& chain) {
  std::int64_t best = chain.empty() ? 0 : chain[0].bytes;
  for (std::size_t i = 1; i < chain.size(); ++i)
    best = std::max(best, chain[i - 1].bytes + chain[i].bytes);
  return best;
}

// A width x steps rectangle cut by guillotine cuts into `pieces` ranges:
// every step is covered exactly, so the optimum is `width`.
inline std::vector<LiveRange> perfect_packing(std::int64_t width, std::int64_t steps,
                                              std::size_t pieces, std::uint32_t seed) {
  struct Piece {
    std::int64_t first, last, low, high;
  };
  std::mt19937_64 rng(seed);
  std::vector<Piece> todo = {{0, steps - 1, 0, width}};
  while (todo.size() < pieces) {
    std::uniform_int_distribution<std::size_t> pick(0, todo.size() - 1);
    const std::size_t k = pick(rng);
    Piece piece = todo[k];
    const bool cut_time = std::bernoulli_distribution(0.5)(rng);
    if (cut_time && piece.last > piece.first) {
      std::uniform_int_distribution<std::int64_t> at(piece.first, piece.last - 1);
      const std::int64_t t = at(rng);
      todo[k] = {piece.first, t, piece.low, piece.high};
      todo.push_back({t + 1, piece.last, piece.low, piece.high});
    } else if (!cut_time && piece.high - piece.low > 1) {
      std::uniform_int_distribution<std::int64_t> at(piece.low + 1, piece.high - 1);
      const std::int64_t y = at(rng);
      todo[k] = {piece.first, piece.last, piece.low, y};
      todo.push_back({piece.first, piece.last, y, piece.high});
    }
  }
  std::vector<LiveRange> ranges;
  for (const Piece& piece : todo)
    ranges.push_back({static_cast<std::int64_t>(ranges.size()), piece.first, piece.last,
                      piece.high - piece.low});
  return ranges;
}

// A training step's shape: layer i's activation lives from its forward
// (step i) to its backward (step 2n - i); each layer has a forward
// temporary and a gradient that lives one step into the next backward.
inline std::vector<LiveRange> training_step(std::size_t layers, std::uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> bytes(1 << 10, 1 << 20);
  const auto n = static_cast<std::int64_t>(layers);
  std::vector<LiveRange> ranges;
  auto add = [&](std::int64_t first, std::int64_t last, std::int64_t size) {
    ranges.push_back({static_cast<std::int64_t>(ranges.size()), first, last, size});
  };
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t activation = bytes(rng);
    add(i, 2 * n - i, activation);
    add(i, i, bytes(rng));
    add(2 * n - i, 2 * n - i + 1, activation);
  }
  return ranges;
}

// One of MiniMalloc's challenging instances ("A".."K", bench/data,
// Apache-2.0, see its NOTICE), each known to fit in 1 MiB. Its readers
// define METAMEM_BENCH_DATA.
constexpr std::int64_t kMiniMallocCapacity = 1 << 20;
inline RangeTable minimalloc_challenging(const std::string& name) {
  const std::string path = std::string(METAMEM_BENCH_DATA) + "/minimalloc-challenging/" + name + ".1048576.csv";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  return read_ranges_csv(in);
}

}  // namespace memonger::testing
