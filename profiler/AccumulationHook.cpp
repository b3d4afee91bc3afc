#include "profiler/AccumulationHook.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace metamem {
namespace {

class CallAfter final : public torch::autograd::FunctionPostHook {
 public:
  explicit CallAfter(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

}  // namespace

c10::intrusive_ptr<torch::autograd::Node> after_accumulation(const at::Tensor& param, std::function<void()> fn) {
  auto accumulator = torch::autograd::impl::grad_accumulator(param);
  if (accumulator) accumulator->add_post_hook(std::make_unique<CallAfter>(std::move(fn)));
  return accumulator;
}

}  // namespace metamem
