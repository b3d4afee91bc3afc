"""The same Python GPT-2 124M training step (batch 8, sequence 1024) traced by
metamem and by PyTorch's FakeTensorMode, side by side: the whole block (the
model built inside it, forward, backward, an AdamW step, and for metamem the
peak read after the block) and its parts. FakeTensorMode runs on CPU only:
without a GPU, torch 2.x's fake CUDA tensors stop in backward (autograd asks
the CUDA driver for a context).

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


def whole_step(times, device, batch, length):
    """Builds the model, runs forward + backward and an AdamW step, noting
    each part's seconds in `times`."""
    start = time.perf_counter()
    model = GPT2()
    if device != "cpu":  # FakeTensorMode cannot swap a module's parameters for themselves
        model = model.to(device)
    built = time.perf_counter()
    forward_backward(model, device, batch, length)
    stepped = time.perf_counter()
    torch.optim.AdamW(model.parameters()).step()
    times.update(build=built - start, step=stepped - built, optimizer=time.perf_counter() - stepped)


def metamem_block(device, batch, length):
    times = {}
    start = time.perf_counter()
    with metamem.trace(device=device) as t:
        whole_step(times, device, batch, length)
    peak = t.peak_bytes
    times["block"] = time.perf_counter() - start
    return times, peak


def fake_tensor_block(batch, length):
    times = {}
    start = time.perf_counter()
    with FakeTensorMode():
        whole_step(times, "cpu", batch, length)
    times["block"] = time.perf_counter() - start
    return times, None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    args = parser.parse_args()
    torch.manual_seed(0)
    best = lambda run: min((run() for _ in range(args.repeat)), key=lambda r: r[0]["block"])
    rows = [("FakeTensorMode (cpu)", best(lambda: fake_tensor_block(args.batch, args.seq))),
            ("metamem (fake cpu)", best(lambda: metamem_block("cpu", args.batch, args.seq))),
            ("metamem (fake cuda)", best(lambda: metamem_block("cuda", args.batch, args.seq)))]
    fake = rows[0][1][0]
    print(f"GPT-2 124M, batch {args.batch}, sequence {args.seq}: model built, forward + backward, AdamW step "
          f"(ms, best of {args.repeat} by whole block)")
    print(f"{'tracer':22} {'build':>7} {'fwd+bwd':>8} {'AdamW':>7} {'block':>7} {'block x':>8} {'fwd+bwd x':>10} "
          f"{'peak':>10}")
    for name, (times, peak) in rows:
        ms = {key: 1e3 * value for key, value in times.items()}
        peak = "-" if peak is None else f"{peak / 2**30:.2f} GiB"
        print(f"{name:22} {ms['build']:7.1f} {ms['step']:8.1f} {ms['optimizer']:7.1f} {ms['block']:7.1f} "
              f"{fake['block'] / times['block']:7.1f}x {fake['step'] / times['step']:9.1f}x {peak:>10}")


if __name__ == "__main__":
    main()
