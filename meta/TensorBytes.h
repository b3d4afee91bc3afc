// What a tensor's or a shape's elements take, in bytes: what every model of
// a kernel's temporaries is made of.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>

namespace metamem {

inline std::int64_t element_size(const at::Tensor& t) { return static_cast<std::int64_t>(t.element_size()); }

// None for an undefined tensor.
inline std::int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * element_size(t) : 0; }

inline std::int64_t numel(at::IntArrayRef sizes) {
  std::int64_t n = 1;
  for (const std::int64_t size : sizes) n *= size;
  return n;
}

}  // namespace metamem
