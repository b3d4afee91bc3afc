// Floating-point operations of one aten op, from its shapes.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>

namespace metamem {

// How an op's FLOPs are counted; chosen once per op name.
enum class FlopRule : std::uint8_t {
  None,            // views, copies, factories, indexing
  MatMul,          // mm, bmm, addmm, baddbmm: 2·m·n·k per output batch
  Convolution,     // 2 · output elements · (C_in / groups) · kernel elements
  ConvBackward,    // the same per gradient asked for (input, weight); bias: its elements
  NormForward,     // batch/layer norm: 5 per input element
  NormBackward,    // 8 per input element
  Softmax,         // 5 per element
  Elementwise,     // 1 per output element
  Attention,       // metamem::flash_attention: QKᵀ and PV, 4·head_dim per visible score
  AttentionBackward,  // its backward: QKᵀ again and four more products, 10·head_dim per score
};

FlopRule flop_rule(const std::string& qualified_op_name);

std::int64_t count_flops(FlopRule rule, c10::ArrayRef<c10::IValue> arguments,
                         c10::ArrayRef<c10::IValue> returns);

}  // namespace metamem
