"""transformers' decoders of the sweeps (hf_configs.ARCHITECTURES) in a
pipeline of two stages, as `metamem profile --hf TYPE --pp 2` splits and
trains them: each rank's traced peak on a fake cpu against real gloo
processes running the same step (distributed_steps.hf_pipeline: the
reduced size with three layers, batch 2 in two microbatches). Decoders
transformers gives no pipeline plan are listed with the reason.

    PYTHONPATH=build/python:tests/python .venv/bin/python tests/python/pipeline_sweep.py [llama,gpt_neox,...]
        [--world 2|4] [--check]

--world 4 puts FSDP2 over two ranks in each stage. --check exits 1 unless
every split decoder is exact on every rank.
"""
import argparse
import functools
import os
import sys
import tempfile
import time

import metamem
from distributed_steps import gloo_peaks, hf_pipeline
from hf_configs import ARCHITECTURES, reduced
from metamem._pipeline import pipeline_refusal


def decoders():
    """The sweeps' architectures whose trained head predicts tokens."""
    from metamem._hf_tasks import task_of

    return [model_type for model_type in ARCHITECTURES if task_of(reduced(model_type))[0] == "causal"]


def compared(model_type, world):
    """({rank: least real peak}, {rank: traced peak}, seconds to trace every rank)."""
    step = functools.partial(hf_pipeline, model_type=model_type)
    with tempfile.TemporaryDirectory() as folder:
        real = gloo_peaks(step, world, os.path.join(folder, "store"))
    traced, start = {}, time.perf_counter()
    for rank in range(world):
        with metamem.trace(device="cpu", world_size=world, rank=rank) as t:
            step(world)
        traced[rank] = max(t.step_peaks)
    return {rank: min(peaks) for rank, peaks in real.items()}, traced, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="?", help="comma-separated model types (default: the sweeps' decoders)")
    parser.add_argument("--world", type=int, choices=[2, 4], default=2)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    models = args.models.split(",") if args.models else decoders()
    print(f"| model | ranks | real peak per rank (B) | traced - real (B) | trace, every rank |")
    print("| --- | --- | --- | --- | --- |")
    exact = True
    for model_type in models:
        cfg = reduced(model_type)
        cfg.num_hidden_layers = 3
        refusal = pipeline_refusal(cfg, 2)
        if refusal:
            print(f"| {model_type} | - | refused: {refusal} | | |", flush=True)
            continue
        real, traced, seconds = compared(model_type, args.world)
        differences = [traced[rank] - real[rank] for rank in sorted(real)]
        exact &= not any(differences)
        print(f"| {model_type} | {args.world} | {', '.join(f'{real[r]:,}' for r in sorted(real))} | "
              f"{', '.join(f'{d:+,}' for d in differences)} | {seconds:.1f} s |", flush=True)
    return 0 if exact or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
