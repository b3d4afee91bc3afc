"""A torch.compile'd GPT-2 124M training step (the model built, compiled,
forward + backward, an AdamW step), traced beside the same step compiled
and run for real, each from a cold Inductor cache of its own: how long a
trace of compiled code takes (Dynamo, AOTAutograd and Inductor's code
generation; no kernel built) against the real compile (the same, and
building every kernel) and step, and the peaks of both. On a fake cpu the
real step is Inductor's C++ backend on this machine's CPU; on fake cuda
(--device cuda) it is the pinned torch on metamem's fake GPU for an H100
(oracle/, built in build/oracle), where Triton builds its cubins.

    PYTHONPATH=build/python .venv/bin/python bench/compile_gpt2_bench.py [--batch 2 --seq 256] [--device cuda]
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


def compiled_step(batch, length, device="cpu"):
    """The step; on cuda it returns max allocated and max reserved."""
    def step():
        torch.manual_seed(0)
        model = GPT2().to(device)
        optimizer = torch.optim.AdamW(model.parameters())
        forward_backward(torch.compile(model), device, batch, length)
        optimizer.step()
        if device == "cuda":
            return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    return step


# The real step on the fake GPU, in a child of its own (argv[3]: batch, sequence).
CHILD = f"""
import time
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from compile_gpt2_bench import compiled_step
start = time.perf_counter()
peaks = compiled_step(*json.loads(sys.argv[3]), device="cuda")()
print(json.dumps([*peaks, time.perf_counter() - start]))
"""


def on_fake_gpu(oracle, batch, length):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
    import metamem._metamem as native
    from real_torch_on_fake_gpu import PROLOGUE, measure

    allocated, reserved, seconds = measure(oracle, native.gpu("H100-80GB"), PROLOGUE + CHILD,
                                           f"[{batch}, {length}]")
    return (allocated, reserved), seconds


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
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--oracle", default="build/oracle", help="the fake GPU's libraries (--device cuda)")
    args = parser.parse_args()
    step = compiled_step(args.batch, args.seq, args.device)

    def trace():
        with metamem.trace(device=args.device, gpu="H100-80GB") as t:
            peaks = step()
        return peaks or max(t.step_peaks)

    traced, trace_seconds = in_cold_cache(trace)
    _, again_seconds = timed(trace)  # the same cache: Inductor's FX graph cache answers
    if args.device == "cuda":
        with tempfile.TemporaryDirectory(prefix="metamem-inductor-") as cache:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
            real, real_seconds = on_fake_gpu(args.oracle, args.batch, args.seq)
        where, what = "an H100: real torch on metamem's fake GPU", "max allocated / reserved"
    else:
        real, real_seconds = in_cold_cache(lambda: metamem.achieved_cpu(step))
        where, what = "this machine's CPU", "peak"
    print(f"compiled GPT-2 124M, batch {args.batch}, sequence {args.seq}, AdamW, on {where}")
    print(f"  trace, cold cache         {trace_seconds:7.1f} s   {what} {shown(traced)} B")
    print(f"  trace again               {again_seconds:7.1f} s")
    print(f"  real compile + step, cold {real_seconds:7.1f} s   {what} {shown(real)} B")
    if args.device == "cuda":
        print(f"  traced {'equals' if tuple(traced) == tuple(real) else 'differs from'} real")
    else:
        print(f"  traced - real             {traced - real:+,} B")


def shown(peaks):
    """A peak, or max allocated / max reserved."""
    return " / ".join(f"{bytes_:,}" for bytes_ in (peaks if isinstance(peaks, tuple) else (peaks,)))


if __name__ == "__main__":
    main()
