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

bool calls_cublas(std::string_view name) {
  // The BLAS products libtorch's CUDA kernels hand to cuBLAS or cuBLASLt;
  // matmul, linear and SDPA's math path reach them through these.
  static constexpr std::array<std::string_view, 12> kOps = {
      "aten::mm",  "aten::addmm", "aten::_addmm_activation", "aten::bmm",       "aten::baddbmm", "aten::addbmm",
      "aten::mv",  "aten::addmv", "aten::dot",               "aten::vdot",      "aten::_scaled_mm", "aten::_int_mm"};
  for (std::string_view op : kOps)
    if (op == name) return true;
  return false;
}

}  // namespace metamem
