"""Llama-3-8B- and Mixtral-8x7B-shaped training steps on one H100, traced at
their real sizes: bf16, AdamW, sequence 8192, SDPA as the H100 runs it
(cuDNN attention under torch 2.14). For each: the trace's time and peak at
batch 1, with and without activation checkpointing, and the largest batch
whose reserved memory fits the GPU. Prints a Markdown table for the README.

    python tests/python/large_models.py [--seq 8192] [--gpu H100-80GB]
"""

import argparse
import time

import torch
import transformers

import metamem
import metamem.hf as hf
from attention_kernels import AttentionKernels

GiB = 1024 ** 3

# The published shapes (meta-llama/Meta-Llama-3-8B's and
# mistralai/Mixtral-8x7B-v0.1's config.json); the rest is each type's default.
MODELS = {
    "Llama-3-8B": ("LlamaForCausalLM", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                            num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                            max_position_embeddings=8192)),
    "Mixtral-8x7B": ("MixtralForCausalLM", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                                num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                                                num_local_experts=8, num_experts_per_tok=2,
                                                max_position_embeddings=32768)),
}


def measure(cfg, seq, gpu, checkpointing):
    step = hf.training_step(cfg, 1, seq, device="cuda", dtype="bf16", optimizer="adamw", steps=2,
                            checkpointing=checkpointing)
    started = time.perf_counter()
    with metamem.trace(device="cuda", gpu=gpu) as t:
        with AttentionKernels() as kernels:
            step()
    seconds = time.perf_counter() - started
    return seconds, t.peak_bytes, t.reserved_peak_bytes, {name for name in kernels.names if "backward" not in name}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--gpu", default="H100-80GB")
    args = parser.parse_args()
    memory = metamem._metamem.gpu(args.gpu)["total_memory"]
    print(f"{args.gpu}: {memory / GiB:.2f} GiB; bf16, AdamW, sequence {args.seq}, two steps\n")
    print("| model | parameters | checkpointing | attention | trace (batch 1) | peak (batch 1) "
          "| reserved (batch 1) | largest batch that fits |")
    print("|---|---:|---|---|---:|---:|---:|---:|")
    for name, (architecture, shape) in MODELS.items():
        cfg = hf.config(architecture, **shape)
        with torch.device("meta"):
            parameters = sum(p.numel() for p in getattr(transformers, architecture)._from_config(cfg).parameters())
        for checkpointing in (False, True):
            seconds, peak, reserved, kernels = measure(cfg, args.seq, args.gpu, checkpointing)
            started = time.perf_counter()
            batch = hf.largest_batch(cfg, args.seq, args.gpu, dtype="bf16", optimizer="adamw",
                                     checkpointing=checkpointing)
            search = time.perf_counter() - started
            print(f"| {name} | {parameters / 1e9:.2f}B | {'every layer' if checkpointing else 'none'} "
                  f"| {', '.join(sorted(kernels)) or 'math'} | {seconds * 1000:.0f} ms | {peak / GiB:.2f} GiB "
                  f"| {reserved / GiB:.2f} GiB | {batch} ({search:.1f} s to search) |", flush=True)


if __name__ == "__main__":
    main()
