"""A real GPU against metamem's fake cuda: the same code, measured where it
runs for real and traced here.

    python3 tests/python/real_gpu.py measure OUT.json [JOBS [CASE...]]   # on a GPU machine; no metamem needed
    PYTHONPATH=build/python .venv/bin/python tests/python/real_gpu.py compare OUT.json [build/oracle [CASE...]]
    MEASURED_TORCH=SITE ... compare ...   # also the real GPU's torch, installed in SITE, on the fake GPU

`measure` runs each case of CASES in a fresh process (as a trace starts
from nothing) and records, per step, torch.cuda.max_memory_allocated() and
max_memory_reserved() after a reset at the step's start, with the GPU, torch,
cuDNN and library versions. `compare` traces each case on metamem's fake
cuda for the GPU measured and prints both side by side; where the versions
differ from the pinned ones, it says so beside the table, since a
difference may then be the version's.

The cases reach what the fake GPU of oracle/ could not run or cannot
(issue 47): every SDPA backend, cuDNN convolutions and batch norm, and
compiled steps on the GPU (issue 46). The kernel cases (attention,
convolutions, batch norm, LSTM) also record each step's allocations and
frees (EVENT_CASES): what the kernels allocate inside, in their order.
"""
import concurrent.futures
import contextlib
import functools
import json
import os
import random
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import compiled_models
from transformer_block import Block


def attention(backend=None, dtype=torch.bfloat16, causal=True, mask=False, heads_kv=16, head_dim=128,
              backward=True):
    def run(step_end):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        b, h, s = 2, 16, 2048
        q = torch.randn(b, h, s, head_dim, device="cuda", dtype=dtype, requires_grad=True)
        k, v = (torch.randn(b, heads_kv, s, head_dim, device="cuda", dtype=dtype, requires_grad=True)
                for _ in range(2))
        bias = torch.randn(b, 1, s, s, device="cuda", dtype=dtype) if mask else None
        chosen = sdpa_kernel(getattr(SDPBackend, backend)) if backend else contextlib.nullcontext()
        with chosen:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal,
                                                 enable_gqa=heads_kv != h)
            if backward:
                out.sum().backward()
        step_end()
    return run


def efficient(dtype=torch.bfloat16, head_dim=128, seq=2048, batch=2, heads=16, causal=True, bias_grad=False,
              dropout=0.0, heads_kv=None):
    """The memory-efficient kernel forced, a step for the forward and one for
    the backward from a random gradient: what its backward allocates beside
    the gradients (the fp32 dq accumulator, dk and dv accumulators per key
    split, delta; key and value expanded where they have fewer heads,
    `heads_kv`) depends on the kernel cutlassB picks for the dtype and head
    size, and on the sequence, batch and heads."""
    def run(step_end):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        q = torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=dtype, requires_grad=True)
        k, v = (torch.randn(batch, heads_kv or heads, seq, head_dim, device="cuda", dtype=dtype, requires_grad=True)
                for _ in range(2))
        bias = (torch.randn(batch, heads, seq, seq, device="cuda", dtype=dtype, requires_grad=True)
                if bias_grad else None)
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal, dropout_p=dropout,
                                                 enable_gqa=heads_kv is not None)
            gradient = torch.randn_like(out)
            step_end()
            out.backward(gradient)
        step_end()
    return run


EFFICIENT_CASES = {
    **{f"efficient {str(dtype)[6:]} head_dim {head_dim} seq {seq}": efficient(dtype, head_dim, seq)
       for dtype in (torch.bfloat16, torch.float16, torch.float32) for head_dim in (32, 64, 96, 128, 160, 256)
       for seq in (2048, 1000)},
    "efficient bfloat16 head_dim 128 seq 2048, not causal": efficient(causal=False),
    "efficient bfloat16 head_dim 128 seq 1000, bias with gradient": efficient(seq=1000, causal=False,
                                                                               bias_grad=True),
    "efficient float32 head_dim 64 seq 1000, bias with gradient": efficient(torch.float32, 64, 1000, causal=False,
                                                                            bias_grad=True),
    "efficient bfloat16 head_dim 128 seq 2048, dropout": efficient(dropout=0.1),
    "efficient float32 head_dim 128 seq 2048, dropout": efficient(torch.float32, dropout=0.1),
    "efficient float32 head_dim 64 seq 1000, 4 key and value heads": efficient(torch.float32, 64, 1000, heads_kv=4),
    **{f"efficient {str(dtype)[6:]} head_dim {head_dim} seq {seq}, batch 1 x {heads} heads":
       efficient(dtype, head_dim, seq, 1, heads)
       for dtype in (torch.bfloat16, torch.float32) for head_dim in (64, 256) for seq in (128, 4096)
       for heads in (4, 300)},
}


def products(step_end):
    """cuBLAS's workspace: an f32 product, then a bf16 product with bias (cuBLASLt), a step each."""
    x = torch.randn(64, 1024, device="cuda")
    w = torch.randn(1024, 1024, device="cuda")
    y = x @ w
    step_end()
    xb, wb, bias = x.bfloat16(), w.bfloat16(), torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    z = torch.addmm(bias, xb, wb)
    step_end()


def cublas_threads(step_end):
    """A product on the main thread, then one on a new thread, twice: torch's
    cuBLAS handle pool gives a thread a handle of its own, and the second
    thread the first's back once the first has ended, with its workspace."""
    import threading
    x, w = torch.randn(64, 1024, device="cuda"), torch.randn(1024, 1024, device="cuda")
    x @ w
    step_end()
    for _ in range(2):
        thread = threading.Thread(target=lambda: x @ w)
        thread.start()
        thread.join()
        step_end()


def embedding_backward(distinct):
    """GPT-2's embedding (50,257 x 768) over 2 x 256 token ids, forward and
    backward, with distinct ids or all 0: CUDA's embedding_dense_backward
    reads no value (the real H200 holds the same either way); past 3,072
    ids it sorts them, in buffers sized by the number of ids and of weights
    (SORT_CASES)."""
    def run(step_end):
        torch.manual_seed(0)
        embedding = torch.nn.Embedding(50257, 768).cuda()
        ids = (torch.randint(0, 50257, (2, 256), device="cuda") if distinct
               else torch.zeros(2, 256, dtype=torch.long, device="cuda"))
        embedding(ids).sum().backward()
        step_end()
    return run


def convolution(channels, size, kernel, stride=1, dtype=torch.float32, in_channels=None):
    """One convolution's forward and backward, batch 8, cuDNN as torch sets it by default."""
    def run(step_end):
        x = torch.randn(8, in_channels or channels, size, size, device="cuda", dtype=dtype, requires_grad=True)
        conv = torch.nn.Conv2d(in_channels or channels, channels, kernel, stride, kernel // 2, bias=False).cuda()
        conv.to(dtype)
        conv(x).sum().backward()
        step_end()
    return run


def adamw_steps(build, batch, autocast=None, compiled=False, steps=2):
    """Two AdamW steps of build(), a step per reset of the peak."""
    def run(step_end):
        torch.manual_seed(0)
        model = build()
        optimizer = torch.optim.AdamW(model.parameters())
        forward = torch.compile(model) if compiled else model
        for _ in range(steps):
            with torch.autocast("cuda", autocast) if autocast else contextlib.nullcontext():
                loss = batch(forward)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            step_end()
    return run


def compiled_lm(**step):
    """compiled_steps' test LM (two blocks, width 64) at batch 32 x 256, two
    AdamW steps, compiled as `step` says; the run returns its steps."""
    def run(step_end):
        from compiled_steps import two_adamw_steps
        return two_adamw_steps(device="cuda", **{"batches": [32, 32], "seq": 256, **step})()
    return run


def ten_models_step(name, compile):
    """compiled_models' `name` at its cuda size, eager or compiled, two
    AdamW steps with the math attention kernel; the run returns its steps."""
    def run(step_end):
        return compiled_models.two_adamw_steps(name, "cuda", compile)[1]()
    return run


def batch_norm(dtype=torch.float32):
    """BatchNorm2d over 64 channels at 8 x 56², forward and backward, cuDNN as torch sets it by default."""
    def run(step_end):
        x = torch.randn(8, 64, 56, 56, device="cuda", dtype=dtype, requires_grad=True)
        torch.nn.BatchNorm2d(64).cuda()(x).sum().backward()
        step_end()
    return run


def group_norm(dtype=torch.float32, affine=True, size=32, input_grad=True, channels_last=False):
    """GroupNorm over 320 channels in 32 groups at batch 8 (a diffusion UNet's
    norm), forward and backward; all freed as the step ends, so that a
    trace's allocations and frees are the whole run's. The input
    channels-last where asked (a cuDNN convolution's output)."""
    def step():
        x = torch.randn(8, 320, size, size, device="cuda", dtype=dtype, requires_grad=input_grad)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        norm = torch.nn.GroupNorm(32, 320, affine=affine).cuda().to(dtype)
        y = norm(x)
        if y.requires_grad:
            y.backward(torch.ones_like(y))

    def run(step_end):
        step()
        step_end()
    return run


def layer_norm(rows, width, dtype=torch.float32, permuted=False, transposed_grad=False, bias=True):
    """LayerNorm over `width` of `rows` rows, forward and backward, all
    freed as the step ends; the input a permuted view (a diffusion UNet's
    transformer input) or the gradient a transposed one where asked."""
    def step():
        shape = (4, width, rows // 4) if permuted else (rows, width)
        x = torch.randn(shape, device="cuda", dtype=dtype)
        x = (x.permute(0, 2, 1) if permuted else x).requires_grad_()
        y = torch.nn.LayerNorm(width, bias=bias).cuda().to(dtype)(x)
        grad = torch.ones(y.shape[::-1], device="cuda", dtype=dtype).t() if transposed_grad else torch.ones_like(y)
        y.backward(grad)

    def run(step_end):
        step()
        step_end()
    return run


LAYER_NORM_CASES = {
    "layer norm 64, 4 x 1024 rows of a permuted input, f32": layer_norm(4096, 64, permuted=True),
    "layer norm 64, 4096 rows, transposed gradient, f32": layer_norm(4096, 64, transposed_grad=True),
    # Past 65,536 rows over few columns the weight's gradient sums blocks of rows first.
    "layer norm 64, 100,000 rows, f32": layer_norm(100000, 64),
    "layer norm 64, 100,000 rows, bf16": layer_norm(100000, 64, torch.bfloat16),
    "layer norm 64 without bias, 100,000 rows, f32": layer_norm(100000, 64, bias=False),
    "layer norm 768, 70,000 rows, f32": layer_norm(70000, 768),  # split on an H100, not on a T4's 40 SMs
}


def native_convolution(in_channels, channels, kernel, size=32, stride=1, dilation=1, groups=1, bias=True,
                       dtype=torch.float32, channels_last=False, input_grad=True, padding=None):
    """A Conv2d's forward and backward at batch 8 on libtorch's own CUDA
    kernels (cuDNN off, as metamem's fake cuda runs every convolution), all
    freed as the step ends."""
    def step():
        conv = torch.nn.Conv2d(in_channels, channels, kernel, stride,
                               padding=dilation * (kernel // 2) if padding is None else padding,
                               dilation=dilation, groups=groups, bias=bias).cuda().to(dtype)
        x = torch.randn(8, in_channels, size, size, device="cuda", dtype=dtype, requires_grad=input_grad)
        if channels_last:
            conv = conv.to(memory_format=torch.channels_last)
            x = x.detach().to(memory_format=torch.channels_last).requires_grad_(input_grad)
        with torch.backends.cudnn.flags(enabled=False):
            conv(x).sum().backward()

    def run(step_end):
        step()
        step_end()
    return run


NATIVE_CONVOLUTION_CASES = {
    "native conv 3x3, 64 channels, 32², f32": native_convolution(64, 64, 3),
    "native conv 3x3, 64 channels, 32², bf16": native_convolution(64, 64, 3, dtype=torch.bfloat16),
    "native conv 1x1, 64 to 128 channels, 32², no bias": native_convolution(64, 128, 1, bias=False),
    "native conv 3x3 stride 2, 3 to 32 channels, 64², input without gradient":
        native_convolution(3, 32, 3, size=64, stride=2, input_grad=False),
    "native conv 1x1, 64 channels, 32², input without gradient": native_convolution(64, 64, 1, input_grad=False),
    "native conv 3x3 dilated 2, 32 channels, 32²": native_convolution(32, 32, 3, dilation=2),
    "native conv 3x3, 32 channels, 32², channels last": native_convolution(32, 32, 3, channels_last=True),
    "native conv 3x3 depthwise, 64 channels, 32²": native_convolution(64, 64, 3, groups=64),
    # RegNet's and ResNeXt's: one convolution per group, then their outputs concatenated.
    "native conv 3x3 in 4 groups, 32 channels, 16²": native_convolution(32, 32, 3, size=16, groups=4),
    "native conv 3x3 stride 2 in 4 groups, 32 channels, 16², no bias":
        native_convolution(32, 32, 3, size=16, stride=2, groups=4, bias=False),
    # A ViT's (SigLIP's) patches: padding "valid" reaches the kernel as one value for both dimensions.
    "native conv 16x16 stride 16, padding valid, 3 to 64 channels, 64²":
        native_convolution(3, 64, 16, size=64, stride=16, padding="valid"),
}


def freed_step(body):
    """A case whose step body(), all of its tensors freed as it returns."""
    def run(step_end):
        body()
        step_end()
    return run


def cuda_randn(*size, dtype=torch.float32):
    return torch.randn(size, device="cuda", dtype=dtype)


def expanded_ids_embedding():
    # transformers' token type ids: a (1, 512) buffer expanded to the batch.
    table = torch.nn.Embedding(2, 768).cuda()
    ids = torch.zeros(1, 512, dtype=torch.long, device="cuda")[:, :128].expand(16, 128)
    table(ids).sum().backward()


def dropout():
    x = torch.randn(16, 128, 768, device="cuda", requires_grad=True)
    F.dropout(x, 0.1).sum().backward()


def flash_with_dropout():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q = torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        F.scaled_dot_product_attention(q, q, q, dropout_p=0.1).sum().backward()


def recurrent(module, dtype=torch.float32):
    """A 2-layer `module` (nn.LSTM, nn.GRU), width 256, 32 steps of batch
    8, forward and backward with cuDNN off, as metamem's fake cuda runs
    RNNs: each layer and step on torch's own CUDA cells."""
    def step():
        with torch.backends.cudnn.flags(enabled=False):
            rnn = module(256, 256, 2).cuda().to(dtype)
            x = torch.randn(32, 8, 256, device="cuda", dtype=dtype, requires_grad=True)
            rnn(x)[0].sum().backward()
    return freed_step(step)


def coat_factor_attention():
    # CoaT's factorized attention: keys softmaxed over their tokens (a
    # transposed view), and depthwise convolutions of the values' channel
    # splits, the splits not contiguous.
    with torch.backends.cudnn.flags(enabled=False):
        qkv = torch.randn(8, 197, 3, 8, 32, device="cuda", requires_grad=True).permute(2, 0, 3, 1, 4)
        k, v = qkv[1], qkv[2]
        keys = k.softmax(dim=2)
        image = v[:, :, 1:].transpose(-1, -2).reshape(8, 256, 14, 14)
        convs = [torch.nn.Conv2d(c, c, k, padding=k // 2, groups=c).cuda() for c, k in ((64, 3), (96, 5), (96, 7))]
        positions = torch.cat([conv(x) for conv, x in zip(convs, image.split([64, 96, 96], dim=1))], dim=1)
        queries = torch.randn(8, 8, 32, 197, device="cuda")  # its gradient reaches the softmax transposed
        ((keys.transpose(-1, -2) * queries).sum() + positions.sum()).backward()


def pooled_queries():
    # SAM2's Hiera pools its queries: a head split of the fused projection,
    # viewed channels last with gaps between its pixels.
    qkv = torch.randn(8, 32, 32, 3, 64, device="cuda", requires_grad=True)
    q = qkv[:, :, :, 0].permute(0, 3, 1, 2)
    F.max_pool2d(q, 2).sum().backward()


def one_head_attention():
    # PVT v2's first stage: one head over reduced keys, f32, where the
    # memory-efficient backward's delta is the sum of its products as it is.
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q = torch.randn(8, 1, 3136, 64, device="cuda", requires_grad=True)
    kv = torch.randn(8, 1, 49, 64, device="cuda", requires_grad=True)
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        F.scaled_dot_product_attention(q, kv, kv).sum().backward()


def shifted_windows():
    # Swin's cyclic shift: a roll over two dimensions, one at a time; and
    # over one dimension of a transposed view, read contiguous.
    x = torch.randn(8, 56, 56, 96, device="cuda", requires_grad=True)
    y = torch.roll(x, shifts=(-3, -3), dims=(1, 2))
    z = torch.roll(x.transpose(1, 2), shifts=5, dims=1)
    (y.sum() + z.sum()).backward()


def outlook_unfold():
    # VOLO's outlook attention unfolds its values, a channels-last view,
    # into 3 x 3 neighbourhoods: im2col grows empty_like(input).
    v = torch.randn(8, 28, 28, 192, device="cuda", requires_grad=True).permute(0, 3, 1, 2)
    F.unfold(v, kernel_size=3, padding=1).sum().backward()


def channels_last_batch_norms():
    # The channels-last kernels' backward: a head's batch norm over [N, C]
    # (IFormer's), and a channels-last image, whose reduction stages
    # across blocks.
    with torch.backends.cudnn.flags(enabled=False):
        head = torch.nn.BatchNorm1d(256).cuda()
        image = torch.nn.BatchNorm2d(64).cuda()
        x = torch.randn(16, 64, 56, 56, device="cuda").to(memory_format=torch.channels_last).requires_grad_()
        weights = torch.randn_like(x)  # channels last: the gradient reaching the second batch norm is too
        loss = head(torch.randn(16, 256, device="cuda", requires_grad=True)).sum() + image(x).sum()
        (loss + (image(x) * weights).sum()).backward()


def half_batch_norms():
    # Half and bf16 inputs keep their statistics in float, and the
    # channels-last kernels' backward reduces into float sum_dy and
    # sum_dy_xmu: with parameters of the input's dtype (a model cast to bf16,
    # as ResNet-50's last blocks over 1 x 1 images) and with float ones.
    with torch.backends.cudnn.flags(enabled=False):
        cast = torch.nn.BatchNorm2d(2048).cuda().to(torch.bfloat16)
        head = torch.nn.BatchNorm1d(256).cuda()
        x = torch.randn(2, 2048, 1, 1, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        h = torch.randn(16, 256, device="cuda", dtype=torch.float16, requires_grad=True)
        (cast(x).float().sum() + head(h).float().sum()).backward()


OTHER_KERNEL_CASES = {
    "embedding of expanded ids, forward and backward": freed_step(expanded_ids_embedding),
    "dropout 16 x 128 x 768, f32": freed_step(dropout),
    "flash attention with dropout, bf16": freed_step(flash_with_dropout),
    "LSTM, 2 layers of 256, 32 steps of 8, cuDNN off, f32": recurrent(torch.nn.LSTM),
    "GRU, 2 layers of 256, 32 steps of 8, cuDNN off, bf16": recurrent(torch.nn.GRU, torch.bfloat16),
    "CoaT factorized attention, softmax over a transposed view, depthwise convolutions of channel splits":
        freed_step(coat_factor_attention),
    "max pool over a channels-last view with gaps": freed_step(pooled_queries),
    "memory-efficient attention with one head, f32": freed_step(one_head_attention),
    "roll over two dimensions, and over one of a transposed view": freed_step(shifted_windows),
    "unfold of a channels-last view into 3 x 3 neighbourhoods": freed_step(outlook_unfold),
    "batch norm backward over [N, C] and over a channels-last image, cuDNN off": freed_step(channels_last_batch_norms),
    "batch norm backward of bf16 and f16 inputs, float statistics, cuDNN off": freed_step(half_batch_norms),
}


def reduction(make, shape, dtype=torch.float32):
    """make(x, target) of a (shape) input with a gradient and a target,
    forward and backward, all freed as the step ends."""
    def step():
        x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
        make(x, torch.randn(shape, device="cuda", dtype=dtype)).backward()

    def run(step_end):
        step()
        step_end()
    return run


def clipped_gradients():
    """clip_grad_norm_ of three parameters' gradients."""
    parameters = [torch.nn.Parameter(cuda_randn(1000, 1000)) for _ in range(3)]
    for parameter in parameters:
        parameter.grad = cuda_randn(1000, 1000)
    torch.nn.utils.clip_grad_norm_(parameters, 1.0)


REDUCTION_CASES = {
    "mse loss, 8 x 4 x 32², f32": reduction(F.mse_loss, (8, 4, 32, 32)),
    # A million values: the mean's blocks split each output's inputs (a staging buffer).
    "mse loss, 64 x 4 x 64², f32": reduction(F.mse_loss, (64, 4, 64, 64)),
    "mse loss summed, 64 x 4 x 64², bf16": reduction(lambda x, t: F.mse_loss(x, t, reduction="sum"),
                                                     (64, 4, 64, 64), torch.bfloat16),
    "smooth L1 loss, 64 x 4 x 64², f32": reduction(F.smooth_l1_loss, (64, 4, 64, 64)),
    "huber loss, 64 x 4 x 64², bf16": reduction(F.huber_loss, (64, 4, 64, 64), torch.bfloat16),
    "mean of 4,000,000, f32": reduction(lambda x, t: (x * t).mean(), (4000000,)),
    "mean over rows, 8192 x 256, bf16": reduction(lambda x, t: (x * t).mean(0).sum(), (8192, 256), torch.bfloat16),
    "mean over the last dimension, 64 x 8192, f32": reduction(lambda x, t: (x * t).mean(-1).sum(), (64, 8192)),
    # transformers' fast_all: a sum of bools reduces a copy of them as int64s.
    "sum of 16 x 64 bools": freed_step(lambda: torch.ones(16, 64, device="cuda", dtype=torch.bool).sum()),
    "sum over rows of 4096 x 1024 bools": freed_step(
        lambda: torch.ones(4096, 1024, device="cuda", dtype=torch.bool).sum(0)),
    # logsumexp subtracts the maxima from a copy of its input before it sums.
    "logsumexp over 64 x 50,257, f32": freed_step(lambda: cuda_randn(64, 50257).logsumexp(-1)),
    "logsumexp of 4 x 1,000,000 over all, bf16": freed_step(
        lambda: cuda_randn(4, 1000000, dtype=torch.bfloat16).logsumexp((0, 1))),
    "amax and amin over rows of 8192 x 256, f32 and f16": freed_step(
        lambda: (cuda_randn(8192, 256).amax(0), cuda_randn(8192, 256, dtype=torch.float16).amin(0))),
    # Variances stage Welford's (mean, M2, count) accumulators, 16 bytes each
    # (32 for doubles), where blocks split a column's rows: 67,108,864 B for
    # the std over the rows of 8192 x 256 floats on an H100.
    "std over dim 0 of 8192 x 256, f32": freed_step(lambda: cuda_randn(8192, 256).std(0)),
    "var_mean over dim 0 of 8192 x 256, f32": freed_step(lambda: torch.var_mean(cuda_randn(8192, 256), 0)),
    "std over dim 0 of 4096 x 512, bf16": freed_step(lambda: cuda_randn(4096, 512, dtype=torch.bfloat16).std(0)),
    "var over dim 0 of 4096 x 64, f64": freed_step(lambda: cuda_randn(4096, 64, dtype=torch.float64).var(0)),
    "var_mean of 1,000,000, f32": freed_step(lambda: torch.var_mean(cuda_randn(1000000))),
    "std_mean over the last dim of 64 x 8192, f32": freed_step(lambda: torch.std_mean(cuda_randn(64, 8192), -1)),
    # argmax, argmin, max and min over a dim stage (value, index) pairs, 16
    # bytes each; whole-tensor min and max their own dtype, aminmax pairs of
    # it; prod and nansum as mean; all and any a bool per block.
    "argmax of 1,000,000, f32": freed_step(lambda: cuda_randn(1000000).argmax()),
    "argmin over dim 0 of 8192 x 256, bf16": freed_step(lambda: cuda_randn(8192, 256, dtype=torch.bfloat16).argmin(0)),
    "max over dim 0 of 8192 x 256, f32": freed_step(lambda: cuda_randn(8192, 256).max(0)),
    "max over the last dim of 64 x 50,257, bf16": freed_step(
        lambda: cuda_randn(64, 50257, dtype=torch.bfloat16).max(-1)),
    "min of 1,000,000, f32": freed_step(lambda: cuda_randn(1000000).min()),
    "max of 1,000,000, f64": freed_step(lambda: cuda_randn(1000000, dtype=torch.float64).max()),
    # A whole strided tensor's max and min read a contiguous copy, its argmax
    # and argmin a flat one (reshape), made after the result.
    "max of a transposed 1000 x 1000, f32": freed_step(lambda: cuda_randn(1000, 1000).t().max()),
    "argmax of a transposed 1000 x 1000, f32": freed_step(lambda: cuda_randn(1000, 1000).t().argmax()),
    "argmin of a column of 1000 x 2, bf16": freed_step(
        lambda: cuda_randn(1000, 2, dtype=torch.bfloat16)[:, 0].argmin()),
    "aminmax of 1,000,000, f32": freed_step(lambda: torch.aminmax(cuda_randn(1000000))),
    "aminmax over dim 0 of 8192 x 256, f32": freed_step(lambda: torch.aminmax(cuda_randn(8192, 256), dim=0)),
    "aminmax of a transposed 4096 x 256, f32": freed_step(lambda: torch.aminmax(cuda_randn(256, 4096).t())),
    "prod over dim 0 of 8192 x 256, f32": freed_step(lambda: cuda_randn(8192, 256).prod(0)),
    "prod of 1,000,000 int32": freed_step(lambda: torch.ones(1000000, dtype=torch.int32, device="cuda").prod()),
    "nansum over dim 0 of 8192 x 256, bf16": freed_step(
        lambda: cuda_randn(8192, 256, dtype=torch.bfloat16).nansum(0)),
    "all of 1,000,000 bools": freed_step(lambda: (cuda_randn(1000000) > 0).all()),
    "all of 1,000,000 floats": freed_step(lambda: cuda_randn(1000000).all()),
    "any over dim 0 of 8192 x 256, bf16": freed_step(lambda: cuda_randn(8192, 256, dtype=torch.bfloat16).any(0)),
    # clip_grad_norm_'s norms: a partial norm per chunk of each tensor first.
    "foreach norm of three gradients of 1000 x 1000 (clip_grad_norm_), f32": freed_step(clipped_gradients),
    "foreach norm of bf16 tensors of three sizes": freed_step(lambda: torch._foreach_norm(
        [cuda_randn(3000, 1000, dtype=torch.bfloat16), cuda_randn(10, dtype=torch.bfloat16),
         cuda_randn(512, 512, dtype=torch.bfloat16)])),
    "foreach norm inf of two sizes, f32": freed_step(
        lambda: torch._foreach_norm([cuda_randn(300000), cuda_randn(1000)], float("inf"))),
}
STAGED_SINCE_THE_H200 = {name for name in REDUCTION_CASES if name.startswith(
    ("std", "var", "argm", "max ", "min ", "aminmax", "prod", "nansum", "all ", "any ", "foreach"))}
# Cases no H200 has run (docs/accuracy.md's lent H200 ran the others).
NOT_RUN_ON_THE_H200 = {"batch norm backward of bf16 and f16 inputs, float statistics, cuDNN off",
                       "logsumexp over 64 x 50,257, f32", "logsumexp of 4 x 1,000,000 over all, bf16",
                       "amax and amin over rows of 8192 x 256, f32 and f16"} | STAGED_SINCE_THE_H200


# Sorting, topk over large slices and a whole tensor's median: cub's
# temporaries, sized by its tuning for the GPU's architecture, which a
# trace takes from the fake GPU's recordings (test_cuda_kernels.py).
SORT_CASES = {
    # Slices of up to 4,096 sort in place, beside an arange of the slice's indices.
    "sort of 16 x 2048, f32": freed_step(lambda: cuda_randn(16, 2048).sort(-1)),
    # One slice: cub's radix sort of values and indices.
    "sort of 262,144, f32": freed_step(lambda: cuda_randn(262144).sort()),
    "stable sort of 100,000 int64": freed_step(
        lambda: torch.randint(0, 1000, (100000,), device="cuda").sort(stable=True)),
    # Under 128 slices: one sort of all, then by slice; from 128, cub's segmented sort.
    "argsort of 8 x 30,000 descending, f16": freed_step(
        lambda: cuda_randn(8, 30000, dtype=torch.float16).argsort(-1, descending=True)),
    "argsort of 64 x 8192, f32": freed_step(lambda: cuda_randn(64, 8192).argsort(-1)),
    "argsort of 256 x 8192, f32": freed_step(lambda: cuda_randn(256, 8192).argsort(-1)),
    # A mixture of experts' routing: 8,192 tokens' top-8 experts in order.
    "stable argsort of 65,536 expert ids": freed_step(
        lambda: torch.randint(0, 64, (8192, 8), device="cuda").view(-1).argsort(stable=True)),
    # Along a dimension not innermost: the input copied with it innermost,
    # the outputs sorted into copies.
    "sort along dim 0 of 5000 x 3, f32": freed_step(lambda: cuda_randn(5000, 3).sort(0)),
    "sort of 2 x 1,000,000, f32": freed_step(lambda: cuda_randn(2, 1000000).sort(-1)),
    "sort of 300,000, bf16": freed_step(lambda: cuda_randn(300000, dtype=torch.bfloat16).sort()),
    "sort of 200 x 5000, f64": freed_step(lambda: cuda_randn(200, 5000, dtype=torch.float64).sort(-1)),
    # topk: small slices select in one block each; large ones by a radix
    # selection across blocks (counts per block, sized by the GPU's SMs),
    # then sort what they selected.
    "topk 5 of 16 x 1000, f32": freed_step(lambda: cuda_randn(16, 1000).topk(5, 1)),
    "topk 2 of 4096 x 8, f32": freed_step(lambda: cuda_randn(4096, 8).topk(2, -1)),
    "topk 26,214 of 262,144, f32": freed_step(lambda: cuda_randn(262144).topk(26214)),
    "topk 26,214 of 262,144 unsorted, f32": freed_step(lambda: cuda_randn(262144).topk(26214, sorted=False)),
    "topk 50 of 64 x 50,257, f32": freed_step(lambda: cuda_randn(64, 50257).topk(50, -1)),
    # Many slices: the blocks' counts scanned by slice in more than one of cub's tiles.
    "topk 10 of 6000 x 500, f32": freed_step(lambda: cuda_randn(6000, 500).topk(10, -1)),
    "topk 1 of 100,000 x 512, f32": freed_step(lambda: cuda_randn(100000, 512).topk(1, -1)),
    "topk 5,000 along dim 0 of a transposed 2 x 100,000, f64": freed_step(
        lambda: cuda_randn(2, 100000, dtype=torch.float64).t().topk(5000, 0)),
    "topk 8,192 of 65,536, bf16": freed_step(lambda: cuda_randn(65536, dtype=torch.bfloat16).topk(8192)),
    "kthvalue 100 of 8 x 4096, f32": freed_step(lambda: cuda_randn(8, 4096).kthvalue(100, -1)),
    # The median of a whole tensor sorts it; along a dimension, it selects.
    "median of 262,144, f32": freed_step(lambda: cuda_randn(262144).median()),
    "nanmedian of 100,000, bf16": freed_step(lambda: cuda_randn(100000, dtype=torch.bfloat16).nanmedian()),
    "median of a transposed 300 x 200, f16": freed_step(lambda: cuda_randn(200, 300, dtype=torch.float16).t().median()),
    "nanmedian of every other of 20,000, f64": freed_step(lambda: cuda_randn(20000, dtype=torch.float64)[::2].nanmedian()),
    "median of 3,000 int64": freed_step(lambda: torch.randint(0, 100, (3000,), device="cuda").median()),
    "nanmedian of 2,000,000, f32": freed_step(lambda: cuda_randn(2000000).nanmedian()),
    "median over rows of 512 x 3000, f32": freed_step(lambda: cuda_randn(512, 3000).median(-1)),
    # randperm sorts an arange on random keys: 32-bit keys while a
    # permutation of n repeats few of them (n = 3,000), 64-bit past that.
    "randperm of 100,000": freed_step(lambda: torch.randperm(100000, device="cuda")),
    "randperm of 3,000": freed_step(lambda: torch.randperm(3000, device="cuda")),
    "randperm of 50,000 as int32": freed_step(lambda: torch.randperm(50000, device="cuda", dtype=torch.int32)),
    "randperm of 300,000 into a strided out=": freed_step(lambda: torch.randperm(
        300000, out=torch.empty(300000, 2, device="cuda", dtype=torch.long)[:, 0])),
    "gradient of rows gathered by 20,000 ids, f32": freed_step(lambda: cuda_randn(
        1000, 64).requires_grad_()[torch.randint(0, 1000, (20000,), device="cuda")].sum().backward()),
    "embedding backward, 4,096 ids of 5,000, f32": freed_step(lambda: torch.nn.Embedding(5000, 128).cuda()(
        torch.randint(0, 5000, (4, 1024), device="cuda")).sum().backward()),
    "embedding backward, 16,384 ids of 50,257, bf16": freed_step(lambda: torch.nn.Embedding(50257, 768).cuda().to(
        torch.bfloat16)(torch.randint(0, 50257, (8, 2048), device="cuda")).float().sum().backward()),
    "embedding backward, 262,144 ids of 50,257, f32": freed_step(lambda: torch.nn.Embedding(50257, 64).cuda()(
        torch.randint(0, 50257, (64, 4096), device="cuda")).sum().backward()),
    "embedding backward, 8,192 ids of 2 (token types), bf16": freed_step(lambda: torch.nn.Embedding(2, 768).cuda().to(
        torch.bfloat16)(torch.randint(0, 2, (16, 512), device="cuda")).float().sum().backward()),
    "embedding backward scaled by frequency, 1,024 ids of 5,000, f32": freed_step(lambda: torch.nn.Embedding(
        5000, 128, scale_grad_by_freq=True).cuda()(torch.randint(0, 5000, (4, 256), device="cuda")).sum().backward()),
    "embedding backward scaled by frequency, 65,536 ids of 5,000, f32": freed_step(lambda: torch.nn.Embedding(
        5000, 64, scale_grad_by_freq=True).cuda()(torch.randint(0, 5000, (16, 4096), device="cuda")).sum().backward()),
    # EmbeddingBag's sums and means sort their ids whatever their number.
    "embedding_bag sum backward, 4,096 ids": freed_step(lambda: torch.nn.EmbeddingBag(5000, 64, mode="sum").cuda()(
        torch.randint(0, 5000, (4096,), device="cuda"), torch.arange(0, 4096, 8, device="cuda")).sum().backward()),
    "embedding_bag mean backward, 1,024 ids": freed_step(lambda: torch.nn.EmbeddingBag(5000, 64, mode="mean").cuda()(
        torch.randint(0, 5000, (1024,), device="cuda"), torch.arange(0, 1024, 8, device="cuda")).sum().backward()),
    "embedding_bag max backward, 1,024 ids": freed_step(lambda: torch.nn.EmbeddingBag(5000, 64, mode="max").cuda()(
        torch.randint(0, 5000, (1024,), device="cuda"), torch.arange(0, 1024, 8, device="cuda")).sum().backward()),
    "index_put_ accumulating 20,000 rows, bf16": freed_step(lambda: torch.zeros(
        1000, 64, device="cuda", dtype=torch.bfloat16).index_put_(
        (torch.randint(0, 1000, (20000,), device="cuda"),), cuda_randn(20000, 64, dtype=torch.bfloat16),
        accumulate=True)),
    # Swin's relative position bias: a 7 x 7 window's 2,401 positions gather
    # rows of 6 heads from a table of 169.
    "gradient of a relative position table, 2,401 ids of 169 x 6, f32": freed_step(lambda: cuda_randn(
        169, 6).requires_grad_()[torch.randint(0, 169, (2401,), device="cuda")].sum().backward()),
    "gradient of points gathered by two indices, f32": freed_step(lambda: cuda_randn(300, 400).requires_grad_()[
        torch.randint(0, 300, (5000,), device="cuda"), torch.randint(0, 400, (5000,), device="cuda")].sum().backward()),
    # Indices of dimensions not adjacent: self transposed with them to the front, copied.
    "gradient of x[ids, :, ids], f32": freed_step(lambda: cuda_randn(50, 8, 60).requires_grad_()[
        torch.randint(0, 50, (3000,), device="cuda"), :,
        torch.randint(0, 60, (3000,), device="cuda")].sum().backward()),
    "gradient of x[:, ids] over 16 x 1000 x 8, bf16": freed_step(lambda: cuda_randn(
        16, 1000, 8, dtype=torch.bfloat16).requires_grad_()[:, torch.randint(0, 1000, (6000,), device="cuda")].float()
        .sum().backward()),
    "_unsafe_index_put accumulating 20,000 rows, f32": freed_step(lambda: torch.ops.aten._unsafe_index_put(
        torch.zeros(1000, 64, device="cuda"), [torch.randint(0, 1000, (20000,), device="cuda")],
        cuda_randn(20000, 64), True)),
    "index_put_ accumulating by int32 ids, f32": freed_step(lambda: torch.zeros(1000, 64, device="cuda").index_put_(
        (torch.randint(0, 1000, (20000,), device="cuda", dtype=torch.int32),), cuda_randn(20000, 64),
        accumulate=True)),
    "index_put_ accumulating one row broadcast, into a transposed self, f32": freed_step(lambda: torch.zeros(
        64, 1000, device="cuda").t().index_put_((torch.randint(0, 1000, (20000,), device="cuda"),),
                                                cuda_randn(64), accumulate=True)),
    # 200,000 ids: their range check's minimum and maximum split across blocks.
    "index_put_ accumulating 200,000 ids into 100,000, f32": freed_step(lambda: torch.zeros(
        100000, device="cuda").index_put_((torch.randint(0, 100000, (200000,), device="cuda"),),
                                          cuda_randn(200000), accumulate=True)),
    "arange of 20,000 under deterministic algorithms": freed_step(lambda: deterministically(
        lambda: torch.arange(20000, device="cuda"))),
    "index_put_ under deterministic algorithms, f32": freed_step(lambda: deterministically(
        lambda: torch.zeros(1000, 64, device="cuda").index_put_(
            (torch.randint(0, 1000, (20000,), device="cuda"),), cuda_randn(20000, 64)))),
    "index_put_ accumulating by host ids, f32": freed_step(lambda: torch.zeros(1000, 64, device="cuda").index_put_(
        (torch.randint(0, 1000, (20000,)),), cuda_randn(20000, 64), accumulate=True)),
}


def summed_backward(layer, *shape):
    """The backward of layer(x).sum() on a (shape) input: the gradient
    reaches the layer broadcast from the sum's scalar."""
    return freed_step(lambda: layer(cuda_randn(*shape).requires_grad_()).sum().backward())


# Backward kernels that read the output's gradient contiguous: a copy after
# the input's gradient where it is the broadcast gradient of a sum or mean.
GRADIENT_COPY_CASES = {
    "bilinear upsampling's backward of a sum": summed_backward(
        lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), 4, 16, 32, 32),
    "nearest upsampling's backward of a sum": summed_backward(
        lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), 4, 16, 32, 32),
    "bicubic upsampling's backward of a sum": summed_backward(
        lambda x: F.interpolate(x, scale_factor=2, mode="bicubic"), 4, 16, 32, 32),
    "trilinear upsampling's backward of a sum": summed_backward(
        lambda x: F.interpolate(x, scale_factor=2, mode="trilinear"), 2, 8, 16, 16, 16),
    "linear upsampling's backward of a sum": summed_backward(
        lambda x: F.interpolate(x, scale_factor=2, mode="linear"), 4, 16, 1024),
    "avg_pool1d's backward of a sum": summed_backward(lambda x: F.avg_pool1d(x, 2), 8, 64, 1024),
    "avg_pool2d's backward of a sum": summed_backward(lambda x: F.avg_pool2d(x, 2), 8, 64, 32, 32),
    "avg_pool3d's backward of a sum": summed_backward(lambda x: F.avg_pool3d(x, 2), 2, 8, 16, 16, 16),
    "max_pool3d's backward of a sum": summed_backward(lambda x: F.max_pool3d(x, 2), 2, 8, 16, 16, 16),
    "adaptive_max_pool2d's backward of a sum": summed_backward(lambda x: F.adaptive_max_pool2d(x, 4), 8, 64, 32, 32),
    "adaptive_avg_pool2d's backward of a sum": summed_backward(lambda x: F.adaptive_avg_pool2d(x, 4), 8, 64, 32, 32),
    "reflection padding's backward of a sum": summed_backward(
        lambda x: F.pad(x, (2, 2, 2, 2), mode="reflect"), 4, 16, 32, 32),
    # softmax's product with the gradient takes a broadcast gradient's shape
    # contiguous; log_softmax reads the gradient and output contiguous.
    "softmax's backward of a sum": summed_backward(lambda x: x.softmax(-1), 64, 1000),
    "log_softmax's backward of a sum": summed_backward(lambda x: x.log_softmax(-1), 64, 1000),
    "log_softmax's backward of a transposed gradient": freed_step(lambda: (
        cuda_randn(64, 1000).requires_grad_().log_softmax(-1).t() * cuda_randn(1000, 64)).sum().backward()),
    "softmax's backward of a transposed gradient": freed_step(lambda: (
        cuda_randn(64, 1000).requires_grad_().softmax(-1).t() * cuda_randn(1000, 64)).sum().backward()),
}


# Cases whose tensors made on the host stay there, as in the real run
# (metamem.trace's host_tensors="host").
HOST_TENSOR_CASES = {"index_put_ accumulating by host ids, f32"}


def deterministically(body):
    """body() under torch.use_deterministic_algorithms, restored after."""
    torch.use_deterministic_algorithms(True)
    try:
        return body()
    finally:
        torch.use_deterministic_algorithms(False)


# Cumulative sums, products and log-sum-exps: an input cast to the result's
# dtype (an integer one's sum in int64), contiguous copies, and for a scan of
# one slice cub's DeviceScan storage (its tiles' states) or, under
# deterministic algorithms, libtorch's per-block sums. Scans of many slices
# hold nothing more.
SCAN_CASES = {
    "cumsum of 100,000, f32": freed_step(lambda: cuda_randn(100000).cumsum(0)),
    "cumsum of 1,000,000, bf16": freed_step(lambda: cuda_randn(1000000, dtype=torch.bfloat16).cumsum(0)),
    "cumsum of 100,000, f64": freed_step(lambda: cuda_randn(100000, dtype=torch.float64).cumsum(0)),
    "cumsum of 100, f16": freed_step(lambda: cuda_randn(100, dtype=torch.float16).cumsum(0)),
    "cumsum of 20,000, complex64": freed_step(lambda: cuda_randn(20000, dtype=torch.complex64).cumsum(0)),
    "cumsum of 1 x 4096 along dim 1, f32": freed_step(lambda: cuda_randn(1, 4096).cumsum(1)),
    # More than 2^30 values: cub scans them in parts, each after the carry.
    "cumsum of 2^30 + 5,000, f16": freed_step(lambda: cuda_randn(2 ** 30 + 5000, dtype=torch.float16).cumsum(0)),
    # A mask's running count: bools and integers summed as int64.
    "cumsum of 50,000 bools": freed_step(lambda: torch.ones(50000, device="cuda", dtype=torch.bool).cumsum(0)),
    "cumsum of 50,000 int32": freed_step(lambda: torch.ones(50000, device="cuda", dtype=torch.int32).cumsum(0)),
    "cumsum of 100,000 f32 as f64": freed_step(lambda: cuda_randn(100000).cumsum(0, dtype=torch.float64)),
    "cumprod of 30,000 f16 as f32": freed_step(
        lambda: cuda_randn(30000, dtype=torch.float16).cumprod(0, dtype=torch.float32)),
    "cumsum of 40,000 int32 into a strided int64 out=": freed_step(lambda: torch.cumsum(
        torch.ones(40000, device="cuda", dtype=torch.int32), 0,
        out=torch.empty(40000, 2, device="cuda", dtype=torch.long)[:, 0])),
    "cumsum of a column of 50,000 x 2, f32": freed_step(lambda: cuda_randn(50000, 2)[:, 0].cumsum(0)),
    "cumsum of a transposed 300 x 200 along dim 0, f32": freed_step(lambda: cuda_randn(200, 300).t().cumsum(0)),
    "cumsum_ in place of a transposed 300 x 200 along dim 1, f32": freed_step(
        lambda: cuda_randn(200, 300).t().cumsum_(1)),
    # transformers' position ids from an attention mask: rows, libtorch's own kernel.
    "cumsum over rows of 8 x 2048 int64": freed_step(
        lambda: torch.ones(8, 2048, device="cuda", dtype=torch.long).cumsum(-1)),
    "cumprod of 100,000, f32": freed_step(lambda: cuda_randn(100000).cumprod(0)),
    "logcumsumexp of 100,000, f32": freed_step(lambda: cuda_randn(100000).logcumsumexp(0)),
    "cummax of 100,000, f32": freed_step(lambda: cuda_randn(100000).cummax(0)),
    "cumsum's gradient over 100,000, f32": freed_step(
        lambda: cuda_randn(100000).requires_grad_().cumsum(0).sum().backward()),
    "cumsum of 2,048 under deterministic algorithms, f32": freed_step(lambda: deterministically(
        lambda: cuda_randn(2048).cumsum(0))),
    "cumsum of 2,000,000 under deterministic algorithms, f64": freed_step(lambda: deterministically(
        lambda: cuda_randn(2000000, dtype=torch.float64).cumsum(0))),
    "cumsum over rows of 4 x 512 under deterministic algorithms, bf16": freed_step(lambda: deterministically(
        lambda: cuda_randn(4, 512, dtype=torch.bfloat16).cumsum(-1))),
}


def multinomial(n, samples, replacement=False, dtype=torch.float32):
    """`samples` drawn from the rows of (n) probabilities, freed as the step ends."""
    return freed_step(lambda: torch.multinomial(torch.rand(n, device="cuda", dtype=dtype), samples, replacement))


# Native kernels that run other ops inside: count_nonzero's mask and its sum
# of bools (their int64 copy), scatter_reduce's mean counting through ones
# and a scatter_add_, histc's range by aminmax, multinomial's checks and its
# noise sorted by topk (or a prefix sum with replacement), and cdist's
# Euclidean distances by products (pow, sum, cat, matmul: a cuBLAS
# workspace in the forward).
COMPOSED_KERNEL_CASES = {
    "count_nonzero of 1,000,000, f32": freed_step(lambda: cuda_randn(1000000).count_nonzero()),
    "count_nonzero over rows of 4096 x 1024, bf16": freed_step(
        lambda: cuda_randn(4096, 1024, dtype=torch.bfloat16).count_nonzero(0)),
    "count_nonzero over the last dim of 64 x 1000, f32": freed_step(lambda: cuda_randn(64, 1000).count_nonzero(-1)),
    "scatter_reduce_ mean of 20,000 x 64 into 1000 x 64, f32": freed_step(
        lambda: torch.zeros(1000, 64, device="cuda").scatter_reduce_(
            0, torch.randint(0, 1000, (20000, 64), device="cuda"), cuda_randn(20000, 64), "mean")),
    "scatter_reduce mean without self, bf16": freed_step(
        lambda: torch.zeros(1000, 64, device="cuda", dtype=torch.bfloat16).scatter_reduce(
            0, torch.randint(0, 1000, (20000, 64), device="cuda"), cuda_randn(20000, 64, dtype=torch.bfloat16),
            "mean", include_self=False)),
    "histc of 100,000": freed_step(lambda: torch.histc(cuda_randn(100000), 100)),
    "histc of 4,000,000": freed_step(lambda: torch.histc(cuda_randn(4000000), 100)),
    "histc of 100,000 in a range": freed_step(lambda: torch.histc(cuda_randn(100000), 100, -3, 3)),
    "histc of a column of 100,000 x 2": freed_step(lambda: torch.histc(cuda_randn(100000, 2)[:, 0], 100)),
    # histc's out= overload counts into a result of its own, then copies it.
    "histc of 100,000 into out=": freed_step(
        lambda: torch.histc(cuda_randn(100000), 100, out=torch.empty(100, device="cuda"))),
    "histc of 100,000 in a range into a smaller out=": freed_step(
        lambda: torch.histc(cuda_randn(100000), 100, -3, 3, out=torch.empty(10, device="cuda"))),
    "multinomial 1 of 16 x 50,257": multinomial((16, 50257), 1),
    "multinomial 8 of 16 x 50,257": multinomial((16, 50257), 8),
    "multinomial 8 with replacement of 16 x 50,257": multinomial((16, 50257), 8, True),
    "multinomial 3 of 1,000": multinomial(1000, 3),
    "multinomial 1 of 1,000,000": multinomial(1000000, 1),
    "multinomial 8 with replacement of 100,000": multinomial(100000, 8, True),
    "multinomial 4 of 8 x 30,000, bf16": multinomial((8, 30000), 4, dtype=torch.bfloat16),
    "multinomial 4 of a transposed 30,000 x 8": freed_step(
        lambda: torch.multinomial(torch.rand(30000, 8, device="cuda").t(), 4)),
    # torch.distributions: Dirichlet (and Beta, a Dirichlet of two) samples
    # gammas into its result, then divides them by their sums over the last
    # dimension; Gamma's rsample and Dirichlet's take their gradients from
    # kernels of their own. The fake GPU's values are zeros, which the
    # distributions' argument checks refuse.
    "Dirichlet rsample of 64 x 10 and its gradient, f32": freed_step(lambda: torch.distributions.Dirichlet(
        cuda_randn(64, 10).exp().requires_grad_(), validate_args=False).rsample().sum().backward()),
    "Dirichlet sample of 2 x 1,000,000, f32": freed_step(lambda: torch.distributions.Dirichlet(
        cuda_randn(2, 1000000).exp(), validate_args=False).sample()),
    "Beta sample of 100,000 (mixup's weights), f32": freed_step(lambda: torch.distributions.Beta(
        torch.full((100000,), 0.4, device="cuda"), torch.full((100000,), 0.4, device="cuda"), validate_args=False).sample()),
    "Gamma rsample of 100,000 and its gradient, f32": freed_step(lambda: torch.distributions.Gamma(
        cuda_randn(100000).exp().requires_grad_(), 1.0, validate_args=False).rsample().sum().backward()),
    "binomial of 100,000, f32": freed_step(lambda: torch.distributions.Binomial(
        10, torch.full((100000,), 0.5, device="cuda"), validate_args=False).sample()),
    "cdist of 64 and 256 points of 128, forward and backward": freed_step(
        lambda: torch.cdist(cuda_randn(64, 128).requires_grad_(), cuda_randn(256, 128)).sum().backward()),
}



GROUP_NORM_CASES = {
    "group norm 320 channels, 8 x 32², f32": group_norm(),
    "group norm 320 channels, 8 x 32², bf16": group_norm(torch.bfloat16),
    "group norm 320 channels, 8 x 32², f32, no affine": group_norm(affine=False),
    "group norm 320 channels, 8 x 32², bf16, no affine": group_norm(torch.bfloat16, affine=False),
    "group norm 320 channels, 8 x 1², f32": group_norm(size=1),
    "group norm 320 channels, 8 x 1², f16, no affine": group_norm(torch.float16, affine=False, size=1),
    "group norm 320 channels, 8 x 32², bf16, input without gradient": group_norm(torch.bfloat16, input_grad=False),
    "group norm 320 channels, 8 x 1², f32, input without gradient": group_norm(size=1, input_grad=False),
    "group norm 320 channels, 8 x 32², f32, channels-last input": group_norm(channels_last=True),
    "group norm 320 channels, 8 x 32², bf16, channels-last input without gradient":
        group_norm(torch.bfloat16, input_grad=False, channels_last=True),
}


def lstm(step_end):
    """A 2-layer LSTM, width 512, 128 steps of batch 16, forward and backward (cuDNN by default)."""
    x = torch.randn(128, 16, 512, device="cuda", requires_grad=True)
    torch.nn.LSTM(512, 512, 2).cuda()(x)[0].sum().backward()
    step_end()


def torchvision_net(name, cudnn=True, memory_format=torch.contiguous_format):
    def build():
        import torchvision
        torch.backends.cudnn.enabled = cudnn
        return getattr(torchvision.models, name)(num_classes=10).cuda().to(memory_format=memory_format)
    return build


def images(forward, memory_format=torch.contiguous_format):
    x = torch.randn(8, 3, 224, 224, device="cuda").to(memory_format=memory_format)
    return F.cross_entropy(forward(x), torch.zeros(8, dtype=torch.long, device="cuda"))


def channels_last_images(forward):
    return images(forward, torch.channels_last)


def transformers_lm(kind, attn):
    def build():
        import transformers
        if kind == "llama":
            config = transformers.LlamaConfig(hidden_size=512, intermediate_size=1536, num_hidden_layers=2,
                                              num_attention_heads=8, num_key_value_heads=4, vocab_size=1000,
                                              max_position_embeddings=1024)
            config._attn_implementation = attn
            return transformers.LlamaForCausalLM(config).cuda()
        config = transformers.GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=1000, n_positions=512,
                                         bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM")
        config._attn_implementation = attn
        return transformers.GPT2LMHeadModel(config).cuda()
    return build


def tokens(forward):
    ids = torch.zeros(4, 512, dtype=torch.long, device="cuda")
    return forward(ids, labels=ids).loss


def small_lm():
    width, vocab = 256, 1024
    return torch.nn.Sequential(torch.nn.Embedding(vocab, width), Block(width, 8), Block(width, 8),
                               torch.nn.Linear(width, vocab)).cuda()


def lm_tokens(forward):
    ids = torch.zeros(4, 256, dtype=torch.long, device="cuda")
    return F.cross_entropy(forward(ids).flatten(0, 1), ids.flatten())


def ctc(cudnn, lengths, reduction="mean", time=50, batch=16, classes=20, longest=30):
    """CTC loss of (time, batch, classes) log-probabilities, forward and
    backward, `batch` targets of distinct lengths up to `longest`. cuDNN's
    shape (`cudnn`): int32 targets concatenated, on the host where the
    lengths are lists (libtorch's rule for each overload); else int64
    targets padded to the longest, for torch's own kernels. `lengths`:
    "lists", or tensors (int32 for cuDNN, int64 else) on the "device" or
    the "host" (where the fake GPU, whose copies to the host read zeros,
    reads them as a GPU does)."""
    def step():
        log_probs = torch.randn(time, batch, classes, device="cuda", requires_grad=True).log_softmax(2)
        target_lengths = list(range(longest - batch + 1, longest + 1))
        dtype = torch.int32 if cudnn else torch.long
        if cudnn and lengths == "lists":  # on the host, made from data as a dataset's are
            labels = random.Random(0)
            targets = torch.tensor([labels.randrange(1, classes) for _ in range(sum(target_lengths))], dtype=dtype)
        elif cudnn:
            targets = torch.randint(1, classes, (sum(target_lengths),), dtype=dtype, device="cuda")
        else:
            targets = torch.randint(1, classes, (batch, longest), device="cuda")
        input_lengths = [time] * batch
        if lengths != "lists":
            on = "cuda" if lengths == "device" else "cpu"
            input_lengths = torch.tensor(input_lengths, dtype=dtype, device=on)
            target_lengths = torch.tensor(target_lengths, dtype=dtype, device=on)
        F.ctc_loss(log_probs, targets, input_lengths, target_lengths, reduction=reduction).backward()
    return freed_step(step)


CTC_CASES = {
    "CTC loss, cuDNN's shape, lengths on the device": ctc(True, "device"),
    "CTC loss, cuDNN's shape, lengths as lists, summed": ctc(True, "lists", "sum"),
    "CTC loss, padded int64 targets, lengths on the host": ctc(False, "host"),
    "CTC loss, padded int64 targets, lengths as lists": ctc(False, "lists"),
    "CTC loss, padded int64 targets, lengths as lists, summed": ctc(False, "lists", "sum"),
}


def trained(make, *shape, dtype=torch.float32):
    """make(x) of a (shape) input with a gradient, summed and backpropagated;
    all freed as the step ends."""
    return freed_step(lambda: make(torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True))
                      .sum().backward())


def with_weight(make, weight_shape, *shape, dtype=torch.float32):
    """As trained(), with a weight that takes a gradient too (make(x, w))."""
    def body():
        w = torch.randn(weight_shape, device="cuda", dtype=dtype, requires_grad=True)
        make(torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True), w).sum().backward()
    return freed_step(body)


def targets(n, classes):
    return torch.randint(0, classes, (n,), device="cuda")


# Activations, losses, pooling and resampling that no sweep had put at a peak
# (2026-12-04), forward and backward.
TRAINING_OP_CASES = {
    "prelu with 64 channels, 32 x 64 x 56², f32": with_weight(F.prelu, (64,), 32, 64, 56, 56),
    "glu over the last dim of 64 x 128 x 2048, bf16": trained(lambda x: F.glu(x, -1), 64, 128, 2048,
                                                               dtype=torch.bfloat16),
    "logsigmoid of 64 x 128 x 1024, f32": trained(F.logsigmoid, 64, 128, 1024),
    "softplus, mish, hardswish and elu of 32 x 4096, f32": trained(
        lambda x: F.softplus(x) + F.mish(x) + F.hardswish(x) + F.elu(x), 32, 4096),
    "rrelu in training, 64 x 128 x 1024, f32": trained(lambda x: F.rrelu(x, training=True), 64, 128, 1024),
    "binary cross entropy with weights, 256 x 1000, f32": freed_step(lambda: F.binary_cross_entropy(
        torch.rand(256, 1000, device="cuda", requires_grad=True), torch.rand(256, 1000, device="cuda"),
        weight=torch.rand(1000, device="cuda")).backward()),
    "multi margin loss, 256 x 1000, f32": freed_step(lambda: F.multi_margin_loss(
        cuda_randn(256, 1000).requires_grad_(), targets(256, 1000)).backward()),
    "multilabel margin loss, 256 x 100, f32": freed_step(lambda: F.multilabel_margin_loss(
        cuda_randn(256, 100).requires_grad_(), torch.randint(-1, 100, (256, 100), device="cuda")).backward()),
    "binary cross entropy summed, 4 x 1,000,000, bf16": freed_step(lambda: F.binary_cross_entropy(
        torch.rand(4, 1000000, device="cuda", dtype=torch.bfloat16, requires_grad=True),
        torch.rand(4, 1000000, device="cuda", dtype=torch.bfloat16), reduction="sum").backward()),
    "multi margin loss of a transposed 2 x 1,000,000, f32": freed_step(lambda: F.multi_margin_loss(
        cuda_randn(2, 1000000).requires_grad_().t(), targets(1000000, 2)).backward()),
    "multilabel margin loss without reduction, 256 x 100, f32": freed_step(lambda: F.multilabel_margin_loss(
        cuda_randn(256, 100).requires_grad_(), torch.randint(-1, 100, (256, 100), device="cuda"),
        reduction="none").sum().backward()),
    "multilabel soft margin loss, 256 x 1000, f32": freed_step(lambda: F.multilabel_soft_margin_loss(
        cuda_randn(256, 1000).requires_grad_(), torch.randint(0, 2, (256, 1000), device="cuda").float()).backward()),
    "triplet margin loss, 512 x 256, f32": freed_step(lambda: F.triplet_margin_loss(
        *(cuda_randn(512, 256).requires_grad_() for _ in range(3))).backward()),
    "cosine embedding loss, 512 x 256, f32": freed_step(lambda: F.cosine_embedding_loss(
        cuda_randn(512, 256).requires_grad_(), cuda_randn(512, 256).requires_grad_(),
        torch.ones(512, device="cuda")).backward()),
    "poisson nll loss, 256 x 1000, f32": freed_step(lambda: F.poisson_nll_loss(
        cuda_randn(256, 1000).requires_grad_(), torch.rand(256, 1000, device="cuda")).backward()),
    "nll loss with class weights over 16 x 21 x 128², f32": freed_step(lambda: F.nll_loss(
        cuda_randn(16, 21, 128, 128).requires_grad_().log_softmax(1),
        torch.randint(0, 21, (16, 128, 128), device="cuda"), weight=torch.rand(21, device="cuda")).backward()),
    "adaptive max pool to 7², 32 x 256 x 28², f32": trained(lambda x: F.adaptive_max_pool2d(x, 7), 32, 256, 28, 28),
    "max pool 1d of 32 x 256 x 1000, bf16": trained(lambda x: F.max_pool1d(x, 3, 2), 32, 256, 1000,
                                                    dtype=torch.bfloat16),
    "max unpool after max pool, 32 x 64 x 56², f32": trained(
        lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2), 32, 64, 56, 56),
    "lp pool 2d, 32 x 64 x 56², f32": trained(lambda x: F.lp_pool2d(x, 2, 2), 32, 64, 56, 56),
    "fractional max pool, 16 x 64 x 56², f32": trained(
        lambda x: F.fractional_max_pool2d(x, 3, output_ratio=(0.5, 0.5)), 16, 64, 56, 56),
    "fractional max pool 3d, 4 x 16 x 16³, f32": trained(
        lambda x: F.fractional_max_pool3d(x, 2, output_ratio=(0.5, 0.5, 0.5)), 4, 16, 16, 16, 16),
    "nearest upsampling by 2, 16 x 64 x 56², f32": trained(
        lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), 16, 64, 56, 56),
    "trilinear upsampling by 2, 4 x 16 x 16³, f32": trained(
        lambda x: F.interpolate(x, scale_factor=2, mode="trilinear"), 4, 16, 16, 16, 16),
    "pixel unshuffle and channel shuffle, 16 x 64 x 56², f32": trained(
        lambda x: F.channel_shuffle(F.pixel_unshuffle(x, 2), 4), 16, 64, 56, 56),
    "local response norm, 16 x 96 x 55², f32": trained(lambda x: F.local_response_norm(x, 5), 16, 96, 55, 55),
    "embedding with max_norm, 4,096 ids of 50,257": freed_step(lambda: F.embedding(
        targets(4096, 50257), torch.randn(50257, 256, device="cuda", requires_grad=True), max_norm=1.0)
        .sum().backward()),
    "embedding with max_norm, int32 ids of 4 x 50,000": freed_step(lambda: F.embedding(
        targets(200000, 50257).int().view(4, 50000), torch.randn(50257, 256, device="cuda", requires_grad=True),
        max_norm=1.0).sum().backward()),
    "embedding_renorm_ of 1,000,000 ids in place": freed_step(lambda: torch.embedding_renorm_(
        torch.randn(50257, 256, device="cuda"), targets(1000000, 50257), 1.0, 2.0)),
    "pdist of 1024 x 64, f32": trained(F.pdist, 1024, 64),
    "lerp, addcmul and addcdiv, 4 x 1,000,000, f32": freed_step(lambda: [
        t.lerp_(cuda_randn(4, 1000000), 0.1).addcmul_(cuda_randn(4, 1000000), cuda_randn(4, 1000000))
         .addcdiv_(cuda_randn(4, 1000000), cuda_randn(4, 1000000)) for t in [cuda_randn(4, 1000000)]]),
    "diff, kron and diag_embed, f32": freed_step(lambda: (
        torch.diff(cuda_randn(64, 10000).requires_grad_(), dim=-1).sum() +
        torch.kron(cuda_randn(64, 64).requires_grad_(), cuda_randn(32, 32)).sum() +
        torch.diag_embed(cuda_randn(64, 256).requires_grad_()).sum()).backward()),
}

def sync_batch_norm_ops(ranks, n, c, hw, dtype=torch.float32, channels_last=False, affine=True):
    """SyncBatchNorm's ops forward and backward as one rank of `ranks` runs
    them (torch.nn.modules._functions.SyncBatchNorm), the gathered
    statistics stacked here where the collective would gather them."""
    def body():
        x = torch.randn(n, c, hw, hw, device="cuda", dtype=dtype)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        weight = torch.ones(c, device="cuda", dtype=dtype) if affine else None
        bias = torch.zeros(c, device="cuda", dtype=dtype) if affine else None
        running_mean, running_var = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
        mean, invstd = torch.batch_norm_stats(x, 1e-5)
        counts = torch.full((ranks,), x.numel() // c, dtype=mean.dtype, device="cuda")
        mean, invstd = torch.batch_norm_gather_stats_with_counts(
            x, torch.stack([mean] * ranks), torch.stack([invstd] * ranks), running_mean, running_var, 0.1, 1e-5,
            counts)
        y = torch.batch_norm_elemt(x, weight, bias, mean, invstd, 1e-5)
        grad = torch.randn_like(y)
        sum_dy, sum_dy_xmu, _, _ = torch.batch_norm_backward_reduce(grad, x, mean, invstd, weight, True, affine,
                                                                      affine)
        torch.batch_norm_backward_elemt(grad, x, mean, invstd, weight, sum_dy, sum_dy_xmu, counts.int())
    return freed_step(body)


# A fourth probe (2026-12-04) of ops in training code, forward and backward:
# resampling, folding, padding, pooling, gathers and scatters, sorts'
# gradients, RMS and layer norms, per-sample weights, label smoothing.
FOURTH_PROBE_CASES = {
    "grid_sample bilinear of 8 x 16 x 64², f32": with_weight(
        lambda x, grid: F.grid_sample(x, grid.tanh(), align_corners=False), (8, 32, 32, 2), 8, 16, 64, 64),
    "grid_sample nearest with border padding, f32": with_weight(
        lambda x, grid: F.grid_sample(x, grid, mode="nearest", padding_mode="border", align_corners=True),
        (8, 32, 32, 2), 8, 16, 64, 64),
    "unfold and fold, 3 x 3 over 8 x 16 x 32², f32": trained(
        lambda x: F.fold(F.unfold(x, 3, padding=1), (32, 32), 3, padding=1), 8, 16, 32, 32),
    "bicubic upsampling by 2, 8 x 16 x 32², f32": trained(
        lambda x: F.interpolate(x, scale_factor=2, mode="bicubic"), 8, 16, 32, 32),
    "antialiased bilinear downsampling by 2, 8 x 16 x 64², f32": trained(
        lambda x: F.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True), 8, 16, 64, 64),
    "antialiased bicubic upsampling by 2, 8 x 16 x 32², f32": trained(
        lambda x: F.interpolate(x, scale_factor=2, mode="bicubic", antialias=True), 8, 16, 32, 32),
    "reflect padding 1-d and replicate padding 3-d, f32": trained(
        lambda x: F.pad(x, (2, 2), mode="reflect").sum() +
        F.pad(x.view(4, 8, 4, 4, 64), (1, 1, 1, 1, 1, 1), mode="replicate").sum(), 4, 128, 64),
    "adaptive average pooling 1-d and 3-d, f32": trained(
        lambda x: F.adaptive_avg_pool1d(x.view(8, 16, -1), 7).sum() +
        F.adaptive_avg_pool3d(x.view(8, 16, 4, 16, 16), 3).sum(), 8, 16, 32, 32),
    "max pooling 3-d of 4 x 16 x 16 x 32², f32": trained(lambda x: F.max_pool3d(x, 2), 4, 16, 16, 32, 32),
    "average pooling 3-d of 4 x 16 x 16 x 32², f32": trained(lambda x: F.avg_pool3d(x, 2), 4, 16, 16, 32, 32),
    "gather of 64 x 500 from 64 x 1000, f32": with_weight(
        lambda x, w: x.gather(1, torch.randint(0, 1000, (64, 500), device="cuda")) * w, (64, 500), 64, 1000),
    "index_add of 500 rows into 1000 x 64, f32": with_weight(
        lambda x, w: x.index_add(0, torch.randint(0, 1000, (500,), device="cuda"), w), (500, 64), 1000, 64),
    "sort and topk of 64 x 1000 with their gradients, f32": trained(
        lambda x: x.sort(-1)[0][:, :10].sum() + x.topk(5, -1)[0].sum(), 64, 1000),
    "flip, roll and repeat of 16 x 64 x 128, f32": trained(lambda x: x.flip(1).roll(3, 2).repeat(1, 2, 1), 16, 64, 128),
    "layer norm without affine parameters, 8 x 128 x 768, bf16": trained(
        lambda x: F.layer_norm(x, (768,)), 8, 128, 768, dtype=torch.bfloat16),
    # RMS norm's CUDA kernels are layer norm's: the input read contiguous
    # before the outputs, the gradient after them, block sums of the
    # weight's gradient over many rows of few columns.
    "rms_norm over 768 of 8 x 128 x 768, f32": with_weight(
        lambda x, w: F.rms_norm(x, (768,), w), (768,), 8, 128, 768),
    "rms_norm of a permuted 8 x 128 x 768, f32": with_weight(
        lambda x, w: F.rms_norm(x.transpose(0, 1), (768,), w), (768,), 128, 8, 768),
    "rms_norm over 64 of 131,072 rows, f32": with_weight(lambda x, w: F.rms_norm(x, (64,), w), (64,), 131072, 64),
    "rms_norm without a weight, 8 x 128 x 768, bf16": trained(
        lambda x: F.rms_norm(x, (768,)), 8, 128, 768, dtype=torch.bfloat16),
    "embedding_bag sum with per-sample weights, 4,096 ids": freed_step(lambda: torch.nn.EmbeddingBag(
        5000, 64, mode="sum").cuda()(
            torch.randint(0, 5000, (4096,), device="cuda"), torch.arange(0, 4096, 8, device="cuda"),
            per_sample_weights=torch.rand(4096, device="cuda", requires_grad=True)).sum().backward()),
    "cross entropy with label smoothing, 64 x 1000, bf16": freed_step(lambda: F.cross_entropy(
        torch.randn(64, 1000, device="cuda", dtype=torch.bfloat16, requires_grad=True), targets(64, 1000),
        label_smoothing=0.1).backward()),
}

# SyncBatchNorm's kernels (2026-12-04): before, no meta kernel.
SYNC_BATCH_NORM_CASES = {
    "SyncBatchNorm's ops, 4 ranks, 8 x 64 x 28², f32": sync_batch_norm_ops(4, 8, 64, 28),
    "SyncBatchNorm's ops, 8 ranks, channels last 32 x 64 x 56², f32": sync_batch_norm_ops(
        8, 32, 64, 56, channels_last=True),
    "SyncBatchNorm's ops, 2 ranks, channels last 16 x 32 x 32², bf16": sync_batch_norm_ops(
        2, 16, 32, 32, dtype=torch.bfloat16, channels_last=True),
    "SyncBatchNorm's ops without affine, 2 ranks, 16 x 32 x 32², bf16": sync_batch_norm_ops(
        2, 16, 32, 32, dtype=torch.bfloat16, affine=False),
}

# libtorch's own CUDA kernels that allocate inside (test_cuda_kernels.py).
LIBTORCH_KERNEL_CASES = {**GROUP_NORM_CASES, **LAYER_NORM_CASES, **REDUCTION_CASES, **NATIVE_CONVOLUTION_CASES,
                         **OTHER_KERNEL_CASES, **CTC_CASES}

CASES = {
    "sdpa bf16 causal (default)": attention(),
    "sdpa bf16 causal, forward only": attention(backward=False),
    "sdpa bf16 causal CUDNN_ATTENTION": attention("CUDNN_ATTENTION"),
    "sdpa bf16 causal FLASH_ATTENTION": attention("FLASH_ATTENTION"),
    "sdpa bf16 causal EFFICIENT_ATTENTION": attention("EFFICIENT_ATTENTION"),
    "sdpa bf16 causal MATH": attention("MATH"),
    "sdpa bf16 grouped heads 16/4 (default)": attention(heads_kv=4),
    "sdpa bf16 head_dim 64 (default)": attention(head_dim=64),
    "sdpa bf16 float mask (default)": attention(causal=False, mask=True),
    "sdpa f32 (default)": attention(dtype=torch.float32, causal=False),
    "sdpa f16 EFFICIENT_ATTENTION": attention("EFFICIENT_ATTENTION", dtype=torch.float16),
    "sdpa bf16 causal EFFICIENT_ATTENTION, forward only": attention("EFFICIENT_ATTENTION", backward=False),
    "sdpa bf16 causal EFFICIENT_ATTENTION, head_dim 64": attention("EFFICIENT_ATTENTION", head_dim=64),
    "sdpa f32 EFFICIENT_ATTENTION, head_dim 64": attention("EFFICIENT_ATTENTION", dtype=torch.float32,
                                                           head_dim=64),
    "sdpa bf16 causal EFFICIENT_ATTENTION, grouped heads 16/4": attention("EFFICIENT_ATTENTION", heads_kv=4),
    "products f32, then bf16 with bias": products,
    "conv 7x7 stride 2, 3 to 64 channels, 224², f32": convolution(64, 224, 7, 2, in_channels=3),
    "conv 3x3, 64 channels, 56², f32": convolution(64, 56, 3),
    "conv 3x3, 64 channels, 56², bf16": convolution(64, 56, 3, dtype=torch.bfloat16),
    "conv 3x3, 256 channels, 14², f32": convolution(256, 14, 3),
    "conv 1x1, 256 channels, 56², f32": convolution(256, 56, 1, in_channels=64),
    "resnet18 f32 cuDNN on": adamw_steps(torchvision_net("resnet18"), images),
    "resnet18 f32 cuDNN off": adamw_steps(torchvision_net("resnet18", cudnn=False), images),
    "resnet18 bf16 autocast cuDNN on": adamw_steps(torchvision_net("resnet18"), images, torch.bfloat16),
    "mobilenet_v2 f32 cuDNN on": adamw_steps(torchvision_net("mobilenet_v2"), images),
    "resnet18 bf16 autocast channels-last cuDNN on": adamw_steps(
        torchvision_net("resnet18", memory_format=torch.channels_last), channels_last_images, torch.bfloat16),
    "mobilenet_v2 f32 cuDNN off": adamw_steps(torchvision_net("mobilenet_v2", cudnn=False), images),
    "llama bf16 autocast sdpa": adamw_steps(transformers_lm("llama", "sdpa"), tokens, torch.bfloat16),
    "llama bf16 autocast eager attention": adamw_steps(transformers_lm("llama", "eager"), tokens,
                                                       torch.bfloat16),
    "gpt2 f32 sdpa": adamw_steps(transformers_lm("gpt2", "sdpa"), tokens),
    "gpt2 f32 eager attention": adamw_steps(transformers_lm("gpt2", "eager"), tokens),
    "small LM f32 eager": adamw_steps(small_lm, lm_tokens),
    "small LM f32 torch.compile": adamw_steps(small_lm, lm_tokens, compiled=True),
    "small LM bf16 autocast torch.compile": adamw_steps(small_lm, lm_tokens, torch.bfloat16, compiled=True),
    "test LM eager": compiled_lm(how="eager"),
    "test LM torch.compile(model)": compiled_lm(how="torch.compile(model)"),
    "test LM each block compiled": compiled_lm(how="each block"),
    "test LM only the loss compiled": compiled_lm(how="the loss"),
    "test LM graph break": compiled_lm(how="graph break"),
    "test LM torch.compile(model) and optimizer.step": compiled_lm(how="torch.compile(model)", compile_step=True),
    "test LM bf16 autocast flash torch.compile(model)": compiled_lm(how="torch.compile(model)", bf16=True),
    "test LM bf16 autocast flash eager": compiled_lm(how="eager", bf16=True),
    # CUDA graphs warm up at the first call and record at the second: four steps.
    "test LM torch.compile(model, mode=\"reduce-overhead\")": compiled_lm(how="mode=reduce-overhead",
                                                                          batches=[32] * 4),
    "test LM torch.compile(model, mode=\"max-autotune-no-cudagraphs\")":
        compiled_lm(how="mode=max-autotune-no-cudagraphs"),
    "batch norm 64 channels 56², f32": batch_norm(),
    "batch norm 64 channels 56², bf16": batch_norm(torch.bfloat16),
    "LSTM 2 layers width 512, 128 x 16, f32": lstm,
    "products on the main thread, a thread, another after it": cublas_threads,
    "embedding backward, GPT-2's vocabulary, random ids": embedding_backward(True),
    "embedding backward, GPT-2's vocabulary, all ids 0": embedding_backward(False),
    **{f"{name}, {how}": ten_models_step(name, how == "compiled") for name in compiled_models.MODELS
       for how in ("eager", "compiled")},
    **EFFICIENT_CASES,
    **LIBTORCH_KERNEL_CASES,
    **SORT_CASES,
    **SCAN_CASES,
    **GRADIENT_COPY_CASES,
    **COMPOSED_KERNEL_CASES,
    **TRAINING_OP_CASES,
    **SYNC_BATCH_NORM_CASES,
    **FOURTH_PROBE_CASES,
}


# The cases whose allocations and frees are recorded (measure_one's events):
# what the kernels the fake GPU cannot run allocate inside, in order.
EVENT_CASES = {name for name in CASES if name.startswith(("efficient", "sdpa", "conv", "batch norm", "LSTM"))} | \
    set(LIBTORCH_KERNEL_CASES) | set(SORT_CASES) | set(SCAN_CASES) | set(GRADIENT_COPY_CASES) | set(COMPOSED_KERNEL_CASES) | \
    set(TRAINING_OP_CASES) | set(SYNC_BATCH_NORM_CASES) | set(FOURTH_PROBE_CASES) | {
    "resnet18 f32 cuDNN on", "resnet18 bf16 autocast cuDNN on", "mobilenet_v2 f32 cuDNN on",
    "resnet18 bf16 autocast channels-last cuDNN on"}


def versions():
    import importlib.metadata as metadata
    props = torch.cuda.get_device_properties(0)
    found = {"gpu": props.name, "capability": f"{props.major}.{props.minor}", "total_memory": props.total_memory,
             "L2_cache_size": props.L2_cache_size, "multi_processor_count": props.multi_processor_count,
             "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}
    for package in ("torchvision", "transformers", "triton"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[package] = metadata.version(package)
    return found


def allocator_events(entries):
    """The caching allocator's recorded history as [["alloc" or "free",
    requested bytes, stream], ...]: what a trace's event list says."""
    live, events = {}, []
    for entry in entries:
        if entry["action"] == "alloc":
            live[entry["addr"]] = entry["size"]
            events.append(["alloc", entry["size"], entry["stream"]])
        elif entry["action"] == "free_completed" and entry["addr"] in live:
            events.append(["free", live.pop(entry["addr"]), entry["stream"]])
    return events


def measure_one(name, events=False):
    """In a fresh process: the case's steps, each (max allocated, max
    reserved), and with `events` each step's allocations and frees."""
    torch.cuda.init()
    steps, step_events = [], []
    if events:
        torch.cuda.memory._record_memory_history("all", context=None, stacks="python", max_entries=10**6)

    def step_end():
        torch.cuda.synchronize()
        steps.append([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()])
        torch.cuda.reset_peak_memory_stats()
        if events:
            step_events.append(allocator_events(torch.cuda.memory._snapshot()["device_traces"][0]))
            torch.cuda.memory._record_memory_history(None)
            torch.cuda.memory._record_memory_history("all", context=None, stacks="python", max_entries=10**6)

    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    steps = CASES[name](step_end) or steps  # a case may measure its own steps
    return {"steps": steps, "seconds": round(time.perf_counter() - start, 2),
            **({"events": step_events} if step_events else {})}


@contextlib.contextmanager
def cold_inductor_cache():
    """An Inductor cache of its own for what runs inside (a trace, or real torch
    on the fake GPU): each compiles and autotunes from nothing, as the first
    run does."""
    import tempfile
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        try:
            yield
        finally:
            if before is None:
                del os.environ["TORCHINDUCTOR_CACHE_DIR"]
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


def measure_in_child(name):
    import tempfile
    with tempfile.TemporaryDirectory() as cache:  # cold, as cold_inductor_cache; children run side by side
        child = subprocess.run([sys.executable, __file__, "one", name, *(["events"] if name in EVENT_CASES else [])],
                               capture_output=True, text=True,
                               env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache})
    # The last line is the result even where the process then fails on its way out.
    out, err = child.stdout.strip(), child.stderr.strip()
    if out.endswith("}"):
        return json.loads(out.splitlines()[-1])
    return {"error": err.splitlines()[-1] if err else f"exit {child.returncode}", "stderr": err[-2000:]}


def measure(path, jobs=6, *names):
    found, results = versions(), {}
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        children = {pool.submit(measure_in_child, name): name for name in names or CASES}
        for child in concurrent.futures.as_completed(children):
            results[children[child]] = child.result()
            print(children[child], json.dumps(child.result())[:300], flush=True)
            with open(path, "w") as out:  # after each case: a run cut short keeps what it measured
                json.dump({"versions": found, "cases": results}, out, indent=1)


GPU_KEYS = {"H100": "H100-80GB", "H200": "H200", "A100": "A100-80GB", "T4": "T4"}


@functools.cache
def _h200_recordings():
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "real_gpu_h200_events.json")) as recorded:
        return json.load(recorded)["cases"]


def h200_recording(name):
    """What a real H200 recorded of the case (real_gpu_h200_events.json:
    torch 2.11, cuDNN 9.19): its steps' peaks and allocations and frees.
    The file is read once a process."""
    return _h200_recordings()[name]


def on_fake_gpu(oracle, gpu, name, torch_site=None):
    """The case run by the pinned torch on metamem's fake GPU
    (tests/python/real_torch_on_fake_gpu.py), or by the torch installed in
    the folder `torch_site`."""
    from real_torch_on_fake_gpu import PROLOGUE, measure as run_child
    events = ", 'events'" if name in EVENT_CASES else ""
    program = PROLOGUE + f"import runpy; sys.argv = [{__file__!r}, 'one', sys.argv[3]{events}]; " \
                         f"sys.path.insert(0, {os.path.dirname(__file__)!r}); " \
                         f"runpy.run_path({__file__!r}, run_name='__main__')"
    try:
        with cold_inductor_cache():
            return run_child(oracle, gpu, program, name, torch_site=torch_site)
    except RuntimeError as error:
        return {"error": str(error).strip().splitlines()[-1]}


def traced(gpu, name, fake_gpu=None):
    import metamem
    host_tensors = "host" if name in HOST_TENSOR_CASES else "device"
    try:
        torch._dynamo.reset()
        with cold_inductor_cache(), metamem.trace(device="cuda", gpu=gpu, fake_gpu=fake_gpu,
                                                  host_tensors=host_tensors) as t:
            CASES[name](lambda: None)
    except Exception as error:  # a case metamem cannot trace is a finding of the table
        return {"error": f"{type(error).__name__}: {str(error).splitlines()[0]}"}
    predicted = json.loads(t.to_json())["predicted"]
    return {"steps": t.step_peaks, "allocated": predicted["allocator_allocated_peak_bytes"],
            "reserved": t.reserved_peak_bytes, "events": traced_events(t)}


def traced_events(trace):
    """The trace's allocations and frees as [["alloc" or "free", requested
    bytes], ...], as allocator_events lists a real run's (less streams)."""
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        trace.save_allocator_events(os.path.join(folder, "events.txt"))
        lines = open(os.path.join(folder, "events.txt")).read().split("\n")[1:]
    sizes, events = {}, []
    for words in map(str.split, lines):
        if words[:1] == ["alloc"]:
            sizes[words[1]] = int(words[2])
            events.append(["alloc", sizes[words[1]]])
        elif words[:1] == ["free"]:
            events.append(["free", sizes.pop(words[1])])
    return events


def measured_run(run):
    """A measured run as traced() gives one: its steps' max allocated, the largest, max reserved."""
    if "error" in run:
        return run
    return {"steps": [a for a, _ in run["steps"]], "allocated": max(a for a, _ in run["steps"]),
            "reserved": max(r for _, r in run["steps"])}


def cell(run):
    if "error" in run:
        return "fails: " + run["error"][:100].replace("|", "/")
    return f"{', '.join(f'{a:,}' for a in run['steps'])} ({run['allocated']:,} / {run['reserved']:,})"


def compare(path, oracle=None, *names):
    import metamem._metamem as native
    measured = json.load(open(path))
    found = measured["versions"]
    key = next((key for word, key in GPU_KEYS.items() if word in found["gpu"]), None)
    if key is None:
        sys.exit(f"{path} was measured on {found['gpu']}, which is none of {', '.join(GPU_KEYS.values())}")
    print(f"real GPU: {found}\npinned: torch {torch.__version__}; metamem's {key}: {native.gpu(key)}\n")
    print("Each cell: max allocated per step (the largest as allocated in blocks / max reserved). metamem's "
          "steps are live bytes, not rounded to the allocator's blocks.\n")
    # The real GPU's own torch version on the fake GPU, where a folder holds it
    # (docs/accuracy.md): a difference from the real GPU is then the fake GPU's.
    torch_site = os.environ.get("MEASURED_TORCH")
    same_version = f" | torch {found['torch']} on the fake {key}" if torch_site and oracle else ""
    print(f"| case | real {key}{same_version} | real torch on the fake {key} | metamem, fake cuda |")
    print("|---|---|---|---|" + ("---|" if same_version else ""))
    for name, real in measured["cases"].items():
        if names and name not in names:
            continue
        gpu = native.gpu(key)
        fake = on_fake_gpu(oracle, gpu, name) if oracle else {"error": "not run"}
        same = f" | {cell(measured_run(on_fake_gpu(oracle, gpu, name, torch_site)))}" if same_version else ""
        print(f"| {name} | {cell(measured_run(real))}{same} | {cell(measured_run(fake))} | {cell(traced(key, name))} |",
              flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["one"]:
        print(json.dumps(measure_one(sys.argv[2], events=sys.argv[3:4] == ["events"])), flush=True)
        os._exit(0)  # torch can abort on a normal exit after a backward on a GPU (real_torch_on_fake_gpu.LEAVE)
    elif sys.argv[1:2] == ["measure"]:
        measure(sys.argv[2], *map(int, sys.argv[3:4]), *sys.argv[4:])
    elif sys.argv[1:2] == ["compare"]:
        compare(*sys.argv[2:])
    else:
        print(__doc__)
        sys.exit(2)
