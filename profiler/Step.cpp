#include "profiler/Step.h"

#include <ATen/Context.h>

#include "profiler/CpuMemoryCounter.h"
#include "profiler/Tracer.h"

namespace metamem {

Trace trace_step(const StepBuilder& build, c10::Device fake_device) {
  Tracer tracer(fake_device);
  std::unique_ptr<TrainingStep> step = build();
  tracer.begin_forward();
  at::Tensor loss = step->forward_loss();
  tracer.begin_backward({loss});
  loss.backward();
  return tracer.finish();
}

namespace {

// oneDNN's convolutions allocate internal reorders and scratchpads that no
// meta kernel can know; the CPU model is libtorch's native convolution.
class NativeCpuConvolution {
 public:
  NativeCpuConvolution() : was_enabled_(at::globalContext().userEnabledMkldnn()) {
    at::globalContext().setUserEnabledMkldnn(false);
  }
  ~NativeCpuConvolution() { at::globalContext().setUserEnabledMkldnn(was_enabled_); }

 private:
  bool was_enabled_;
};

}  // namespace

std::int64_t achieved_cpu_peak(const StepBuilder& build) {
  NativeCpuConvolution native_convolution;
  CpuMemoryCounter counter;
  std::unique_ptr<TrainingStep> step = build();
  counter.reset_peak();
  at::Tensor loss = step->forward_loss();
  loss.backward();
  return counter.peak_bytes();
}

}  // namespace metamem
