#include "meta/DeviceCheck.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "meta/TensorArguments.h"

namespace metamem {
namespace {

std::mutex g_mutex;
std::unordered_set<std::string> g_same_device;  // guarded by g_mutex
std::unordered_set<std::string> g_pointwise;    // guarded by g_mutex
std::unordered_set<std::string> g_values;       // guarded by g_mutex

enum class Check { None, SameDevice, Pointwise, Values };

Check check_of(const c10::OperatorHandle& op) {
  const c10::OperatorName& name = op.operator_name();
  const std::string key = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_same_device.count(key)) return Check::SameDevice;
  if (g_pointwise.count(key)) return Check::Pointwise;
  if (g_values.count(key)) return Check::Values;
  return Check::None;
}

[[noreturn]] void refuse(c10::Device first, c10::Device other, const std::string& argument,
                         const c10::OperatorHandle& op) {
  std::string message = "Expected all tensors to be on the same device, but found at least two devices, " +
                        first.str() + " and " + other.str() + "!";
  if (!argument.empty())
    message += " (when checking argument for argument " + argument + " in method " + op.schema().name() + ")";
  TORCH_CHECK(false, message);
}

// index_put's: its indices may lie anywhere; its values on self's device,
// or on the host as a 0-dim scalar. With `accumulate` the CUDA kernel
// (index_put_with_sort_) says so in words of its own.
void check_values(const c10::OperatorHandle& op, const torch::jit::Stack& stack, std::size_t first) {
  const c10::FunctionSchema& schema = op.schema();
  const at::Tensor& self = stack[first + *schema.argumentIndexWithName("self")].toTensor();
  const at::Tensor& values = stack[first + *schema.argumentIndexWithName("values")].toTensor();
  if (values.device() == self.device() || (values.device().is_cpu() && values.dim() == 0)) return;
  const std::optional<int> accumulate = schema.argumentIndexWithName("accumulate");
  TORCH_CHECK(!accumulate || !stack[first + *accumulate].toBool(), "expected device ", self.device(),
              " but got device ", values.device(), " for value tensor");
  refuse(self.device(), values.device(), "", op);
}

}  // namespace

void set_device_checks(const std::vector<std::string>& same_device, const std::vector<std::string>& pointwise,
                       const std::vector<std::string>& values) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_same_device = {same_device.begin(), same_device.end()};
  g_pointwise = {pointwise.begin(), pointwise.end()};
  g_values = {values.begin(), values.end()};
}

void check_devices(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& arguments = op.schema().arguments();
  const std::size_t first = stack.size() - arguments.size();
  // Calls f(argument's name, tensor) on each tensor torch checks: those of
  // the positional arguments and the outputs.
  const auto for_each_checked = [&](auto&& f) {
    for (std::size_t i = 0; i < arguments.size(); ++i)
      if (!arguments[i].kwarg_only() || arguments[i].is_out())
        for_each_tensor(stack[first + i], [&](const at::Tensor& t) {
          if (t.defined()) f(arguments[i].name(), t);
        });
  };
  bool host = false, device = false;
  for_each_checked([&](const std::string&, const at::Tensor& t) { (t.device().is_cpu() ? host : device) = true; });
  if (!host || !device) return;
  const Check check = check_of(op);
  if (check == Check::None) return;
  if (check == Check::Values) return check_values(op, stack, first);
  std::optional<c10::Device> common;
  for_each_checked([&](const std::string& argument, const at::Tensor& t) {
    // TensorIterator moves a 0-dim host tensor to the device, as a scalar.
    if (check == Check::Pointwise && t.device().is_cpu() && t.dim() == 0) return;
    if (!common) {
      common = t.device();
    } else if (*common != t.device()) {
      refuse(*common, t.device(), check == Check::SameDevice ? argument : "", op);
    }
  });
}

}  // namespace metamem
