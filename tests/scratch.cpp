#include <cstdio>
#include <cstdlib>
#include <string>
#include "examples/zoo/Zoo.h"
#include <chrono>
int main(int argc, char** argv) {
  metamem::ZooConfig c; c.model = argv[1]; c.batch = atoi(argv[2]);
  if (argc > 3) { c.image = atoi(argv[3]); c.seq = atoi(argv[3]); }
  if (argc > 4) { c.layers = 2; c.width = 64; c.heads = 4; c.vocab = 100; }
  auto b = metamem::zoo_step(c);
  auto t0 = std::chrono::steady_clock::now();
  auto tr = metamem::trace_step(b, c10::Device(c10::kCPU));
  auto t1 = std::chrono::steady_clock::now();
  std::printf("ops %zu peak %ld saved %ld (%.1f ms)\n", tr.ops.size(), tr.peak_bytes, tr.saved_for_backward_bytes(), std::chrono::duration<double, std::milli>(t1-t0).count());
  auto tc = metamem::trace_step(b, c10::Device(c10::kCUDA));
  std::printf("cuda ops %zu peak %ld\n", tc.ops.size(), tc.peak_bytes);
  long a = metamem::achieved_cpu_peak(b);
  std::printf("achieved %ld  diff %ld\n", a, a - tr.peak_bytes);
}
