"""scaled_dot_product_attention on fake cuda runs the kernel the traced GPU
runs: cuDNN attention first on Hopper (torch 2.14 with cuDNN 9.24),
FlashAttention-2 on Ampere and Ada, the memory-efficient kernel on Turing
and for f32, math where the user turns the fused ones off; each with the
outputs it saves and, for flash and cuDNN, what its backward holds beside
the gradients. Byte counts are the simulated allocator's (512-byte blocks)."""

import os

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import metamem
from attention_kernels import AttentionKernels

B, H, S, D = 2, 4, 256, 64


def attention_step(gpu, dtype, heads_kv=H, mask=False, layout="bhsd"):
    """Forward and backward of one SDPA call on leaf q, k, v: the kernels
    run, the bytes forward leaves allocated and backward's peak above that."""
    with metamem.trace(device="cuda", gpu=gpu):
        def operand(heads):
            if layout == "bshd":  # as transformers makes them: (B, S, H, D) viewed as (B, H, S, D)
                return torch.randn(B, S, heads, D, device="cuda", dtype=dtype).transpose(1, 2)
            return torch.randn(B, heads, S, D, device="cuda", dtype=dtype)
        q, k, v = (operand(heads).requires_grad_() for heads in (H, heads_kv, heads_kv))
        grad = operand(H)
        attn_mask = torch.zeros(S, S, device="cuda", dtype=dtype) if mask else None
        before = torch.cuda.memory_allocated()
        with AttentionKernels() as ops:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=not mask,
                                                 enable_gqa=heads_kv != H)
            forward = torch.cuda.memory_allocated() - before
            torch.cuda.reset_peak_memory_stats()
            out.backward(grad)
            backward = torch.cuda.max_memory_allocated() - before
    return ops.names, forward, backward


def blocks(nbytes):
    return -(-nbytes // 512) * 512


ELEMENTS = B * H * S * D


@pytest.mark.parametrize("gpu,dtype,kernel", [
    ("H100-80GB", torch.bfloat16, "_scaled_dot_product_cudnn_attention"),
    ("A100-80GB", torch.bfloat16, "_scaled_dot_product_flash_attention"),
    ("L4", torch.float16, "_scaled_dot_product_flash_attention"),
    ("T4", torch.float16, "_scaled_dot_product_efficient_attention"),
    ("H100-80GB", torch.float32, "_scaled_dot_product_efficient_attention"),
])
def test_each_gpu_runs_the_kernel_torch_picks_for_it(gpu, dtype, kernel):
    names, _, _ = attention_step(gpu, dtype)
    assert names == {kernel, kernel + "_backward"}


def test_the_users_backend_flags_and_masks_decide_as_on_a_gpu():
    with sdpa_kernel(SDPBackend.MATH):
        names, _, _ = attention_step("H100-80GB", torch.bfloat16)
    assert not any("_scaled_dot_product" in name for name in names)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]):
        names, _, _ = attention_step("H100-80GB", torch.bfloat16)
    assert "_scaled_dot_product_flash_attention" in names
    # FlashAttention takes no mask: on an A100 a masked call runs the memory-efficient kernel
    names, _, _ = attention_step("A100-80GB", torch.bfloat16, mask=True)
    assert "_scaled_dot_product_efficient_attention" in names
    torch.backends.cuda.enable_flash_sdp(True)  # sdpa_kernel put every flag back; so did the traces
    assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.cudnn_sdp_enabled()


def test_flash_saves_its_output_log_sum_exp_and_rng_state_and_holds_fp32_accumulators_in_backward():
    _, forward, backward = attention_step("A100-80GB", torch.bfloat16)
    out, lse = 2 * ELEMENTS, 4 * B * H * S
    assert forward == out + lse + 512 + 512  # rng_state (2 uint64) and an unused uint64, each a block
    gradients = 3 * 2 * ELEMENTS
    # mha_bwd: fp32 row dot products and dq accumulator (rows to 128, head_dim to 32)
    scratch = 4 * B * H * S + 4 * B * S * H * D
    # q, k, v and the gradient are (B, H, S, D): the output and its gradient are copied into (B, S, H, D)
    copies = 2 * 2 * ELEMENTS
    assert backward == forward + gradients + scratch + copies


def test_flash_reads_transformers_layout_without_copies_and_expands_grouped_heads():
    _, forward, backward = attention_step("A100-80GB", torch.bfloat16, heads_kv=1, layout="bshd")
    kv_gradients = 2 * 2 * ELEMENTS // H
    scratch = 4 * B * H * S + 4 * B * S * H * D + 2 * (2 * ELEMENTS)  # dk and dv per query head
    assert backward == forward + 2 * ELEMENTS + kv_gradients + blocks(scratch)


def assert_peaks_as_real_torch(gpu, case, recorded=False):
    """real_gpu.py's `case` traced for `gpu` (`recorded`: following the fake
    GPU's recordings) holds what real torch on the fake GPU holds: max
    allocated and max reserved."""
    oracle = os.environ.get("METAMEM_ORACLE", "")
    if not os.path.exists(os.path.join(oracle, "libmetamem_fake_cuda_preload.so")):
        pytest.skip(f"METAMEM_ORACLE={oracle!r} holds no fake GPU to run real torch on")
    import metamem._metamem as native
    import real_gpu
    real = real_gpu.measured_run(real_gpu.on_fake_gpu(oracle, native.gpu(gpu), case))
    traced = real_gpu.traced(gpu, case, oracle if recorded else None)
    assert "error" not in real and "error" not in traced, (real, traced)
    assert (traced["allocated"], traced["reserved"]) == (real["allocated"], real["reserved"])


def test_cudnn_holds_its_softmax_sum_and_dq_accumulator_in_backward():
    _, forward, backward = attention_step("H100-80GB", torch.bfloat16)
    assert forward == 2 * ELEMENTS + 4 * B * H * S + 512 + 512  # output, statistics, seed, offset
    # cudnn-frontend's softmax sum and fp32 dq accumulator, and the plan's 256 bytes
    workspace = 4 * B * H * S + 4 * ELEMENTS + 256
    assert backward == forward + 3 * 2 * ELEMENTS + blocks(workspace)


@pytest.mark.parametrize("gpu", ["H100-80GB", "H200"])
@pytest.mark.parametrize("case", ["sdpa bf16 causal (default)", "sdpa bf16 causal, forward only",
                                  "sdpa bf16 grouped heads 16/4 (default)", "sdpa bf16 head_dim 64 (default)",
                                  "sdpa bf16 float mask (default)"])
def test_cudnn_attention_is_traced_as_real_torch_runs_cudnn_on_the_fake_gpu(gpu, case):
    # cuDNN 9 runs on the fake GPU, its heuristics and execution plans its
    # own: the seed and offset before the output, a 256-byte workspace of the
    # forward's plan, the output gradient's copy apart from the backward's
    # workspace. The trace was 512 B under before.
    assert_peaks_as_real_torch(gpu, case)


@pytest.mark.parametrize("gpu, case", [("A100-80GB", "sdpa bf16 causal CUDNN_ATTENTION"),
                                       ("H100-80GB", "sdpa bf16 grouped heads 16/4 (default)")])
def test_cudnn_attention_follows_the_fake_gpus_recordings_on_any_gpu(gpu, case):
    # With the fake GPU, a trace takes cuDNN attention's calls from its
    # recordings, as convolutions'. Without, cuDNN's sm90 plans are modelled:
    # on an A100 (cuDNN attention forced; torch prefers flash there) its
    # backward's workspace is 67,371,136 B, not the model's 33,816,832, and
    # its forward's plan takes none (168,299,008 B traced, 201,853,440 real).
    assert_peaks_as_real_torch(gpu, case, recorded=True)


def test_softmax_backward_holds_the_product_of_gradient_and_output_as_the_math_path_runs_it():
    # CUDA's softmax backward first writes gradient x output to a temporary
    # the size of the scores (softmax_backward_cuda_out); log-softmax's
    # backward makes none. On the math path's 2 x 16 x 2048 x 2048 f32 scores
    # that is 512 MiB, as real torch on the fake GPU holds (docs/accuracy.md).
    def backward_peak(function):
        with metamem.trace(device="cuda", gpu="H100-80GB"):
            x = torch.randn(64, 2048, device="cuda", requires_grad=True)
            y = function(x, -1)
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            y.backward(torch.ones_like(y))
            return torch.cuda.max_memory_allocated() - before
    assert backward_peak(torch.softmax) - backward_peak(torch.log_softmax) == 64 * 2048 * 4


def test_a_gpu_that_runs_no_enabled_backend_is_a_named_error():
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        with pytest.raises(RuntimeError, match="no backend enabled"):
            attention_step("T4", torch.float16)  # flash needs sm80
    x = torch.ones(2)  # real tensors work after the failed block
    assert (x + 1).tolist() == [2.0, 2.0]


@pytest.mark.parametrize("gpu,case", [
    ("H100-80GB", "efficient float32 head_dim 128 seq 1000"),  # f32: delta by ops, 128 x 64 blocks
    ("A10", "efficient bfloat16 head_dim 128 seq 1000"),  # 128-row blocks need more shared memory: 64 x 64, dk and dv split
    ("T4", "efficient float16 head_dim 96 seq 1000"),  # sm75's list
    ("H100-80GB", "efficient bfloat16 head_dim 256 seq 4096, batch 1 x 4 heads"),  # key splits capped by 200 / heads
    ("A100-80GB", "efficient float32 head_dim 64 seq 1000, bias with gradient"),
    ("H100-80GB", "efficient bfloat16 head_dim 128 seq 2048, dropout"),  # seed and offset on the host
    ("H100-80GB", "efficient float32 head_dim 64 seq 1000, 4 key and value heads"),  # key and value expanded
])
def test_memory_efficient_backward_holds_delta_and_its_kernels_workspace_as_real_torch(gpu, case):
    # The kernel's fp32 workspace (a dq tile per query block, dk and dv per
    # key split where it keeps them outside its registers) and delta were
    # missing: 34 MB on a 2 x 16 x 2048 x 128 f32 attention (docs/attention.md).
    assert_peaks_as_real_torch(gpu, case)


class _Attention(torch.nn.Module):
    def __init__(self, causal):
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


@pytest.mark.parametrize("device, gpu, dtype, kernel", [
    ("cpu", None, torch.float32, "_scaled_dot_product_flash_attention_for_cpu"),
    ("cuda", "H100-80GB", torch.float32, "_scaled_dot_product_efficient_attention"),
    ("cuda", "H100-80GB", torch.bfloat16, "_scaled_dot_product_cudnn_attention"),
    ("cuda", "A100-80GB", torch.bfloat16, "_scaled_dot_product_flash_attention"),
])
@pytest.mark.parametrize("causal, queries", [(True, S), (False, S // 2)])
def test_each_attention_kernel_counts_the_flops_of_the_scores_it_computes(device, gpu, dtype, kernel, causal,
                                                                          queries):
    # QKᵀ and PV: 4·D FLOPs a score forward; backward runs QKᵀ again and four
    # more products: 10·D. A causal mask leaves each query row the keys up to
    # its own.
    with metamem.trace(device=device, **({"gpu": gpu} if gpu else {})) as t:
        q = torch.randn(B, H, queries, D, device=device, dtype=dtype, requires_grad=True)
        k, v = (torch.randn(B, H, S, D, device=device, dtype=dtype, requires_grad=True) for _ in range(2))
        _Attention(causal)(q, k, v).sum().backward()
    scores = B * H * (S * (S + 1) // 2 if causal else queries * S)
    rows = [row for row in t.json()["nodes"] if row["op"].startswith(f"aten::{kernel}")]
    assert [(row["fwd_flops"], row["bwd_flops"]) for row in rows] == [(4 * scores * D, 10 * scores * D)]
