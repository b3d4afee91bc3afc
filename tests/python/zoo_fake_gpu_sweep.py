"""The C++ zoo's training steps traced on fake cuda (`metamem profile
--device cuda`, following the fake GPU's recordings as METAMEM_FAKE_GPU
asks) against the same steps run by real torch on metamem's fake GPU as a
C++ program runs them (oracle/metamem-zoo-on-fake-gpu: the model built on
the CPU and moved with Module::to), per GPU (issue 47): max allocated and
max reserved of torch's caching allocator in the measured (last) step.

    PYTHONPATH=build/python .venv/bin/python tests/python/zoo_fake_gpu_sweep.py \\
        build/examples/metamem build/oracle [--gpus H100-80GB,T4] [--cases "gpt2 adamw;llama pp 2, stage 1"] [--check]

Prints a row per case and GPU; --check exits 1 unless every row is exact.
"""
import argparse
import json
import os
import subprocess
import sys
import time

from metamem._fake_gpu import environment

# The zoo's models at small sizes, and the step options the CLI takes.
MODELS = {
    "mlp": ["--model", "mlp", "--batch", "8"],
    "resnet18": ["--model", "resnet18", "--batch", "4", "--image", "64"],
    "resnet50": ["--model", "resnet50", "--batch", "2", "--image", "64"],
    "gpt2": ["--model", "gpt2", "--batch", "2", "--seq", "64", "--layers", "2", "--width", "128", "--heads", "4",
             "--vocab", "1000"],
    "llama": ["--model", "llama", "--batch", "2", "--seq", "64", "--layers", "2", "--width", "128", "--heads", "4",
              "--kv-heads", "2", "--vocab", "1000"],
}
OPTIONS = {
    "": [],
    "adamw": ["--optimizer", "adamw"],
    "momentum": ["--optimizer", "momentum"],
    "adamw for-loop": ["--optimizer", "adamw", "--optimizer-impl", "for-loop"],
    "amp bf16 adamw": ["--amp", "bf16", "--optimizer", "adamw"],
    "bf16 fp32 masters": ["--dtype", "bf16", "--optimizer", "adamw"],
    "bf16 fp32 main grads": ["--dtype", "bf16", "--optimizer", "adamw", "--main-grads", "fp32"],
    "grad-accum 2, zero_grad zero": ["--grad-accum", "2", "--zero-grad", "zero", "--optimizer", "sgd"],
    "checkpointed": ["--policy", "0-1"],
    "ddp 4": ["--dp", "4", "--optimizer", "adamw"],
    "zero 2 of 4": ["--dp", "4", "--zero", "2", "--optimizer", "adamw"],
    "fsdp 4": ["--dp", "4", "--fsdp", "full", "--optimizer", "adamw"],
}
TRANSFORMER_OPTIONS = {
    "selective recompute": ["--selective-recompute", "--optimizer", "adamw"],
    "tp 2, sequence parallel": ["--tp", "2", "--sequence-parallel", "--optimizer", "adamw"],
    "pp 2, stage 0": ["--pp", "2", "--stage", "0", "--microbatches", "2", "--optimizer", "adamw"],
    "pp 2, stage 1": ["--pp", "2", "--stage", "1", "--microbatches", "2", "--optimizer", "adamw"],
}
GPUS = ("H100-80GB", "A100-80GB", "T4")


def cases():
    """{name: flags} of every model with every option that applies to it."""
    out = {}
    for model, flags in MODELS.items():
        options = dict(OPTIONS, **(TRANSFORMER_OPTIONS if model in ("gpt2", "llama") else {}))
        for option, extra in options.items():
            out[f"{model} {option}".strip()] = flags + extra
    return out


def real_run(oracle, *flags):
    """metamem-zoo-on-fake-gpu run with `flags` on the fake GPU of `oracle`
    (the finished process)."""
    return subprocess.run([os.path.join(oracle, "metamem-zoo-on-fake-gpu"), *flags], env=environment(oracle),
                          capture_output=True, text=True, timeout=900)


def traced(metamem, oracle, flags):
    """`metamem profile FLAGS` following the fake GPU of `oracle`: max
    allocated and max reserved of the measured step."""
    env = dict(os.environ, METAMEM_FAKE_GPU=oracle, METAMEM_PYTHON=sys.executable)
    run = subprocess.run([metamem, "profile", *flags, "--format", "json"], env=env, capture_output=True, text=True,
                         timeout=900)
    if run.returncode != 0:
        raise RuntimeError(f"the trace failed: {run.stderr.strip()}")
    predicted = json.loads(run.stdout)["predicted"]
    return predicted["allocator_allocated_peak_bytes"], predicted["allocator_reserved_peak_bytes"]


def measured(metamem, oracle, flags, gpu):
    """(traced, real): max allocated and max reserved of the measured step."""
    flags = [*flags, "--device", "cuda", "--gpu", gpu]
    real = real_run(oracle, *flags)
    if real.returncode != 0:
        raise RuntimeError(f"the real run failed: {real.stderr.strip()}")
    steps = json.loads(real.stdout)
    return traced(metamem, oracle, flags), (steps["allocated"][-1], steps["reserved"][-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("metamem")
    parser.add_argument("oracle")
    parser.add_argument("--gpus", default=",".join(GPUS))
    parser.add_argument("--cases", default="", help="case names separated by ';' (names hold commas); default: all")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    chosen = cases()
    if args.cases:
        unknown = [name for name in args.cases.split(";") if name not in chosen]
        if unknown:
            parser.error(f"unknown cases {unknown}; known: {'; '.join(chosen)}")
        chosen = {name: chosen[name] for name in args.cases.split(";")}
    start, exact, rows = time.perf_counter(), 0, 0
    for name, flags in chosen.items():
        for gpu in args.gpus.split(","):
            rows += 1
            try:
                (traced, real) = measured(args.metamem, args.oracle, flags, gpu)
            except RuntimeError as e:
                print(f"{name:<40} {gpu:<10} error: {e}", flush=True)
                continue
            same = traced == real
            exact += same
            print(f"{name:<40} {gpu:<10} {'exact' if same else 'differs'}  real {real[0]:,} / {real[1]:,}"
                  f"  traced {traced[0] - real[0]:+,} / {traced[1] - real[1]:+,}", flush=True)
    print(f"{exact} of {rows} exact, {time.perf_counter() - start:.0f} s")
    return 0 if exact == rows or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
