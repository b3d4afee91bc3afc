"""A torch.compile'd GPT-2 124M training step (the model built, compiled,
forward + backward, an AdamW step), traced on a fake cpu beside the same
step compiled and run for real on the CPU, each from a cold Inductor cache
of its own: how long a trace of compiled code takes (Dynamo, AOTAutograd and
Inductor's code generation; no kernel built) against the real compile (the
same, and building every C++ kernel) and step, and the peaks of both.

    PYTHONPATH=build/python .venv/bin/python bench/compile_gpt2_bench.py [--batch 2 --seq 256]
"""

import argparse
import os
import sys
import tempfile
import time

import torch

import metamem

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_gpt2_bench import GPT2, forward_backward  # noqa: E402  (the same model)


def compiled_step(batch, length):
    def step():
        torch.manual_seed(0)
        model = GPT2()
        optimizer = torch.optim.AdamW(model.parameters())
        forward_backward(torch.compile(model), "cpu", batch, length)
        optimizer.step()
    return step


def timed(run):
    start = time.perf_counter()
    result = run()
    return result, time.perf_counter() - start


def in_cold_cache(run):
    """`run` with an Inductor cache of its own and Dynamo reset."""
    with tempfile.TemporaryDirectory(prefix="metamem-inductor-") as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        torch._dynamo.reset()
        return timed(run)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=256)
    args = parser.parse_args()
    step = compiled_step(args.batch, args.seq)

    def trace():
        with metamem.trace(device="cpu") as t:
            step()
        return max(t.step_peaks)

    traced, trace_seconds = in_cold_cache(trace)
    _, again_seconds = timed(trace)  # the same cache: Inductor's FX graph cache answers
    real, real_seconds = in_cold_cache(lambda: metamem.achieved_cpu(step))
    print(f"compiled GPT-2 124M, batch {args.batch}, sequence {args.seq}, AdamW, on this machine's CPU")
    print(f"  trace, cold cache         {trace_seconds:7.1f} s   peak {traced:,} B")
    print(f"  trace again               {again_seconds:7.1f} s")
    print(f"  real compile + step, cold {real_seconds:7.1f} s   peak {real:,} B")
    print(f"  traced - real             {traced - real:+,} B")


if __name__ == "__main__":
    main()
