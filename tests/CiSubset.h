// CI runs a subset of the long sweeps, so that a clean clone's tests finish
// in CI's time; METAMEM_FULL_TESTS=1 runs every case (docs/setup.md). A case
// outside the subset is skipped, and says so.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string_view>

namespace metamem::testing {

inline bool full_test_suite() {
  const char* full = std::getenv("METAMEM_FULL_TESTS");
  return full != nullptr && std::string_view(full) == "1";
}

}  // namespace metamem::testing

// A macro: GTEST_SKIP returns from the test body that expands it.
#define METAMEM_SKIP_OUTSIDE_CI_SUBSET(in_subset)                          \
  if (!(in_subset) && !::metamem::testing::full_test_suite())              \
  GTEST_SKIP() << "outside CI's subset of this sweep: METAMEM_FULL_TESTS=1 runs it"
