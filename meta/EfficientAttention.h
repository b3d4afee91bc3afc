// What PyTorch's memory-efficient attention holds beside its outputs on
// CUDA (_efficient_attention_forward and _backward in attention.cu and
// attention_backward.cu, with xFormers' CUTLASS kernels of
// mem_eff_attention/kernels/cutlassF.h and cutlassB.h).
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>

#include "meta/CpuKernelModel.h"

namespace metamem {

// The plan of aten::_scaled_dot_product_efficient_attention_backward on
// the traced GPU: the output's gradient made contiguous where it is not;
// after the gradients, the fp32 row dot products (delta: the kernel's own
// for 16-bit kernels, otherwise computed by ops of their own), then the
// kernel's fp32 workspace (a dq accumulator per query block, and dk and dv
// accumulators per key split where the kernel keeps them outside its
// registers), sized for the kernel cutlassB picks for the GPU.
ScratchPlan efficient_attention_backward_plan(c10::ArrayRef<c10::IValue> arguments);

// The forward's fp32 output accumulator, which 16-bit kernels need for head
// sizes above 128 (their value blocks then take several iterations:
// kNeedsOutputAccumulatorBuffer), of
// aten::_scaled_dot_product_efficient_attention.
std::int64_t efficient_attention_forward_bytes(c10::ArrayRef<c10::IValue> arguments,
                                               c10::ArrayRef<c10::IValue> returns);

}  // namespace metamem
