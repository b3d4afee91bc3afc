// What LAPACK asks for as workspace: libtorch's CPU linear algebra queries
// it (lwork = -1) and allocates it through the CPU allocator, so the CPU
// model asks the same library the same question. Sizes are in elements of
// the matrix's dtype (work) or int32 (iwork); float and double only.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace metamem::lapack {

std::int64_t geqrf_work(c10::ScalarType dtype, std::int64_t m, std::int64_t n);
std::int64_t orgqr_work(c10::ScalarType dtype, std::int64_t m, std::int64_t n, std::int64_t k);
std::int64_t ormqr_work(c10::ScalarType dtype, bool left, bool transpose, std::int64_t m, std::int64_t n,
                        std::int64_t k);
std::int64_t sytrf_work(c10::ScalarType dtype, std::int64_t n);
std::int64_t geev_work(c10::ScalarType dtype, bool vectors, std::int64_t n);

struct EighWork {
  std::int64_t work = 0, iwork = 0;
};
EighWork syevd_work(c10::ScalarType dtype, bool vectors, std::int64_t n);

}  // namespace metamem::lapack
