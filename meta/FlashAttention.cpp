#include "meta/FlashAttention.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/sum.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>
#include <tuple>
#include <vector>

#include "meta/CpuKernelModel.h"
#include "meta/MetaMode.h"

namespace metamem {
namespace {

using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

struct Dims {
  std::int64_t batch, seq_q, seq_k, heads, kv_heads, head_dim;
  std::int64_t group() const { return heads / kv_heads; }
};

Dims check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "metamem::flash_attention: q, k and v must be (batch, seq, heads, head_dim)");
  const Dims d{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3)};
  TORCH_CHECK(k.size(0) == d.batch && v.size(0) == d.batch && v.size(1) == d.seq_k && v.size(2) == d.kv_heads,
              "metamem::flash_attention: k and v must have q's batch and the same sequence and heads");
  TORCH_CHECK(k.size(3) == d.head_dim && v.size(3) == d.head_dim,
              "metamem::flash_attention: q, k and v must have the same head_dim");
  TORCH_CHECK(d.kv_heads > 0 && d.heads % d.kv_heads == 0,
              "metamem::flash_attention: q's heads must be a multiple of k's and v's");
  TORCH_CHECK(d.head_dim <= 256, "metamem::flash_attention: head_dim must be at most 256, as in FlashAttention-2");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "metamem::flash_attention: q, k and v must have the same dtype");
  TORCH_CHECK(q.stride(-1) == 1 && k.stride(-1) == 1 && v.stride(-1) == 1,
              "metamem::flash_attention: q, k and v must have a contiguous last dimension");
  if (meta_mode_active() && fake_device().is_cuda()) {
    TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16,
                "metamem::flash_attention: FlashAttention-2 runs f16 and bf16 only, not ", q.scalar_type(),
                " (use --dtype or --amp f16|bf16)");
    TORCH_CHECK(d.head_dim % 8 == 0, "metamem::flash_attention: head_dim must be a multiple of 8 on cuda");
  }
  return d;
}

std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

// mha_fwd: the output in q's layout and dtype, the fp32 log-sum-exp per
// head and query row, and the RNG state (seed, offset) backward replays.
Outputs forward_outputs(const Dims& d, const at::Tensor& q) {
  return {at::empty({d.batch, d.seq_q, d.heads, d.head_dim}, q.options()),
          at::empty({d.batch, d.heads, d.seq_q}, q.options().dtype(at::kFloat)),
          at::empty({2}, q.options().dtype(at::kLong))};
}

// What mha_bwd holds beside dq, dk and dv: the fp32 dot products of each
// output row with its gradient, the fp32 dq accumulator (rows rounded up to
// the kernel's 128, head_dim to `width`), and for grouped-query heads dk and
// dv per query head, summed into dk and dv at the end.
struct BackwardScratch {
  std::vector<std::int64_t> row_dots, dq_accum, expanded;  // expanded: empty without grouping
};

BackwardScratch backward_scratch(const Dims& d, std::int64_t width) {
  const std::int64_t rows = round_up(d.seq_q, 128);
  BackwardScratch s{{d.batch, d.heads, rows}, {d.batch, rows, d.heads, width}, {}};
  if (d.group() > 1) s.expanded = {d.batch, d.seq_k, d.heads, d.head_dim};
  return s;
}

// Dao's FlashAttention-2 (2.3) rounds head_dim to 32, or to 256 above 192.
std::int64_t dao_width(std::int64_t head_dim) { return head_dim <= 192 ? round_up(head_dim, 32) : 256; }

// Its buffers' bytes in the order mha_bwd allocates them.
c10::SmallVector<std::int64_t, 4> scratch_pieces(const BackwardScratch& s, std::int64_t element_size) {
  c10::SmallVector<std::int64_t, 4> pieces{c10::multiply_integers(s.row_dots) * 4,
                                           c10::multiply_integers(s.dq_accum) * 4};
  if (!s.expanded.empty()) pieces.append(2, c10::multiply_integers(s.expanded) * element_size);
  return pieces;
}

// Keys a query row may see: all, or under a causal mask aligned to the
// bottom right, those up to its own position counted from the end.
std::int64_t visible_keys(std::int64_t seq_q, std::int64_t seq_k, bool causal, std::int64_t row) {
  return causal ? std::clamp<std::int64_t>(row + seq_k - seq_q + 1, 0, seq_k) : seq_k;
}

// A score's place among all of the call's, for dropout's decision.
std::uint64_t score_index(const Dims& d, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  return static_cast<std::uint64_t>(((b * d.heads + h) * d.seq_q + i) * d.seq_k + j);
}

// Dropout's decision for one score, a hash of the call's seed and the
// score's index: forward and backward agree (FlashAttention's Philox stream
// is not reproduced; no test reads the values it drops).
float keep_scale(std::uint64_t seed, std::uint64_t index, double dropout_p) {
  if (dropout_p == 0) return 1.0f;
  std::uint64_t x = seed + 0x9E3779B97F4A7C15ull * (index + 1);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  const double uniform = static_cast<double>(x >> 11) * 0x1.0p-53;
  return uniform < dropout_p ? 0.0f : static_cast<float>(1.0 / (1.0 - dropout_p));
}

template <class T, class U>
float dot(const T& a, const U& b, std::int64_t n) {
  float sum = 0;
  for (std::int64_t e = 0; e < n; ++e) sum += static_cast<float>(a[e]) * static_cast<float>(b[e]);
  return sum;
}

template <class T>
void forward_cpu(const Dims& d, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out,
                 at::Tensor& lse, std::uint64_t seed, double dropout_p, bool causal, double scale) {
  const auto Q = q.accessor<T, 4>(), K = k.accessor<T, 4>(), V = v.accessor<T, 4>();
  auto O = out.accessor<T, 4>();
  auto L = lse.accessor<float, 3>();
  at::parallel_for(0, d.batch * d.heads, 1, [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> p(d.seq_k), acc(d.head_dim);
    for (std::int64_t bh = begin; bh < end; ++bh) {
      const std::int64_t b = bh / d.heads, h = bh % d.heads, kv = h / d.group();
      for (std::int64_t i = 0; i < d.seq_q; ++i) {
        const std::int64_t n = visible_keys(d.seq_q, d.seq_k, causal, i);
        float top = -std::numeric_limits<float>::infinity(), sum = 0;
        for (std::int64_t j = 0; j < n; ++j) {
          p[j] = static_cast<float>(scale) * dot(Q[b][i][h], K[b][j][kv], d.head_dim);
          top = std::max(top, p[j]);
        }
        for (std::int64_t j = 0; j < n; ++j) sum += p[j] = std::exp(p[j] - top);
        L[b][h][i] = n == 0 ? -std::numeric_limits<float>::infinity() : top + std::log(sum);
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (std::int64_t j = 0; j < n; ++j) {
          const float w = p[j] / sum * keep_scale(seed, score_index(d, b, h, i, j), dropout_p);
          for (std::int64_t e = 0; e < d.head_dim; ++e) acc[e] += w * static_cast<float>(V[b][j][kv][e]);
        }
        for (std::int64_t e = 0; e < d.head_dim; ++e) O[b][i][h][e] = static_cast<T>(acc[e]);
      }
    }
  });
}

// FlashAttention-2's backward, one (batch, head) at a time: rebuilds each
// probability from the log-sum-exp, accumulates dq in the fp32 buffer and dk,
// dv per query head.
template <class T>
void backward_cpu(const Dims& d, const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                  const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, std::uint64_t seed,
                  double dropout_p, bool causal, double scale, at::Tensor& row_dots, at::Tensor& dq_accum,
                  at::Tensor& dk_heads, at::Tensor& dv_heads) {
  const auto dO = grad_out.accessor<T, 4>(), Q = q.accessor<T, 4>(), K = k.accessor<T, 4>(),
             V = v.accessor<T, 4>(), O = out.accessor<T, 4>();
  const auto L = lse.accessor<float, 3>();
  auto D = row_dots.accessor<float, 3>();
  auto dQ = dq_accum.accessor<float, 4>();
  auto dK = dk_heads.accessor<T, 4>(), dV = dv_heads.accessor<T, 4>();
  const float s = static_cast<float>(scale);
  at::parallel_for(0, d.batch * d.heads, 1, [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> dk(d.seq_k * d.head_dim), dv(d.seq_k * d.head_dim);
    for (std::int64_t bh = begin; bh < end; ++bh) {
      const std::int64_t b = bh / d.heads, h = bh % d.heads, kv = h / d.group();
      std::fill(dk.begin(), dk.end(), 0.0f);
      std::fill(dv.begin(), dv.end(), 0.0f);
      for (std::int64_t i = 0; i < d.seq_q; ++i) {
        const float row_dot = D[b][h][i] = dot(dO[b][i][h], O[b][i][h], d.head_dim);
        for (std::int64_t e = 0; e < d.head_dim; ++e) dQ[b][i][h][e] = 0;
        for (std::int64_t j = 0, n = visible_keys(d.seq_q, d.seq_k, causal, i); j < n; ++j) {
          const float p = std::exp(s * dot(Q[b][i][h], K[b][j][kv], d.head_dim) - L[b][h][i]);
          const float keep = keep_scale(seed, score_index(d, b, h, i, j), dropout_p);
          const float ds = p * (keep * dot(dO[b][i][h], V[b][j][kv], d.head_dim) - row_dot);
          for (std::int64_t e = 0; e < d.head_dim; ++e) {
            dv[j * d.head_dim + e] += p * keep * static_cast<float>(dO[b][i][h][e]);
            dQ[b][i][h][e] += s * ds * static_cast<float>(K[b][j][kv][e]);
            dk[j * d.head_dim + e] += s * ds * static_cast<float>(Q[b][i][h][e]);
          }
        }
      }
      for (std::int64_t j = 0; j < d.seq_k; ++j)
        for (std::int64_t e = 0; e < d.head_dim; ++e) {
          dK[b][j][h][e] = static_cast<T>(dk[j * d.head_dim + e]);
          dV[b][j][h][e] = static_cast<T>(dv[j * d.head_dim + e]);
        }
    }
  });
}

std::atomic<std::int64_t> g_cpu_seed{0};

Outputs forward_cpu_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout_p,
                           bool causal, double scale) {
  const Dims d = check_inputs(q, k, v);
  auto [out, lse, rng] = forward_outputs(d, q);
  const std::int64_t seed = g_cpu_seed.fetch_add(1);
  rng.data_ptr<std::int64_t>()[0] = seed;
  rng.data_ptr<std::int64_t>()[1] = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "flash_attention", [&] {
    forward_cpu<scalar_t>(d, q, k, v, out, lse, static_cast<std::uint64_t>(seed), dropout_p, causal, scale);
  });
  return {out, lse, rng};
}

Outputs forward_meta_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double, bool,
                            double) {
  return forward_outputs(check_inputs(q, k, v), q);
}

Outputs backward_cpu_kernel(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                            const at::Tensor& rng, double dropout_p, bool causal, double scale) {
  const Dims d = check_inputs(q, k, v);
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  const BackwardScratch shapes = backward_scratch(d, dao_width(d.head_dim));
  at::Tensor row_dots = at::empty(shapes.row_dots, q.options().dtype(at::kFloat));
  at::Tensor dq_accum = at::empty(shapes.dq_accum, q.options().dtype(at::kFloat));
  const bool grouped = !shapes.expanded.empty();
  at::Tensor dk_heads = grouped ? at::empty(shapes.expanded, q.options()) : dk;
  at::Tensor dv_heads = grouped ? at::empty(shapes.expanded, q.options()) : dv;
  const auto seed = static_cast<std::uint64_t>(rng.data_ptr<std::int64_t>()[0]);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "flash_attention_backward", [&] {
    backward_cpu<scalar_t>(d, grad_out, q, k, v, out, lse, seed, dropout_p, causal, scale, row_dots, dq_accum,
                           dk_heads, dv_heads);
  });
  // As mha_bwd ends: dq from its accumulator, grouped heads' dk and dv summed
  // into their key/value head's (neither allocates).
  dq.copy_(dq_accum.narrow(1, 0, d.seq_q).narrow(3, 0, d.head_dim));
  if (grouped) {
    const std::vector<std::int64_t> groups{d.batch, d.seq_k, d.kv_heads, d.group(), d.head_dim};
    at::sum_out(dk, dk_heads.view(groups), {3});
    at::sum_out(dv, dv_heads.view(groups), {3});
  }
  return {dq, dk, dv};
}

Outputs backward_meta_kernel(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& v, const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                             bool, double) {
  check_inputs(q, k, v);
  TORCH_CHECK(grad_out.stride(-1) == 1, "metamem::flash_attention_backward: grad_out needs a contiguous last dimension");
  return {at::empty_like(q), at::empty_like(k), at::empty_like(v)};
}

using ForwardSignature = Outputs(const at::Tensor&, const at::Tensor&, const at::Tensor&, double, bool, double);
using BackwardSignature = Outputs(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                  const at::Tensor&, const at::Tensor&, const at::Tensor&, double, bool, double);

const auto& forward_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("metamem::flash_attention", "").typed<ForwardSignature>();
  return op;
}

const auto& backward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("metamem::flash_attention_backward", "")
                             .typed<BackwardSignature>();
  return op;
}

// Keeps q, k, v, the output, the log-sum-exp and the RNG state, as
// flash_attn_interface.py does.
class FlashAttentionFunction : public torch::autograd::Function<FlashAttentionFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                                                const at::Tensor& k, const at::Tensor& v, double dropout_p,
                                                bool causal, double scale) {
    // Function::apply only turns grad mode off: the op would come back here.
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, lse, rng] = forward_op().call(q, k, v, dropout_p, causal, scale);
    ctx->save_for_backward({q, k, v, out, lse, rng});
    ctx->saved_data["dropout_p"] = dropout_p;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    ctx->mark_non_differentiable({lse, rng});
    return {out, lse, rng};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor grad_out = grads[0].stride(-1) == 1 ? grads[0] : grads[0].contiguous();
    auto [dq, dk, dv] = backward_op().call(grad_out, saved[0], saved[1], saved[2], saved[3], saved[4], saved[5],
                                           ctx->saved_data["dropout_p"].toDouble(),
                                           ctx->saved_data["causal"].toBool(), ctx->saved_data["scale"].toDouble());
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

Outputs autograd_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout_p,
                        bool causal, double scale) {
  const auto outputs = FlashAttentionFunction::apply(q, k, v, dropout_p, causal, scale);
  return {outputs[0], outputs[1], outputs[2]};
}

std::int64_t backward_scratch_bytes(c10::ArrayRef<c10::IValue> arguments, c10::ArrayRef<c10::IValue>) {
  const at::Tensor& q = arguments[1].toTensor();
  const Dims d = check_inputs(q, arguments[2].toTensor(), arguments[3].toTensor());
  const auto pieces = scratch_pieces(backward_scratch(d, dao_width(d.head_dim)), q.element_size());
  return std::accumulate(pieces.begin(), pieces.end(), std::int64_t{0});
}

}  // namespace

TORCH_LIBRARY(metamem, m) {
  m.def("flash_attention(Tensor q, Tensor k, Tensor v, float dropout_p, bool causal, float scale)"
        " -> (Tensor out, Tensor logsumexp, Tensor rng_state)");
  m.def("flash_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out,"
        " Tensor logsumexp, Tensor rng_state, float dropout_p, bool causal, float scale)"
        " -> (Tensor grad_q, Tensor grad_k, Tensor grad_v)");
}

TORCH_LIBRARY_IMPL(metamem, CPU, m) {
  m.impl("flash_attention", TORCH_FN(forward_cpu_kernel));
  m.impl("flash_attention_backward", TORCH_FN(backward_cpu_kernel));
}

TORCH_LIBRARY_IMPL(metamem, Meta, m) {
  m.impl("flash_attention", TORCH_FN(forward_meta_kernel));
  m.impl("flash_attention_backward", TORCH_FN(backward_meta_kernel));
}

// The backward is not differentiable again; libtorch gives AutogradPrivateUse1
// (MetaTensors' key) no fallthrough of its own.
TORCH_LIBRARY_IMPL(metamem, Autograd, m) {
  m.impl("flash_attention", TORCH_FN(autograd_kernel));
  m.impl("flash_attention_backward", torch::CppFunction::makeFallthrough());
}

ScratchModel device_scratch_model(const std::string& qualified_name) {
  return qualified_name == "metamem::flash_attention_backward" ? &backward_scratch_bytes : nullptr;
}

c10::SmallVector<std::int64_t, 4> flash_attention_backward_scratch(std::int64_t batch, std::int64_t seq_q,
                                                                   std::int64_t seq_k, std::int64_t heads,
                                                                   std::int64_t kv_heads, std::int64_t head_dim,
                                                                   std::int64_t head_dim_rounded,
                                                                   std::int64_t element_size) {
  return scratch_pieces(backward_scratch({batch, seq_q, seq_k, heads, kv_heads, head_dim}, head_dim_rounded),
                        element_size);
}

std::int64_t flash_attention_scores(std::int64_t seq_q, std::int64_t seq_k, bool causal) {
  std::int64_t scores = 0;
  for (std::int64_t row = 0; row < seq_q; ++row) scores += visible_keys(seq_q, seq_k, causal, row);
  return scores;
}

at::Tensor flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout_p,
                           bool causal, c10::optional<double> scale) {
  TORCH_CHECK(dropout_p >= 0 && dropout_p < 1, "metamem::flash_attention: dropout_p must be in [0, 1)");
  const double s = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  return std::get<0>(forward_op().call(q, k, v, dropout_p, causal, s));
}

}  // namespace metamem
