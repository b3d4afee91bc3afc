"""Hugging Face transformers architectures, built from their configs (no
weights, no network) and trained by metamem.hf.training_step: at a reduced
size, the traced peak of two AdamW steps on a fake cpu against the real CPU
run; at the config's own (published default) size, a trace on fake cuda for
an H100, with its time and peak.

    PYTHONPATH=build/python .venv/bin/python tests/python/hf_sweep.py [llama,t5,...]
        [--markdown] [--check] [--no-full]

--values placeholder reads zero where a step reads a traced value (see
metamem.trace). --check exits 1 unless every architecture listed is exact on CPU and traces
at full size.
"""
import argparse
import sys
import time

import torch

import metamem
import metamem.hf
from hf_configs import ARCHITECTURES, BATCH, FULL_SEQ, SEQ, published, reduced
from sweep_failure import why

def exact_on_cpu(model_type, values):
    step = metamem.hf.training_step(reduced(model_type), batch=BATCH, seq=SEQ, device="cpu")
    with metamem.trace(device="cpu", values=values) as t:
        step()
    return max(t.step_peaks), metamem.achieved_cpu(step)


def traced_at_full_size(model_type, values):
    cfg = published(model_type)
    start = time.perf_counter()
    t = metamem.hf.trace_step(cfg, batch=1, seq=FULL_SEQ, device="cuda", steps=1, values=values)
    seconds = time.perf_counter() - start
    params = t.json()["model_states"]["param_bytes"] // 4
    return t.peak_bytes, seconds, params


def bytes_or_dash(value):
    return "-" if value is None else f"{value:,} B"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="?", default=",".join(ARCHITECTURES), help="model types, comma-separated")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--check", action="store_true", help="exit 1 unless every model is exact and traces")
    parser.add_argument("--no-full", action="store_true", help="skip the full-size fake-cuda traces")
    parser.add_argument("--values", choices=["error", "placeholder"], default="error",
                        help="what reading a traced value does (metamem.trace's values=)")
    args = parser.parse_args()
    rows, failures = [], 0
    start = time.perf_counter()
    for model_type in args.models.split(","):
        task, architecture = metamem.hf.task_of(published(model_type))
        try:
            traced, achieved = exact_on_cpu(model_type, args.values)
            cpu = "exact" if traced == achieved else f"{traced - achieved:+,} B"
        except Exception as error:  # a sweep reports every architecture
            traced = achieved = None
            cpu = why(error)
        full = "-"
        if not args.no_full:
            try:
                peak, seconds, params = traced_at_full_size(model_type, args.values)
                full = f"{params / 1e6:,.0f}M params, {peak / 2**30:.2f} GiB, {seconds * 1e3:.0f} ms"
            except Exception as error:
                full = why(error)
        ok = cpu == "exact" and (args.no_full or "GiB" in full)
        failures += not ok
        rows.append((model_type, architecture, achieved, cpu, full))
        if not args.markdown:
            print(f"{model_type:12} {architecture:40} {bytes_or_dash(achieved):>14} {cpu:>10}  {full}", flush=True)
    if args.markdown:
        print("| model type | trained as | real CPU peak (reduced size) | metamem | full size on fake cuda (H100, batch 1, "
              f"seq {FULL_SEQ}, one AdamW step) |")
        print("| --- | --- | --- | --- | --- |")
        for model_type, architecture, achieved, cpu, full in rows:
            print(f"| {model_type} | `{architecture}` | {bytes_or_dash(achieved)} | {cpu} | {full} |")
    exact = sum(row[3] == "exact" for row in rows)
    print(f"{len(rows)} architectures in {time.perf_counter() - start:.0f} s: {exact} exact on CPU", file=sys.stderr)
    sys.exit(1 if args.check and failures else 0)


if __name__ == "__main__":
    main()
