// The CPU kernel model (CpuKernelModel.h) of linear algebra: BLAS operand
// copies, LAPACK's factorisations and their workspaces, MKL's FFTs.
#include "meta/CpuKernelModel.h"

#include <ATen/ExpandUtils.h>
#include <ATen/TensorUtils.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <unordered_map>
#include <vector>

#include "meta/LapackWorkspace.h"
#include "meta/TensorBytes.h"

namespace metamem {
namespace {

using Args = c10::ArrayRef<c10::IValue>;

// MKL's FFTs (_exec_fft) put the batch dimensions first, largest stride
// first, and the transformed ones after them in the order given, then
// collapse the batch dimensions into one: the input is copied unless its
// strides allow that view and it has no zero stride (an expanded gradient
// is copied; measured). The output is contiguous in that order and
// permuted back.
struct FftExecution {
  std::int64_t input_copy = 0;
  std::vector<std::int64_t> out_strides;
};

FftExecution mkl_fft(at::IntArrayRef sizes, at::IntArrayRef strides, std::int64_t element_bytes,
                     at::IntArrayRef out_sizes, at::IntArrayRef dim) {
  const std::size_t ndim = sizes.size(), batch_dims = ndim - dim.size();
  // The same partition and sort as the kernel's: equal strides keep its order.
  std::vector<std::int64_t> order(ndim);
  std::iota(order.begin(), order.end(), std::int64_t{0});
  std::vector<bool> transformed(ndim, false);
  for (std::int64_t d : dim) transformed[d] = true;
  const auto batch_end = std::partition(order.begin(), order.end(), [&](std::int64_t d) { return !transformed[d]; });
  std::sort(order.begin(), batch_end, [&](std::int64_t a, std::int64_t b) { return strides[a] > strides[b]; });
  std::copy(dim.begin(), dim.end(), batch_end);

  std::vector<std::int64_t> permuted_sizes, permuted_strides, batched{1}, batched_out{1};
  for (std::size_t i = 0; i < ndim; ++i) {
    permuted_sizes.push_back(sizes[order[i]]);
    permuted_strides.push_back(strides[order[i]]);
    if (i < batch_dims) {
      batched[0] *= sizes[order[i]];
    } else {
      batched.push_back(sizes[order[i]]);
      batched_out.push_back(out_sizes[order[i]]);
    }
  }
  batched_out[0] = batched[0];
  FftExecution result;
  const auto view = at::detail::computeStride(permuted_sizes, permuted_strides, batched);
  if (!view || std::find(view->begin(), view->end(), 0) != view->end())
    result.input_copy = numel(sizes) * element_bytes;

  std::vector<std::int64_t> contiguous(batched_out.size(), 1);
  for (std::size_t i = batched_out.size() - 1; i > 0; --i) contiguous[i - 1] = contiguous[i] * batched_out[i];
  result.out_strides.assign(ndim, 0);
  std::int64_t batch_numel = 1;
  for (std::size_t i = batch_dims; i-- > 0;) {
    result.out_strides[order[i]] = batch_numel * contiguous[0];
    batch_numel *= out_sizes[order[i]];
  }
  for (std::size_t i = batch_dims; i < ndim; ++i) result.out_strides[order[i]] = contiguous[1 + i - batch_dims];
  return result;
}

// The kernels transform in the order of the input's strides, largest first
// (a one-sided transform's last dimension stays last).
std::vector<std::int64_t> fft_order(const at::Tensor& self, std::vector<std::int64_t> dim, bool keep_last) {
  std::sort(dim.begin(), dim.end() - (keep_last ? 1 : 0),
            [&](std::int64_t a, std::int64_t b) { return self.stride(a) > self.stride(b); });
  return dim;
}

std::int64_t fft_r2c(Args args, Args) {
  const at::Tensor& self = args[0].toTensor();
  const std::vector<std::int64_t> dim = args[1].toIntVector();
  std::vector<std::int64_t> out_sizes = self.sizes().vec();
  if (args[3].toBool()) out_sizes[dim.back()] = out_sizes[dim.back()] / 2 + 1;
  return mkl_fft(self.sizes(), self.strides(), element_size(self), out_sizes, fft_order(self, dim, true)).input_copy;
}

std::int64_t fft_c2c(Args args, Args) {
  const at::Tensor& self = args[0].toTensor();
  return mkl_fft(self.sizes(), self.strides(), element_size(self), self.sizes(),
                 fft_order(self, args[1].toIntVector(), false))
      .input_copy;
}

// A transform over several dimensions is a complex one over all but the
// last (its result held to the end, its copy freed before the output is
// made), then the real one over the last.
std::int64_t fft_c2r(Args args, Args returns) {
  const at::Tensor& self = args[0].toTensor();
  std::vector<std::int64_t> dim = args[1].toIntVector();
  std::vector<std::int64_t> out_sizes = self.sizes().vec();
  out_sizes[dim.back()] = args[3].toInt();
  if (dim.size() == 1)
    return mkl_fft(self.sizes(), self.strides(), element_size(self), out_sizes, dim).input_copy;
  const std::int64_t last = dim.back();
  dim.pop_back();
  const FftExecution complex = mkl_fft(self.sizes(), self.strides(), element_size(self), self.sizes(),
                                       fft_order(self, dim, false));
  const FftExecution real = mkl_fft(self.sizes(), complex.out_strides, element_size(self), out_sizes, {last});
  const std::int64_t held = bytes_of(self);
  return std::max(held + complex.input_copy - bytes_of(returns[0].toTensor()), held + real.input_copy);
}

// A triangular solve hands LAPACK the broadcast A as is when it is row or
// column major, and a column-major copy otherwise.
std::int64_t linalg_solve_triangular(Args args, Args) {
  const at::Tensor &A = args[0].toTensor(), &B = args[1].toTensor();
  const at::Tensor broadcast_A = A.expand(
      [&] {
        auto size = at::infer_size(A.sizes().slice(0, A.dim() - 2), B.sizes().slice(0, B.dim() - 2));
        size.push_back(A.size(-2));
        size.push_back(A.size(-1));
        return size;
      }());
  const bool ready = broadcast_A.is_contiguous() || broadcast_A.transpose(-2, -1).is_contiguous();
  return ready ? 0 : bytes_of(broadcast_A);
}

// Determinants come from an LU factorisation (int32 infos per matrix) and
// the permutation's sign: (arange(1, n + 1) != pivots).sum(-1, long) (a
// batch of bool masks beside one int32 arange; the sum reads an int64 copy
// of the masks),
// then fmod_, mul_, add_ with wrapped longs. All in one expression, so its
// temporaries live to its end.
struct Determinant {
  std::int64_t batch, n, element;
  std::int64_t infos() const { return 4 * batch; }
  std::int64_t permutation_sign() const { return 4 * n + n * batch + 8 * batch + std::max<std::int64_t>(8 * n * batch, 8); }
};

Determinant determinant(const at::Tensor& A) {
  std::int64_t batch = 1;
  for (std::int64_t i = 0; i < A.dim() - 2; ++i) batch *= A.size(i);
  return {batch, A.size(-1), element_size(A)};
}

// det = sign * prod(diag(U)): the product first, then the sign, then the
// sign cast to the product's dtype.
std::int64_t linalg_det(Args args, Args) {
  const Determinant d = determinant(args[0].toTensor());
  const std::int64_t product = d.batch * d.element;
  return d.infos() + product + std::max(d.permutation_sign(), 8 * d.batch + d.batch * d.element);
}

// sign = prod(sgn(diag(U))) * permutation sign, then sum(log(abs(diag(U)))).
std::int64_t linalg_slogdet(Args args, Args) {
  const Determinant d = determinant(args[0].toTensor());
  const std::int64_t diagonal = d.n * d.batch * d.element, product = d.batch * d.element;
  return d.infos() + std::max({d.permutation_sign(), 8 * d.batch + diagonal + product + d.batch * d.element, diagonal});
}

// The inverse solves A X = I through an LU factorisation and its pivots
// (int32), then lu_solve's pivot checks; with check_errors, infos.any().
std::int64_t linalg_inv_ex(Args args, Args returns) {
  const Determinant d = determinant(args[0].toTensor());
  if (returns[0].toTensor().numel() == 0) return 0;
  const std::int64_t pivots = d.n * d.batch;
  return d.n * d.n * d.batch * d.element + 4 * pivots +
         std::max(8 + 4 + pivots, args[1].toBool() ? 1 + d.batch : 0);
}

// cholesky_solve solves in column-major copies of B (its result) and of A
// broadcast to the common batch, with int32 infos and their check.
std::int64_t cholesky_solve(Args args, Args returns) {
  const at::Tensor &A = args[1].toTensor(), &X = returns[0].toTensor();
  std::int64_t batch = 1;
  for (std::int64_t i = 0; i < X.dim() - 2; ++i) batch *= X.size(i);
  const std::int64_t n = A.size(-1);
  return batch * n * n * element_size(A) + 4 * batch + 1 + batch;
}

// geqrf factors through one workspace that LAPACK sizes, asked for even
// when there is nothing to factor.
std::int64_t geqrf(Args args, Args) {
  const at::Tensor& A = args[0].toTensor();
  return lapack::geqrf_work(A.scalar_type(), A.size(-2), A.size(-1)) * element_size(A);
}

// linalg_eig of a real matrix checks isfinite(A).all() first ((abs(A) !=
// inf) with a wrapped inf, A == A, their product), before its results
// exist. Then int32 infos, the eigenvalues' real and imaginary parts, a
// column-major copy of A, real eigenvectors when they are computed and
// geev's workspace; after geev, (imaginary parts == 0).all() with a wrapped
// 0.
std::int64_t eig(const at::Tensor& A, bool vectors, std::int64_t results) {
  if (A.is_complex()) return 0;
  const Determinant d = determinant(A);
  const std::int64_t matrices = d.batch * d.n * d.n, parts = 2 * d.n * d.batch * d.element;
  const std::int64_t wrapped_inf = 8 + (d.element == 8 ? 0 : d.element), wrapped_zero = 8 + d.element;
  const std::int64_t finite_check = bytes_of(A) + std::max(matrices + wrapped_inf, 3 * matrices) - results;
  const std::int64_t real_vectors = vectors ? bytes_of(A) : 0;
  const std::int64_t infos = 4 * std::max<std::int64_t>(d.batch, 1);  // one for an empty batch too
  const std::int64_t geev = infos + parts + bytes_of(A) + real_vectors +
                            lapack::geev_work(A.scalar_type(), vectors, d.n) * d.element;
  const std::int64_t real_check = infos + parts + real_vectors + wrapped_zero + d.n * d.batch;
  return std::max({finite_check, geev, real_check});
}

std::int64_t linalg_eig(Args args, Args returns) {
  return eig(args[0].toTensor(), true, bytes_of(returns[0].toTensor()) + bytes_of(returns[1].toTensor()));
}

std::int64_t linalg_eigvals(Args args, Args returns) {
  return eig(args[0].toTensor(), false, bytes_of(returns[0].toTensor()));
}

// householder_product runs orgqr on each matrix of its result through one
// workspace that LAPACK sizes.
std::int64_t linalg_householder_product(Args args, Args returns) {
  const at::Tensor &A = args[0].toTensor(), &tau = args[1].toTensor();
  if (returns[0].toTensor().numel() == 0) return 0;
  return lapack::orgqr_work(A.scalar_type(), A.size(-2), A.size(-1), tau.size(-1)) * element_size(A);
}

// ormqr multiplies a column-major copy of other (its result) by the
// reflectors in a column-major copy of input, through one workspace that
// LAPACK sizes.
std::int64_t ormqr(Args args, Args returns) {
  const at::Tensor &input = args[0].toTensor(), &tau = args[1].toTensor(), &C = returns[0].toTensor();
  return bytes_of(input) + lapack::ormqr_work(input.scalar_type(), args[3].toBool(), args[4].toBool(), C.size(-2), C.size(-1),
                            tau.size(-1)) *
         element_size(input);
}

// linalg_qr: Householder scalars (batch x k), geqrf in Q or R when one has
// A's shape (else in a column-major copy of A), then orgqr for a non-empty
// Q; each asks LAPACK for its workspace, one at a time.
std::int64_t linalg_qr(Args args, Args returns) {
  const at::Tensor &A = args[0].toTensor(), &Q = returns[0].toTensor(), &R = returns[1].toTensor();
  const std::int64_t m = A.size(-2), n = A.size(-1), k = std::min(m, n);
  const bool compute_q = args[1].toStringRef() != "r";
  const Determinant d = determinant(A);
  const std::int64_t tau = d.batch * k * d.element;
  const bool in_place = (compute_q && Q.size(-1) == n) || R.size(-2) == m;
  const std::int64_t geqrf = lapack::geqrf_work(A.scalar_type(), m, n) * d.element;
  const bool orgqr_runs = compute_q && Q.numel() > 0;
  const std::int64_t orgqr = orgqr_runs ? lapack::orgqr_work(A.scalar_type(), m, Q.size(-1), k) * d.element : 0;
  return tau + (in_place ? 0 : bytes_of(A)) + std::max(geqrf, orgqr);
}

// _linalg_eigh: int32 infos, syevd's work and iwork (A copied first when
// no eigenvectors are kept), then the infos check.
std::int64_t linalg_eigh(Args args, Args) {
  const at::Tensor& A = args[0].toTensor();
  if (A.numel() == 0) return 0;
  const bool vectors = args[2].toBool();
  const Determinant d = determinant(A);
  const lapack::EighWork work = lapack::syevd_work(A.scalar_type(), vectors, d.n);
  return (vectors ? 0 : bytes_of(A)) + d.infos() + std::max(work.work * d.element + 4 * work.iwork, 1 + d.batch);
}

// _linalg_svd: int32 infos, a column-major copy of A that gesdd destroys
// (its workspaces are std::vectors, outside the allocator), the check.
std::int64_t linalg_svd(Args args, Args) {
  const at::Tensor& A = args[0].toTensor();
  if (A.numel() == 0) return 0;
  const Determinant d = determinant(A);
  return d.infos() + std::max(bytes_of(A), 1 + d.batch);
}

// Pivots become an int64 permutation through an arange over the m rows,
// expanded over the batch and made contiguous (a copy for more than one
// matrix).
std::int64_t permutation_bytes(std::int64_t m, std::int64_t batch) { return 8 * m + (batch > 1 ? 8 * m * batch : 0); }

// lu_unpack reads contiguous pivots.
std::int64_t lu_unpack(Args args, Args) {
  const at::Tensor &LU = args[0].toTensor(), &pivots = args[1].toTensor();
  if (!args[3].toBool()) return 0;
  std::int64_t batch = 1;
  for (std::int64_t i = 0; i < pivots.dim() - 1; ++i) batch *= pivots.size(i);
  return permutation_bytes(LU.size(-2), batch) + copy_unless_contiguous(pivots);
}

// linalg_lu factors a copy of A beside int32 pivots and infos, then unpacks
// the pivots.
std::int64_t linalg_lu(Args args, Args) {
  const at::Tensor& A = args[0].toTensor();
  const Determinant d = determinant(A);
  const std::int64_t m = A.size(-2), k = std::min(m, A.size(-1));
  return 4 * k * d.batch + d.infos() + std::max(bytes_of(A), permutation_bytes(m, d.batch));
}

// The LDL factorisation asks sytrf for its workspace.
std::int64_t linalg_ldl_factor_ex(Args args, Args) {
  const at::Tensor& A = args[0].toTensor();
  if (A.numel() == 0) return 0;
  const std::int64_t work = lapack::sytrf_work(A.scalar_type(), A.size(-1)) * element_size(A);
  return std::max(work, args[2].toBool() ? 1 + determinant(A).batch : 0);
}

// LAPACK's error codes are checked with infos.any(): a bool result beside
// a bool copy of the int32 codes.
std::int64_t linalg_check_errors(Args args, Args) { return 1 + args[0].toTensor().numel(); }

// Unless there is nothing to solve, the pivots are checked with
// all(pivots > 0) and all(pivots <= n): each a wrapped and cast bound beside
// a bool mask.
std::int64_t linalg_lu_solve(Args args, Args returns) {
  const at::Tensor& pivots = args[1].toTensor();
  if (returns[0].toTensor().numel() == 0) return 0;
  return 8 + element_size(pivots) + pivots.numel();
}

// addmm_impl_cpu_ hands BLAS each matrix as it is when its strides allow it
// (one dimension contiguous, the other's stride at least the leading
// dimension) and a contiguous copy otherwise; a result BLAS cannot write is
// computed in a column-major copy. The copies live until it returns.
std::int64_t blas_copies(at::IntArrayRef result_sizes, at::IntArrayRef result_strides,
                         at::IntArrayRef m1_sizes, at::IntArrayRef m1_strides,
                         at::IntArrayRef m2_sizes, at::IntArrayRef m2_strides,
                         std::int64_t element) {
  if (numel(result_sizes) == 0 || m1_sizes[1] == 0) return 0;
  std::int64_t copies = 0;
  bool transpose_c = false;
  if (result_strides[0] == 1 &&
      (result_sizes[1] == 1 || result_strides[1] >= std::max<std::int64_t>(1, result_sizes[0]))) {
    transpose_c = false;
  } else if (result_strides[1] == 1 &&
             (result_sizes[0] == 1 || result_strides[0] >= std::max<std::int64_t>(1, result_sizes[1]))) {
    transpose_c = true;
    std::swap(m1_sizes, m2_sizes);
    std::swap(m1_strides, m2_strides);
  } else {
    copies += numel(result_sizes) * element;
  }
  const std::size_t row = transpose_c ? 1 : 0, column = transpose_c ? 0 : 1;
  const std::int64_t m = result_sizes[row], n = result_sizes[column], k = m1_sizes[column];
  // Usable as is, untransposed (leading dimension `plain`) or transposed (`transposed`).
  auto usable = [&](at::IntArrayRef strides, std::int64_t plain, std::int64_t transposed) {
    return (strides[row] == 1 && strides[column] >= std::max<std::int64_t>(1, plain)) ||
           (strides[column] == 1 && strides[row] >= std::max<std::int64_t>(1, transposed));
  };
  if (!usable(m1_strides, m, k)) copies += numel(m1_sizes) * element;
  if (!usable(m2_strides, k, n)) copies += numel(m2_sizes) * element;
  return copies;
}

std::int64_t blas_copies(const at::Tensor& result, const at::Tensor& m1, const at::Tensor& m2) {
  return blas_copies(result.sizes(), result.strides(), m1.sizes(), m1.strides(), m2.sizes(),
                     m2.strides(), element_size(m1));
}

// gemv takes the matrix as is when one of its dimensions is contiguous
// with a usable leading dimension, and a contiguous copy otherwise.
std::int64_t addmv(Args args, Args returns) {
  const at::Tensor &mat = args[1].toTensor(), &result = returns[0].toTensor();
  if (mat.numel() == 0 || result.numel() == 0) return 0;
  auto lda_ok = [](std::int64_t m, std::int64_t n, std::int64_t lda) {
    return n == 1 || lda >= std::max<std::int64_t>(1, m);
  };
  const bool usable = (mat.stride(0) == 1 && lda_ok(mat.size(0), mat.size(1), mat.stride(1))) ||
                      (mat.stride(1) == 1 && lda_ok(mat.size(1), mat.size(0), mat.stride(0)));
  return usable ? 0 : bytes_of(mat);
}

std::int64_t mm(Args args, Args returns) {
  return blas_copies(returns[0].toTensor(), args[0].toTensor(), args[1].toTensor());
}

std::int64_t addmm(Args args, Args returns) {
  return blas_copies(returns[0].toTensor(), args[1].toTensor(), args[2].toTensor());
}

// Without MKL, batched products below 400 multiply-adds per matrix run a
// plain loop; larger ones call addmm_impl_cpu_ one batch item at a time, so
// one item's copies are live at once.
std::int64_t batched(const at::Tensor& result, const at::Tensor& b1, const at::Tensor& b2) {
  if (b1.size(0) == 0 || b1.size(2) * b1.size(1) * b2.size(2) < 400) return 0;
  return blas_copies(result.sizes().slice(1), result.strides().slice(1), b1.sizes().slice(1),
                     b1.strides().slice(1), b2.sizes().slice(1), b2.strides().slice(1),
                     element_size(b1));
}

std::int64_t bmm(Args args, Args returns) {
  return batched(returns[0].toTensor(), args[0].toTensor(), args[1].toTensor());
}

std::int64_t baddbmm(Args args, Args returns) {
  return batched(returns[0].toTensor(), args[1].toTensor(), args[2].toTensor());
}

}  // namespace

ScratchModel cpu_linalg_scratch_model(const std::string& qualified_name) {
  static const std::unordered_map<std::string, ScratchModel> models = {
      {"aten::_fft_r2c", &fft_r2c},
      {"aten::_fft_c2c", &fft_c2c},
      {"aten::_fft_c2r", &fft_c2r},
      {"aten::linalg_solve_triangular", &linalg_solve_triangular},
      {"aten::addmv", &addmv},
      {"aten::addmv_", &addmv},
      {"aten::_linalg_check_errors", &linalg_check_errors},
      {"aten::_linalg_det", &linalg_det},
      {"aten::linalg_qr", &linalg_qr},
      {"aten::linalg_eig", &linalg_eig},
      {"aten::_linalg_eigvals", &linalg_eigvals},
      {"aten::geqrf", &geqrf},
      {"aten::ormqr", &ormqr},
      {"aten::cholesky_solve", &cholesky_solve},
      {"aten::linalg_householder_product", &linalg_householder_product},
      {"aten::_linalg_eigh", &linalg_eigh},
      {"aten::_linalg_svd", &linalg_svd},
      {"aten::lu_unpack", &lu_unpack},
      {"aten::linalg_lu", &linalg_lu},
      {"aten::linalg_ldl_factor_ex", &linalg_ldl_factor_ex},
      {"aten::linalg_inv_ex", &linalg_inv_ex},
      {"aten::_linalg_slogdet", &linalg_slogdet},
      {"aten::linalg_lu_solve", &linalg_lu_solve},
      {"aten::mm", &mm},
      {"aten::addmm", &addmm},
      {"aten::addmm_", &addmm},
      {"aten::bmm", &bmm},
      {"aten::baddbmm", &baddbmm},
      {"aten::baddbmm_", &baddbmm},
  };
  const auto it = models.find(qualified_name);
  return it == models.end() ? nullptr : it->second;
}

}  // namespace metamem
