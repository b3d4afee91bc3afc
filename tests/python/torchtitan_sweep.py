"""torchtitan's Llama 3 presets traced per rank on fake H100s
(metamem.torchtitan): each rank's peak and what it reserves, the trace's
time, as torchtitan ships the preset (405B compiled, with float8) and, for
a preset that compiles or takes float8, eager in bf16; then, eager in bf16,
the largest local batch that fits 80 GiB, and which activation
checkpointing does.

    PYTHONPATH=build/python .venv/bin/python tests/python/torchtitan_sweep.py [8B,70B,405B] [--markdown] [--ranks-only]

Ranks 0 and the last are traced; a layout of FSDP and tensor parallelism
differs between ranks only in the padding of uneven shards.
"""
import argparse
import time

import metamem
import metamem.torchtitan as titan
from metamem.cli import compiled_float8

GIB = 1 << 30
GPU = "H100-80GB"


def traced(flavor, rank, **overrides):
    start = time.perf_counter()
    t = titan.trace(flavor, rank=rank, gpu=GPU, **overrides)
    return max(t.step_peaks), t.reserved_peak_bytes, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("flavors", nargs="?", default="8B,70B,405B")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--ranks-only", action="store_true", help="the first table alone")
    args = parser.parse_args()
    capacity = metamem.gpu_memory(GPU)["allocator_bytes"]
    print(f"{GPU}: {capacity / GIB:.2f} GiB left to the allocator beside the CUDA context")
    ranks = ["| preset | GPUs | local batch × seq | TP | AC | run | rank | peak | reserved | trace |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    answers = ["| preset | largest local batch (eager bf16) | AC at the preset's batch: reserved (fits) |",
               "|---|---|---|"]
    eager = {"compile": False, "float8": False}
    for flavor in args.flavors.split(","):
        preset = titan.PRESETS[flavor]
        runs = [("as shipped" + compiled_float8(preset.compile, preset.float8), {})]
        if preset.compile or preset.float8:
            runs.append(("eager bf16", eager))
        for run, settings in runs:
            for rank in (0, preset.world_size - 1):
                peak, reserved, seconds = traced(flavor, rank, **settings)
                ranks.append(f"| {flavor} | {preset.world_size} | {preset.local_batch_size} × {preset.seq_len} | "
                             f"{preset.tensor_parallel} | {preset.activation_checkpoint} | {run} | {rank} | "
                             f"{peak / GIB:.2f} GiB | {reserved / GIB:.2f} GiB | {seconds:.1f} s |")
                print(ranks[-1], flush=True)
        if args.ranks_only:
            continue
        modes = []
        for mode in ("none", "selective", "full"):
            _, reserved, _ = traced(flavor, 0, activation_checkpoint=mode, **eager)
            modes.append(f"{mode} {reserved / GIB:.2f} GiB ({'yes' if reserved <= capacity else 'no'})")
        batch = titan.largest_batch(flavor, gpu=GPU, **eager)
        answers.append(f"| {flavor} | {batch} ({preset.activation_checkpoint} AC) | {', '.join(modes)} |")
        print(answers[-1], flush=True)
    if args.markdown:
        print("\n".join(ranks) + "\n\n" + "\n".join(answers))


if __name__ == "__main__":
    main()
