"""Compiled training steps of eleven models (compiled_models.py), each traced
and run for real, eager and compiled: on a fake cpu against the real run
(Inductor's C++ backend, metamem.achieved_cpu), on fake cuda for an H100
against real torch on the fake GPU (max allocated and max reserved of both
steps). Each side compiles from a cold Inductor cache of its own.

    METAMEM_ORACLE=build/oracle PYTHONPATH=build/python:tests/python .venv/bin/python \\
        tests/python/compile_sweep.py ["Llama,BERT"] [--markdown] [--check] [--mode reduce-overhead [--evaluate]]

--check exits 1 unless every model is exact on both devices. --mode compiles
with torch.compile's mode, on fake cuda only, four steps (CUDA graph trees:
warm-up, recording, two replays); with --evaluate, five, the fourth an
evaluation under torch.no_grad() (a tree that switches paths). Without
METAMEM_ORACLE (or where it holds no fake CUDA libraries) the fake-cuda
column is the trace alone.
"""
import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
import time

import torch

import metamem
import metamem._metamem as native
from compiled_models import MODELS, NOT_ON_CPU, two_adamw_steps
from sweep_failure import why

GPU = "H100-80GB"
HERE = os.path.dirname(os.path.abspath(__file__))
# Run after real_torch_on_fake_gpu's COLLECTING_COMPILES: each compile's
# garbage collected as a trace collects it.
CHILD = f"""
sys.path.insert(0, {HERE!r})
from compiled_models import two_adamw_steps
name, compile, mode, steps, evaluate_at = json.loads(sys.argv[3])
print(json.dumps(two_adamw_steps(name, "cuda", compile, mode, steps, evaluate_at)[1]()), flush=True)
"""


def timed(function):
    start = time.perf_counter()
    result = function()
    return result, time.perf_counter() - start


def cold_cache():
    """A cold Inductor cache for what follows (and the child it starts),
    removed when the process ends."""
    cache = tempfile.mkdtemp(prefix="inductor-")
    atexit.register(shutil.rmtree, cache, True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    torch._dynamo.reset()


def on_cpu(name, compile):
    """(traced, real, trace seconds, real seconds): peak bytes of two steps."""
    cold_cache()
    model, run = two_adamw_steps(name, "cpu", compile)
    with metamem.trace(device="cpu", modules=[model]) as t:
        _, trace_seconds = timed(run)
    model, run = two_adamw_steps(name, "cpu", compile)
    real, real_seconds = timed(lambda: metamem.achieved_cpu(run, modules=[model]))
    return max(t.step_peaks), real, trace_seconds, real_seconds


def on_cuda(name, compile, oracle, mode=None, evaluate=False):
    """(traced, real or None, trace seconds, real seconds): each step's
    [max allocated, max reserved]."""
    cold_cache()
    steps = 2 if mode is None else 5 if evaluate else 4
    evaluate_at = [3] if evaluate else []
    model, run = two_adamw_steps(name, "cuda", compile, mode, steps, evaluate_at)
    with metamem.trace(device="cuda", gpu=GPU, modules=[model]):
        traced, trace_seconds = timed(run)
    if not oracle:
        return traced, None, trace_seconds, 0.0
    from real_torch_on_fake_gpu import COLLECTING_COMPILES, PROLOGUE, measure

    cold_cache()
    real, real_seconds = timed(lambda: measure(oracle, native.gpu(GPU), PROLOGUE + COLLECTING_COMPILES + CHILD, json.dumps([name, compile, mode, steps, evaluate_at])))
    return traced, real, trace_seconds, real_seconds


def compared(traced, real):
    """'exact', or how far the trace is from the real run."""
    if real is None:
        return "not run"
    if traced == real:
        return "exact"
    if isinstance(traced, int):
        return f"{traced - real:+,} B"
    return "; ".join(f"{t[0] - r[0]:+,} / {t[1] - r[1]:+,} B" for t, r in zip(traced, real))


def steps(peaks):
    return "; ".join(f"{a / 2**20:.2f} / {r / 2**20:.0f}" for a, r in peaks)


def sweep_one(name, oracle, mode=None, evaluate=False):
    row = {"name": name}
    if mode is not None:
        try:
            traced, real, trace_s, real_s = on_cuda(name, True, oracle, mode, evaluate)
            row[f"cuda {mode}"] = (steps(traced), compared(traced, real), f"{trace_s:.1f} / {real_s:.1f} s")
        except Exception as error:
            row[f"cuda {mode}"] = ("-", why(error), "")
        return row
    for compile in (False, True):
        kind = "compiled" if compile else "eager"
        try:
            if name in NOT_ON_CPU:
                row[f"cpu {kind}"] = ("-", "not run", NOT_ON_CPU[name])
            else:
                traced, real, trace_s, real_s = on_cpu(name, compile)
                row[f"cpu {kind}"] = (f"{traced:,}", compared(traced, real), f"{trace_s:.1f} / {real_s:.1f} s")
        except Exception as error:  # a sweep reports every model
            row[f"cpu {kind}"] = ("-", why(error), "")
        try:
            traced, real, trace_s, real_s = on_cuda(name, compile, oracle)
            row[f"cuda {kind}"] = (steps(traced), compared(traced, real), f"{trace_s:.1f} / {real_s:.1f} s")
        except Exception as error:
            row[f"cuda {kind}"] = ("-", why(error), "")
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="?", default=",".join(MODELS), help="model names, comma-separated")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    parser.add_argument("--check", action="store_true", help="exit 1 unless every model is exact")
    parser.add_argument("--mode", help="torch.compile's mode (fake cuda only, four steps)")
    parser.add_argument("--evaluate", action="store_true",
                        help="with --mode: five steps, the fourth an evaluation under torch.no_grad()")
    args = parser.parse_args()
    oracle = os.environ.get("METAMEM_ORACLE", "")
    if oracle and not os.path.exists(os.path.join(oracle, "libmetamem_fake_cuda_preload.so")):
        oracle = ""
    if args.evaluate and not args.mode:
        parser.error("--evaluate takes --mode: only CUDA graph trees switch paths")
    unknown = set(args.models.split(",")) - set(MODELS)
    if unknown:
        parser.error(f"no model {', '.join(sorted(unknown))}; the models: {', '.join(MODELS)}")
    rows, start = [], time.perf_counter()
    for name in args.models.split(","):
        row = sweep_one(name, oracle, args.mode, args.evaluate)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr if args.markdown else sys.stdout, flush=True)
    if args.markdown and args.mode:
        print(f"| model | fake cuda ({GPU}), mode={args.mode!r}, MiB allocated / reserved per step | "
              "vs real on the fake GPU | trace / real |")
        print("| --- | --- | --- | --- |")
        for row in rows:
            print(f"| {row['name']} | {' | '.join(row[f'cuda {args.mode}'])} |")
    elif args.markdown:
        print("| model | CPU eager peak | CPU compiled peak | vs real | trace / real | "
              f"fake cuda ({GPU}) eager, MiB allocated / reserved per step | compiled | vs real on the fake GPU | "
              "trace / real |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for row in rows:
            ce, cc, ge, gc = row["cpu eager"], row["cpu compiled"], row["cuda eager"], row["cuda compiled"]
            eager_cpu = ce[0] if ce[1] == "exact" else f"{ce[0]} ({ce[1]})"
            eager_gpu = ge[0] if ge[1] in ("exact", "not run") else f"{ge[0]} ({ge[1]})"
            print(f"| {row['name']} | {eager_cpu} | {cc[0]} | {cc[1]} | {cc[2]} | {eager_gpu} | {gc[0]} | {gc[1]} | "
                  f"{gc[2]} |")
    exact = sum(all(row[key][1] in ("exact", "not run") for key in row if key != "name") for row in rows)
    print(f"{len(rows)} models in {time.perf_counter() - start:.0f} s: {exact} exact on both devices", file=sys.stderr)
    sys.exit(1 if args.check and exact < len(rows) else 0)


if __name__ == "__main__":
    main()
