"""The same Python GPT-2 124M training step (batch 8, sequence 1024) traced by
metamem and by PyTorch's FakeTensorMode, side by side: the traced step is
forward and backward of a model already built in each mode (FakeTensorMode
in torch 1.13 runs neither CUDA nor an optimizer step; metamem runs both,
timed separately below).

    PYTHONPATH=build/python .venv/bin/python bench/python_gpt2_bench.py [--repeat 3]
"""

import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import metamem


class Attention(nn.Module):
    def __init__(self, width, heads, context):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.register_buffer("causal", torch.ones(context, context, dtype=torch.bool).tril().view(1, 1, context, context))

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        scores = scores.masked_fill(~self.causal[:, :, :length, :length], float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    def __init__(self, width, heads, context):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads, context)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, vocab=50257, context=1024, width=768, layers=12, heads=12):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.h = nn.ModuleList(Block(width, heads, context) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.size(1), device=tokens.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def forward_backward(model, device, batch, length):
    tokens = torch.randint(0, 50257, (batch, length), device=device)
    logits = model(tokens)
    F.cross_entropy(logits.view(-1, logits.size(-1)), tokens.view(-1)).backward()


def timed(run):
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def metamem_step(device, batch, length):
    """Seconds for forward + backward, for the whole block, and the trace."""
    times = {}
    start = time.perf_counter()
    with metamem.trace(device=device) as t:
        model = GPT2().to(device)
        times["step"] = timed(lambda: forward_backward(model, device, batch, length))
        opt = torch.optim.AdamW(model.parameters())
        times["optimizer"] = timed(opt.step)
    times["block"] = time.perf_counter() - start
    return times, t


def fake_tensor_step(batch, length):
    with FakeTensorMode():
        model = GPT2()
        return timed(lambda: forward_backward(model, "cpu", batch, length))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    args = parser.parse_args()
    torch.manual_seed(0)
    best = lambda runs: min(runs, key=lambda r: r[0]["step"])
    cpu, cpu_trace = best([metamem_step("cpu", args.batch, args.seq) for _ in range(args.repeat)])
    cuda, cuda_trace = best([metamem_step("cuda", args.batch, args.seq) for _ in range(args.repeat)])
    fake = min(fake_tensor_step(args.batch, args.seq) for _ in range(args.repeat))
    print(f"GPT-2 124M, batch {args.batch}, sequence {args.seq}, forward + backward (best of {args.repeat})")
    print(f"{'tracer':28} {'step ms':>9} {'speed-up':>9} {'optimizer ms':>13} {'whole block ms':>15} {'peak':>10}")
    print(f"{'FakeTensorMode (cpu)':28} {1e3 * fake:9.1f} {1:8.1f}x {'-':>13} {'-':>15} {'-':>10}")
    for name, times, t in (("metamem (fake cpu)", cpu, cpu_trace), ("metamem (fake cuda)", cuda, cuda_trace)):
        print(f"{name:28} {1e3 * times['step']:9.1f} {fake / times['step']:8.1f}x {1e3 * times['optimizer']:13.1f} "
              f"{1e3 * times['block']:15.1f} {t.peak_bytes / 2**30:7.2f} GiB")


if __name__ == "__main__":
    main()
