// cuBLAS's workspace on a fake CUDA device. torch 2.x allocates it through
// the caching allocator at the first cuBLAS call of a handle on a stream
// and keeps it for the process. Each host thread has a handle of its own
// (autograd's device thread, where backward runs, too), so each thread
// makes one per stream; cuBLASLt shares it (measured from the pinned wheel
// on the fake GPU, tests/python/real_torch_on_fake_gpu.py, which matched a
// real H200 once its cuBLAS handles were distinct).
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string_view>

namespace metamem {

// The bytes torch asks for on a GPU of compute capability major.minor: as
// CUBLAS_WORKSPACE_CONFIG's ":SIZE:COUNT" pairs say (SIZE in KiB), else
// 32 MiB on sm90 and 8 MiB + 128 KiB elsewhere (CublasHandlePool.cpp).
std::int64_t cublas_workspace_bytes(int major, int minor);

// Whether a call of op `name` ("aten::addmm", any overload) calls cuBLAS
// on CUDA, from its arguments; nullptr where the op never does.
using CublasCall = bool (*)(c10::ArrayRef<c10::IValue> arguments);
CublasCall cublas_call(std::string_view name);

}  // namespace metamem
