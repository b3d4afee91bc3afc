// The GPU table fake CUDA answers from.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "estimator/Gpu.h"

namespace metamem {
namespace {

TEST(Gpu, DefaultIsH100AndKeysIgnoreCase) {
  EXPECT_EQ(known_gpus().front().key, "H100-80GB");
  const GpuSpec& h100 = find_gpu("h100-80gb");
  EXPECT_EQ(h100.name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(h100.major * 10 + h100.minor, 90);
  EXPECT_EQ(h100.total_memory, 81559LL * 1024 * 1024);
  EXPECT_EQ(find_gpu("A100-40GB").multi_processor_count, 108);
}

TEST(Gpu, UnknownNameListsTheKnownOnes) {
  try {
    find_gpu("H800");
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("unknown GPU 'H800'; known: H100-80GB, H200, A100-80GB", 0), 0u);
  }
}

}  // namespace
}  // namespace metamem
