#include "profiler/Step.h"

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

std::int64_t achieved_cpu_peak(const StepBuilder& build) {
  CpuMemoryCounter counter;
  std::unique_ptr<TrainingStep> step = build();
  counter.reset_peak();
  at::Tensor loss = step->forward_loss();
  loss.backward();
  return counter.peak_bytes();
}

}  // namespace metamem
