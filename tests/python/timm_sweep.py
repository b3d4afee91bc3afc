"""timm models, built from timm's registry (no weights): a training step of
each (batch 2, its own input size, cross entropy over its classes, two AdamW
steps) traced on a fake cpu against the real CPU run, and on fake cuda for
an H100 with the trace's time.

    PYTHONPATH=build/python .venv/bin/python tests/python/timm_sweep.py [resnet10t,...]
        [--markdown] [--check] [--pick]

The models are the two smallest (by parameter count, at most 60M) of each
of timm's model modules; --pick lists them again from the installed timm
(about a minute and a half). --check exits 1 unless every model listed is
exact on CPU and traces on fake cuda.
"""
import argparse
import sys
import time

import timm
import torch

import metamem
import metamem.timm
from sweep_failure import why
from timm_models import MODELS, pick

BATCH = 2


def sweep_one(name):
    torch.manual_seed(0)
    model = timm.create_model(name)
    step = metamem.timm.training_step(model, BATCH, "cpu")
    try:
        with metamem.trace(device="cpu", modules=[model]) as t:
            step()
        traced, achieved = max(t.step_peaks), metamem.achieved_cpu(step, modules=[model])
        cpu = "exact" if traced == achieved else f"{traced - achieved:+,} B"
    except Exception as error:  # a sweep reports every model
        achieved, cpu = None, why(error)
    try:
        start = time.perf_counter()
        with metamem.trace(device="cuda", modules=[model]) as t:
            metamem.timm.training_step(model, BATCH, "cuda")()
        cuda = f"{t.peak_bytes / 2**20:,.0f} MiB, {(time.perf_counter() - start) * 1e3:.0f} ms"
    except Exception as error:
        cuda = why(error)
    params = sum(p.numel() for p in model.parameters())
    return params, model.pretrained_cfg["input_size"], achieved, cpu, cuda


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="?", default=",".join(MODELS), help="timm model names, comma-separated")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--check", action="store_true", help="exit 1 unless every model is exact and traces")
    parser.add_argument("--pick", action="store_true", help="print the models a sweep takes from this timm")
    args = parser.parse_args()
    if args.pick:
        print("\n".join(pick()))
        return
    rows, start = [], time.perf_counter()
    if args.markdown:
        print(f"| model | parameters | input | real CPU peak | metamem | fake cuda (H100): peak, trace time |")
        print("| --- | --- | --- | --- | --- | --- |")
    for name in args.models.split(","):
        params, size, achieved, cpu, cuda = sweep_one(name)
        rows.append((name, cpu, cuda))
        shown = "-" if achieved is None else f"{achieved:,} B"
        if args.markdown:
            print(f"| {name} | {params / 1e6:.1f}M | {'x'.join(map(str, size))} | {shown} | {cpu} | {cuda} |", flush=True)
        else:
            print(f"{name:34} {params / 1e6:6.1f}M {shown:>16} {cpu:>10}  {cuda}", flush=True)
    exact = sum(cpu == "exact" for _, cpu, _ in rows)
    traced = sum("MiB" in cuda for _, _, cuda in rows)
    print(f"{len(rows)} models in {time.perf_counter() - start:.0f} s: {exact} exact on CPU, {traced} traced on fake cuda",
          file=sys.stderr)
    sys.exit(1 if args.check and (exact < len(rows) or traced < len(rows)) else 0)


if __name__ == "__main__":
    main()
