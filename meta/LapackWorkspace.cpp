#include "meta/LapackWorkspace.h"

#include <algorithm>
#include <cmath>
#include <limits>

// The LAPACK libtorch itself calls: the one linked into libtorch_cpu (MKL's in
// the wheel), which exports these symbols.
extern "C" {
void sgeqrf_(const int* m, const int* n, float* a, const int* lda, float* tau, float* work, const int* lwork, int* info);
void dgeqrf_(const int* m, const int* n, double* a, const int* lda, double* tau, double* work, const int* lwork, int* info);
void sorgqr_(const int* m, const int* n, const int* k, float* a, const int* lda, const float* tau, float* work,
             const int* lwork, int* info);
void dorgqr_(const int* m, const int* n, const int* k, double* a, const int* lda, const double* tau, double* work,
             const int* lwork, int* info);
void sormqr_(const char* side, const char* trans, const int* m, const int* n, const int* k, const float* a,
             const int* lda, const float* tau, float* c, const int* ldc, float* work, const int* lwork, int* info);
void dormqr_(const char* side, const char* trans, const int* m, const int* n, const int* k, const double* a,
             const int* lda, const double* tau, double* c, const int* ldc, double* work, const int* lwork, int* info);
void sgeev_(const char* jobvl, const char* jobvr, const int* n, float* a, const int* lda, float* wr, float* wi,
            float* vl, const int* ldvl, float* vr, const int* ldvr, float* work, const int* lwork, int* info);
void dgeev_(const char* jobvl, const char* jobvr, const int* n, double* a, const int* lda, double* wr, double* wi,
            double* vl, const int* ldvl, double* vr, const int* ldvr, double* work, const int* lwork, int* info);
void ssytrf_(const char* uplo, const int* n, float* a, const int* lda, int* ipiv, float* work, const int* lwork,
             int* info);
void dsytrf_(const char* uplo, const int* n, double* a, const int* lda, int* ipiv, double* work, const int* lwork,
             int* info);
void ssyevd_(const char* jobz, const char* uplo, const int* n, float* a, const int* lda, float* w, float* work,
             const int* lwork, int* iwork, const int* liwork, int* info);
void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w, double* work,
             const int* lwork, int* iwork, const int* liwork, int* info);
}

namespace metamem::lapack {
namespace {

constexpr int kQuery = -1;

// libtorch reads the optimal size LAPACK reports one ULP up, so that a size
// the floating-point answer rounded down is not short (pytorch#145801):
// max(1, ceil(nextafter(size))), one element more for an exact size. For
// QR at least one element per column.
template <class T>
std::int64_t at_least_one(T size) {
  const T up = std::nextafter(size, std::numeric_limits<T>::infinity());
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(up)));
}
template <class T>
std::int64_t at_least_n(T size, std::int64_t n) { return std::max(at_least_one(size), n); }
// LDL's factorization and ormqr still take the size as reported.
std::int64_t as_reported(double size) { return std::max<std::int64_t>(1, static_cast<std::int64_t>(size)); }

}  // namespace

std::int64_t geqrf_work(c10::ScalarType dtype, std::int64_t m, std::int64_t n) {
  const int m_ = static_cast<int>(m), n_ = static_cast<int>(n), lda = std::max(1, m_);
  int info = 0;
  if (dtype == c10::kFloat) {
    float size = 0;
    sgeqrf_(&m_, &n_, nullptr, &lda, nullptr, &size, &kQuery, &info);
    return at_least_n(size, n);
  }
  if (dtype == c10::kDouble) {
    double size = 0;
    dgeqrf_(&m_, &n_, nullptr, &lda, nullptr, &size, &kQuery, &info);
    return at_least_n(size, n);
  }
  return 0;
}

std::int64_t orgqr_work(c10::ScalarType dtype, std::int64_t m, std::int64_t n, std::int64_t k) {
  const int m_ = static_cast<int>(m), n_ = static_cast<int>(n), k_ = static_cast<int>(k), lda = std::max(1, m_);
  int info = 0;
  if (dtype == c10::kFloat) {
    float size = 0;
    sorgqr_(&m_, &n_, &k_, nullptr, &lda, nullptr, &size, &kQuery, &info);
    return at_least_n(size, n);
  }
  if (dtype == c10::kDouble) {
    double size = 0;
    dorgqr_(&m_, &n_, &k_, nullptr, &lda, nullptr, &size, &kQuery, &info);
    return at_least_n(size, n);
  }
  return 0;
}

std::int64_t sytrf_work(c10::ScalarType dtype, std::int64_t n) {
  const int n_ = static_cast<int>(n), lda = std::max(1, n_);
  const char uplo = 'L';
  int info = 0;
  if (dtype == c10::kFloat) {
    float size = 0;
    ssytrf_(&uplo, &n_, nullptr, &lda, nullptr, &size, &kQuery, &info);
    return as_reported(size);
  }
  if (dtype == c10::kDouble) {
    double size = 0;
    dsytrf_(&uplo, &n_, nullptr, &lda, nullptr, &size, &kQuery, &info);
    return as_reported(size);
  }
  return 0;
}

std::int64_t ormqr_work(c10::ScalarType dtype, bool left, bool transpose, std::int64_t m, std::int64_t n,
                        std::int64_t k) {
  const int m_ = static_cast<int>(m), n_ = static_cast<int>(n), k_ = static_cast<int>(k);
  const int lda = std::max(1, left ? m_ : n_), ldc = std::max(1, m_);
  const char side = left ? 'L' : 'R', trans = transpose ? 'T' : 'N';
  int info = 0;
  if (dtype == c10::kFloat) {
    float size = 0;
    sormqr_(&side, &trans, &m_, &n_, &k_, nullptr, &lda, nullptr, nullptr, &ldc, &size, &kQuery, &info);
    return as_reported(size);
  }
  if (dtype == c10::kDouble) {
    double size = 0;
    dormqr_(&side, &trans, &m_, &n_, &k_, nullptr, &lda, nullptr, nullptr, &ldc, &size, &kQuery, &info);
    return as_reported(size);
  }
  return 0;
}

std::int64_t geev_work(c10::ScalarType dtype, bool vectors, std::int64_t n) {
  const int n_ = static_cast<int>(n), lda = std::max(1, n_), ldvl = 1, ldvr = vectors ? lda : 1;
  const char jobvl = 'N', jobvr = vectors ? 'V' : 'N';
  int info = 0;
  if (dtype == c10::kFloat) {
    float size = 0;
    sgeev_(&jobvl, &jobvr, &n_, nullptr, &lda, nullptr, nullptr, nullptr, &ldvl, nullptr, &ldvr, &size, &kQuery,
           &info);
    return at_least_one(size);
  }
  if (dtype == c10::kDouble) {
    double size = 0;
    dgeev_(&jobvl, &jobvr, &n_, nullptr, &lda, nullptr, nullptr, nullptr, &ldvl, nullptr, &ldvr, &size, &kQuery,
           &info);
    return at_least_one(size);
  }
  return 0;
}

EighWork syevd_work(c10::ScalarType dtype, bool vectors, std::int64_t n) {
  const int n_ = static_cast<int>(n), lda = std::max(1, n_);
  const char jobz = vectors ? 'V' : 'N', uplo = 'L';
  int info = 0, iwork = 0;
  if (dtype == c10::kFloat) {
    float work = 0;
    ssyevd_(&jobz, &uplo, &n_, nullptr, &lda, nullptr, &work, &kQuery, &iwork, &kQuery, &info);
    return {at_least_one(work), std::max(1, iwork)};
  }
  if (dtype == c10::kDouble) {
    double work = 0;
    dsyevd_(&jobz, &uplo, &n_, nullptr, &lda, nullptr, &work, &kQuery, &iwork, &kQuery, &info);
    return {at_least_one(work), std::max(1, iwork)};
  }
  return {};
}

}  // namespace metamem::lapack
