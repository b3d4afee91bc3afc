"""metamem beside the estimators PyTorch and Hugging Face ship, on the same
training step (Hugging Face transformers models at the sweep's reduced
width, 2 layers of 64, built, then one AdamW step at batch 8, sequence 96
by default: MemTracker follows one iteration; metamem.hf builds them), on
CPU, where the real run is the truth:

- torch's MemTracker (torch.distributed._tools.mem_tracker) watching the
  real run: every tensor storage live at the dispatcher, rounded as it
  rounds them;
- FakeTensorMode + MemTracker: the same step without data, as PyTorch's
  docs estimate a step without running it;
- accelerate's `estimate-memory` logic: the model's parameter bytes (on the
  meta device) times four for AdamW in float32 (weights, gradients, two
  moments), as `accelerate estimate-memory` reports training;
- metamem.trace on a fake cpu.

DeepSpeed's estimators (estimate_zero2/3_model_states_mem_needs) cover ZeRO's
model states under mixed precision only, and PyPI has no wheel of a current
DeepSpeed (its source build needs torch at build time): not run.

    PYTHONPATH=build/python .venv/bin/python tests/python/anchors.py [gpt2,llama,...] [--markdown]
"""
import argparse
import sys
import time

import torch
from accelerate.commands.estimate import estimate_training_usage
from accelerate.utils import calculate_maximum_sizes
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker

import metamem
import metamem.hf
from hf_configs import reduced
from sweep_failure import why

MODELS = ["gpt2", "llama", "mistral", "qwen2", "gemma2", "phi3", "mixtral", "bert", "roberta", "t5", "whisper",
          "swin", "clip"]


def timed(run):
    start = time.perf_counter()
    value = run()
    return value, time.perf_counter() - start


def mem_tracker_peak(step, fake):
    def run():
        tracker = MemTracker()
        if fake:
            with FakeTensorMode(), tracker:
                step()
        else:
            with tracker:
                step()
        return max(snapshot["Total"] for snapshot in tracker.get_tracker_snapshot("peak").values())
    return run


def accelerate_estimate(cfg):
    transformers = metamem.hf._transformers()
    model_class = getattr(transformers, metamem.hf.task_of(cfg)[1])
    with torch.device("meta"):
        model = model_class._from_config(cfg, dtype=torch.float32)
    total, _ = calculate_maximum_sizes(model)
    return max(estimate_training_usage(total, "float32").values())


def traced_peak(step):
    with metamem.trace(device="cpu") as t:
        step()
    return max(t.step_peaks)


def anchors_of(model_type, batch, seq):
    cfg = reduced(model_type)
    step = metamem.hf.training_step(cfg, batch=batch, seq=seq, device="cpu", steps=1)
    truth, real_seconds = timed(lambda: metamem.achieved_cpu(step))
    tools = {
        "metamem": lambda: traced_peak(step),
        "MemTracker (real run)": mem_tracker_peak(step, fake=False),
        "FakeTensorMode + MemTracker": mem_tracker_peak(step, fake=True),
        "accelerate estimate-memory": lambda: accelerate_estimate(cfg),
    }
    results = {}
    for name, run in tools.items():
        try:
            results[name] = timed(run)
        except Exception as error:  # an anchor that cannot run this step says why
            results[name] = (why(error), 0.0)
    return truth, real_seconds, results


def cell(value, seconds, truth):
    if isinstance(value, str):
        return value
    error = value - truth
    share = f" ({100 * error / truth:+.1f}%)" if error else ""
    return f"{error:+,} B{share}, {seconds * 1e3:.0f} ms"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="?", default=",".join(MODELS), help="model types, comma-separated")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=96, help="within the reduced configs' 128 positions")
    args = parser.parse_args()
    names = ["metamem", "MemTracker (real run)", "FakeTensorMode + MemTracker", "accelerate estimate-memory"]
    if args.markdown:
        print("| model | real CPU peak (run time) | " + " | ".join(f"{n}: error, time" for n in names) + " |")
        print("| --- | --- |" + " --- |" * len(names))
    for model_type in args.models.split(","):
        truth, real_seconds, results = anchors_of(model_type, args.batch, args.seq)
        cells = [cell(*results[n], truth) for n in names]
        if args.markdown:
            print(f"| {model_type} | {truth:,} B ({real_seconds * 1e3:.0f} ms) | " + " | ".join(cells) + " |",
                  flush=True)
        else:
            print(model_type, f"{truth:,} B", *[f"{n}: {c}" for n, c in zip(names, cells)], sep="\n  ", flush=True)


if __name__ == "__main__":
    sys.exit(main())
