"""fake_gpu_sweep.py's runs (two AdamW steps, cuDNN on as torch has it) on
a real GPU, and the same runs on the fake GPU against that measurement:
whether the fake GPU holds what a real one holds, max allocated and max
reserved of each step.

    # on the GPU machine (needs no metamem): a child per run, `jobs` at once
    python3 tests/python/real_gpu_sweep.py measure h200_sweep.json [jobs]
    # here: the fake GPU of that name, with the pinned torch, or with the
    # torch and libraries of the folder MEASURED_TORCH (docs/accuracy.md)
    METAMEM_ORACLE=build/oracle PYTHONPATH=build/python .venv/bin/python \\
        tests/python/real_gpu_sweep.py compare tests/python/real_gpu_h200_sweep.json [jobs] [model-prefix]

A measurement is written after each run, so that one cut short keeps what
it measured.
"""
import concurrent.futures
import importlib.metadata as metadata
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import fake_gpu_sweep  # noqa: E402
import real_gpu  # noqa: E402

CHILD = ("import sys, json; from fake_gpu_sweep import two_steps; "
         "print(json.dumps(two_steps(sys.argv[1], sys.argv[2], True)[1]()), flush=True)")


def measured_run(name, precision):
    """A run in a child on this machine's GPU: (steps or the error, seconds)."""
    start = time.perf_counter()
    # _hf_tasks is found by its path in metamem's source folder: no metamem is built here.
    source = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([source, HERE])}
    try:
        child = subprocess.run([sys.executable, "-c", CHILD, name, precision], capture_output=True, text=True,
                               timeout=240, env=env)
        out = child.stdout.strip().splitlines()
        result = json.loads(out[-1]) if out and out[-1].startswith("[") else \
            (child.stderr.strip().splitlines() or [f"exit {child.returncode}"])[-1]
    except subprocess.TimeoutExpired:
        result = "timeout"
    return result, round(time.perf_counter() - start, 1)


def measure(path, jobs=14):
    found = {**real_gpu.versions(), "timm": metadata.version("timm")}
    timm = [name for name in fake_gpu_sweep.MODELS if name.startswith("timm ")]
    runs = [(name, precision) for name in [n for n in fake_gpu_sweep.MODELS if n not in timm] + timm
            for precision in fake_gpu_sweep.PRECISIONS]
    results = {}
    with concurrent.futures.ThreadPoolExecutor(int(jobs)) as pool:
        children = {pool.submit(measured_run, *run): run for run in runs}
        for child in concurrent.futures.as_completed(children):
            name, precision = children[child]
            results.setdefault(name, {})[precision] = child.result()
            with open(path, "w") as out:
                json.dump({"versions": found, "runs": results}, out, indent=0)


def compare(path, jobs=2, prefix=""):
    import metamem._metamem as native
    from real_torch_on_fake_gpu import PROLOGUE, measure as on_fake_gpu

    measured = json.load(open(path))
    gpu = next(key for word, key in real_gpu.GPU_KEYS.items() if word in measured["versions"]["gpu"])
    runs = [(name, precision, steps) for name, by_precision in measured["runs"].items() if name.startswith(prefix)
            for precision, (steps, _) in by_precision.items() if not isinstance(steps, str)]

    def fake(run):
        name, precision, _ = run
        try:
            return on_fake_gpu(os.environ["METAMEM_ORACLE"], native.gpu(gpu), PROLOGUE + fake_gpu_sweep.CHILD,
                               json.dumps([name, precision, True]), torch_site=os.environ.get("MEASURED_TORCH"))
        except RuntimeError as error:
            return str(error).strip().splitlines()[-1]

    equal = 0
    with concurrent.futures.ThreadPoolExecutor(int(jobs)) as pool:
        for (name, precision, real), steps in zip(runs, pool.map(fake, runs)):
            equal += steps == real
            print(f"{name} | {precision} | " + ("exact" if steps == real else f"real {real}, fake {steps}"),
                  flush=True)
    print(f"{len(runs)} runs measured on the real {gpu}: {equal} exact on the fake one")


if __name__ == "__main__":
    if sys.argv[1:2] == ["measure"]:
        measure(*sys.argv[2:])
    elif sys.argv[1:2] == ["compare"]:
        compare(*sys.argv[2:])
    else:
        print(__doc__)
        sys.exit(2)
