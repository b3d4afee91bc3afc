// The GPU table fake CUDA answers from.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "estimator/Gpu.h"
#include "estimator/GpuMemory.h"

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

constexpr std::int64_t MiB = 1024 * 1024;

// The context's stack is 1 KiB for every thread the SMs can hold: 216 MiB
// on an A100's 108 SMs of 2048 threads, as NVIDIA's forums state it.
TEST(GpuMemory, TheContextHoldsAStackPerResidentThreadAndTheDriver) {
  EXPECT_EQ(cuda_context_bytes(find_gpu("A100-80GB")), 216 * MiB + 213 * MiB);
  EXPECT_EQ(cuda_context_bytes(find_gpu("H100-80GB")), 264 * MiB + 213 * MiB);
  EXPECT_EQ(cuda_context_bytes(find_gpu("T4")), 40 * MiB + 213 * MiB);
}

TEST(GpuMemory, TheAllocatorHasWhatTheContextAndNcclLeave) {
  const GpuSpec& h100 = find_gpu("H100-80GB");
  const GpuMemory alone = gpu_memory(h100, h100.total_memory);
  ASSERT_EQ(alone.beside_allocator.size(), 1u);
  EXPECT_EQ(alone.beside_allocator[0].what, "CUDA context");
  EXPECT_EQ(alone.allocator_bytes(), h100.total_memory - cuda_context_bytes(h100));
  // Per communicator: 32 ring channels of a 4 MiB simple buffer, 512 KiB of LL and 4.6875 MiB of LL128.
  EXPECT_EQ(nccl_communicator_bytes(h100), 32 * (4 * MiB + 512 * 1024 + 4'915'200));
  const GpuMemory two_groups = gpu_memory(h100, 80LL << 30, {.nccl_communicators = 2});
  ASSERT_EQ(two_groups.beside_allocator.size(), 2u);
  EXPECT_EQ(two_groups.beside_allocator[1].bytes, 2 * nccl_communicator_bytes(h100));
  EXPECT_EQ(two_groups.allocator_bytes(), (80LL << 30) - cuda_context_bytes(h100) - 2 * nccl_communicator_bytes(h100));
}

TEST(GpuMemory, MeasuredFiguresReplaceTheEstimates) {
  const GpuSpec& a100 = find_gpu("A100-40GB");
  const GpuMemory given = gpu_memory(a100, a100.total_memory,
                                     {.nccl_communicators = 1, .cuda_context = 500 * MiB, .nccl_buffers = 0});
  EXPECT_EQ(given.beside_allocator[0].basis, "as given");
  EXPECT_EQ(given.allocator_bytes(), a100.total_memory - 500 * MiB);
}

TEST(GpuMemory, MemoryTheContextFillsIsAnError) {
  try {
    gpu_memory(find_gpu("T4"), 200 * MiB);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "200.00 MiB of T4 leaves nothing to the CUDA caching allocator beside CUDA context 253.00 MiB");
  }
}

}  // namespace
}  // namespace metamem
