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

enum class Check { None, SameDevice, Pointwise };

Check check_of(const c10::OperatorHandle& op) {
  const c10::OperatorName& name = op.operator_name();
  const std::string key = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_same_device.count(key)) return Check::SameDevice;
  if (g_pointwise.count(key)) return Check::Pointwise;
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

}  // namespace

void set_device_checks(const std::vector<std::string>& same_device, const std::vector<std::string>& pointwise) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_same_device = {same_device.begin(), same_device.end()};
  g_pointwise = {pointwise.begin(), pointwise.end()};
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
