// Floating-point operations of one aten op, from its shapes.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>

namespace metamem {

// How an op's FLOPs are counted.
enum class FlopKind : std::uint8_t {
  None,            // views, copies, factories, indexing
  MatMul,          // mm, bmm: 2·m·n·k per output batch
  AddMatMul,       // addmm, baddbmm: the same, the added tensor first
  Convolution,     // 2 · output elements · (C_in / groups) · kernel elements
  ConvBackward,    // the same per gradient asked for (input, weight); bias: its elements
  NormForward,     // batch/layer norm: 5 per input element
  NormBackward,    // 8 per input element
  Softmax,         // 5 per element
  Elementwise,     // 1 per output element
  Attention,       // QKᵀ and PV: 4·head_dim per visible score
  AttentionBackward,  // QKᵀ again and four more products: 10·head_dim per visible score
};

// An op's FlopKind and, for attention, where its arguments are; chosen once
// per op name (the overload aside: Inductor calls mm.out, addmm.out).
struct FlopRule {
  FlopKind kind = FlopKind::None;
  std::uint8_t query_at = 0;   // the query among the arguments; key and value follow it
  std::uint8_t causal_at = 0;  // is_causal among the arguments
  // aten's SDPA ops take [batch, heads, seq, dim] and align a causal mask to
  // the top left; metamem::flash_attention takes [batch, seq, heads, dim]
  // and aligns it to the bottom right.
  bool sdpa = false;
};

FlopRule flop_rule(const std::string& qualified_op_name);

std::int64_t count_flops(const FlopRule& rule, c10::ArrayRef<c10::IValue> arguments,
                         c10::ArrayRef<c10::IValue> returns);

}  // namespace metamem
