#include "meta/CublasWorkspace.h"

#include <array>
#include <cstdlib>
#include <regex>
#include <string>

namespace metamem {

std::int64_t cublas_workspace_bytes(int major, int minor) {
  const std::int64_t default_bytes = major == 9 && minor == 0 ? 4096 * 8 * 1024 : 4096 * 1024 * 2 + 16 * 1024 * 8;
  const char* config = std::getenv("CUBLAS_WORKSPACE_CONFIG");
  if (config == nullptr) return default_bytes;
  // torch sums every ":SIZE:COUNT" and takes its default where there is none.
  static const std::regex pair(":([0-9]+):([0-9]+)");
  const std::string text(config);
  std::int64_t bytes = 0;
  bool any = false;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), pair); it != std::sregex_iterator(); ++it) {
    bytes += std::stoll((*it)[1].str()) * 1024 * std::stoll((*it)[2].str());
    any = true;
  }
  return any ? bytes : default_bytes;
}

namespace {

bool always(c10::ArrayRef<c10::IValue>) { return true; }

// torch's own CUDA convolutions (a fake cuda device has no cuDNN): depthwise
// ones run kernels of their own; every other one, transposed, dilated or
// grouped, multiplies im2col columns through cuBLAS (select_conv_backend;
// a 1d convolution is viewed as 2d first).
bool native_convolution_multiplies(const at::Tensor& input, const at::Tensor& weight, bool transposed,
                                   std::int64_t groups) {
  if (input.numel() == 0) return false;
  const bool depthwise = !transposed && input.dim() >= 3 && input.dim() <= 5 && groups > 1 &&
                         input.size(1) == groups && weight.size(0) % input.size(1) == 0;
  return !depthwise;
}

// convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
bool convolution(c10::ArrayRef<c10::IValue> args) {
  return native_convolution_multiplies(args[0].toTensor(), args[1].toTensor(), args[6].toBool(), args[8].toInt());
}

// convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
// output_padding, groups, output_mask)
bool convolution_backward(c10::ArrayRef<c10::IValue> args) {
  return native_convolution_multiplies(args[1].toTensor(), args[2].toTensor(), args[7].toBool(), args[9].toInt());
}

}  // namespace

CublasCall cublas_call(std::string_view name) {
  // The BLAS products libtorch's CUDA kernels hand to cuBLAS or cuBLASLt;
  // matmul, linear and SDPA's math path reach them through these.
  static constexpr std::array<std::string_view, 12> kProducts = {
      "aten::mm",  "aten::addmm", "aten::_addmm_activation", "aten::bmm",       "aten::baddbmm", "aten::addbmm",
      "aten::mv",  "aten::addmv", "aten::dot",               "aten::vdot",      "aten::_scaled_mm", "aten::_int_mm"};
  for (std::string_view op : kProducts)
    if (op == name) return &always;
  if (name == "aten::convolution") return &convolution;
  if (name == "aten::convolution_backward") return &convolution_backward;
  return nullptr;
}

}  // namespace metamem
