"""Where a trace's allocations first part from the real run's, for a step
whose reserved bytes differ while its allocated bytes agree (issue 47):
the allocator met the same bytes in another order. The step runs by real
torch on the fake GPU under torch.cuda.memory._record_memory_history, and
is traced; the two sequences of allocations and frees (requested bytes)
are compared event by event, each run of frees as a set (a container's
frees come in its hash map's order), and the first difference is printed
with the real run's Python frames and the trace's ops.

    PYTHONPATH=build/python .venv/bin/python tests/python/allocation_order.py build/oracle \\
        "timm ViT-Ti/16 at 64 px" [--eager | --precision "bf16 autocast" [--cudnn] | --mode reduce-overhead] \\
        [--evaluate] [--gpu H100-80GB] [--context 8]
    PYTHONPATH=build/python .venv/bin/python tests/python/allocation_order.py build/oracle "anomaly mode" --idiom

The model is one of compiled_models.py's, built and stepped as
compile_sweep.py does (with --mode, four steps compiled in that mode); with
--precision, one of fake_gpu_sweep.py's, eager, as that sweep steps it; with --idiom,
one of idiom_steps.py's, as it traces and runs them. Found this way: FlashAttention's backward
temporaries, made one by one (docs/compile.md); group norm's, layer norm's,
a reduced loss's and the native convolutions' (docs/accuracy.md).
"""
import argparse
import json
import os
import pickle
import sys
import tempfile

import metamem
import metamem._metamem as native
import fake_gpu_sweep
import idiom_steps
from compile_sweep import CHILD as COMPILE_CHILD, cold_cache
from compiled_models import two_adamw_steps
from real_torch_on_fake_gpu import PROLOGUE, measure

# Where a real compile makes the few bytes it allocates on the GPU (the
# pattern matcher's example tensors, make_fx's constants; docs/compile.md).
COMPILING = {"pattern_matcher.py", "fuse_attention.py", "joint_graph.py", "fake_tensor.py", "proxy_tensor.py",
             "constant_folding.py"}


def recording(child):
    """A sweep's child, its allocations recorded, the history written to
    the file named by METAMEM_HISTORY."""
    return PROLOGUE + """
import os, pickle, torch
torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=10**7)
""" + child + """
pickle.dump(torch.cuda.memory._snapshot()["device_traces"][0], open(os.environ["METAMEM_HISTORY"], "wb"))
"""


def compiled_steps(mode, evaluate=False):
    """compile_sweep.py's steps: two, or four in torch.compile's `mode`
    (five with an evaluation fourth), and those that evaluate."""
    return (2 if mode is None else 5 if evaluate else 4), [3] if evaluate else []


def real_events(oracle, gpu, name, how, mode=None, evaluate=False, cudnn=False):
    """[(kind, bytes, where)] of the real run: kind "alloc" or "free".
    `how`: compiled (True or False, in `mode`), fake_gpu_sweep's precision,
    or "idiom"."""
    if how == "idiom":
        child, arguments = idiom_steps.CHILD, name
    elif isinstance(how, str):
        child, arguments = fake_gpu_sweep.CHILD, [name, how, cudnn]
    else:
        child, arguments = COMPILE_CHILD, [name, how, mode, *compiled_steps(mode, evaluate)]
    with tempfile.TemporaryDirectory() as folder:
        os.environ["METAMEM_HISTORY"] = history = os.path.join(folder, "history.pickle")
        cold_cache()
        measure(oracle, native.gpu(gpu), recording(child), arguments if how == "idiom" else json.dumps(arguments))
        entries = pickle.load(open(history, "rb"))
    live, events = {}, []
    for entry in entries:
        files = [os.path.basename(f["filename"]) for f in entry.get("frames", [])]
        if COMPILING.intersection(files):
            continue  # a compile's own example tensors, which a trace makes outside it
        where = " < ".join(f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}" for f in entry.get("frames", [])[:4])
        if entry["action"] == "alloc":
            live[entry["addr"]] = entry["size"]
            events.append(("alloc", entry["size"], where or "(autograd's thread)"))
        elif entry["action"] == "free_completed":
            events.append(("free", live.pop(entry["addr"]), where or "(autograd's thread)"))
    return events


def traced_events(gpu, name, how, mode=None, evaluate=False, cudnn=False, oracle=""):
    """The same for the trace: requested bytes from its allocator events,
    each allocation's op and module from its snapshot. With cuDNN on, its
    convolutions are the fake GPU's recordings (fake_gpu_sweep.py --cudnn)."""
    cold_cache()
    if how == "idiom":
        with idiom_steps.traced(gpu, oracle) as t:
            idiom_steps.run(name)
    else:
        if isinstance(how, str):
            model, run = fake_gpu_sweep.two_steps(name, how, cudnn)
        else:
            model, run = two_adamw_steps(name, "cuda", how, mode, *compiled_steps(mode, evaluate))
        with metamem.trace(device="cuda", gpu=gpu, modules=[model], fake_gpu=oracle if cudnn else "") as t:
            run()
    with tempfile.TemporaryDirectory() as folder:
        t.save_allocator_events(os.path.join(folder, "events.txt"))
        t.snapshot(os.path.join(folder, "snapshot.pickle"))
        lines = open(os.path.join(folder, "events.txt")).read().split("\n")[1:]
        snapshot = pickle.load(open(os.path.join(folder, "snapshot.pickle"), "rb"))
    ops = [" < ".join(f"{f['filename']} {f['name']}" for f in entry["frames"][:2])
           for entry in snapshot["device_traces"][0] if entry["action"] == "alloc"]
    sizes, where, events = {}, {}, []
    for words in map(str.split, lines):
        if words[:1] == ["alloc"]:
            sizes[words[1]], where[words[1]] = int(words[2]), ops[len(sizes)] if len(sizes) < len(ops) else "?"
            events.append(("alloc", sizes[words[1]], where[words[1]]))
        elif words[:1] == ["free"]:
            events.append(("free", sizes[words[1]], where[words[1]]))
        elif words[:1] == ["pool_restore"]:  # its blocks go to new holders, whose allocations the list leaves out
            for held, new in (pair.split(":") for pair in words[2:]):
                sizes[new], where[new] = sizes[held], "a pool's restore"
            events.append(("restore", 0, f"checkpoint {words[1]}"))
    return events


def grouped(events):
    """Runs of frees as one event, their sizes sorted; each with its index."""
    out, i = [], 0
    while i < len(events):
        j = i + 1
        if events[i][0] == "free":
            while j < len(events) and events[j][0] == "free":
                j += 1
            out.append((("frees", tuple(sorted(size for _, size, _ in events[i:j]))), i))
        else:
            out.append((events[i][:2], i))
        i = j
    return out


def first_difference(real, traced):
    """Index (in each list) of the first event that differs, or None."""
    real_groups, traced_groups = grouped(real), grouped(traced)
    for (r, r_at), (t, t_at) in zip(real_groups, traced_groups):
        if r != t:
            return r_at, t_at
    if len(real_groups) != len(traced_groups):
        n = min(len(real_groups), len(traced_groups))
        return (real_groups[n][1] if n < len(real_groups) else len(real),
                traced_groups[n][1] if n < len(traced_groups) else len(traced))
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("oracle", help="the fake GPU's libraries (build/oracle)")
    parser.add_argument("model", help="a model of compiled_models.py (or an idiom of idiom_steps.py, --idiom)")
    parser.add_argument("--idiom", action="store_true", help="the model is an idiom of idiom_steps.py")
    parser.add_argument("--eager", action="store_true", help="the eager step (default: compiled)")
    parser.add_argument("--precision", choices=fake_gpu_sweep.PRECISIONS,
                        help="a model of fake_gpu_sweep.py, eager, in this precision")
    parser.add_argument("--mode", help="torch.compile's mode for the compiled step (four steps)")
    parser.add_argument("--evaluate", action="store_true", help="with --mode: five steps, the fourth an evaluation")
    parser.add_argument("--cudnn", action="store_true", help="with --precision: cuDNN on, as fake_gpu_sweep.py --cudnn")
    parser.add_argument("--gpu", default="H100-80GB")
    parser.add_argument("--context", type=int, default=8, help="events shown before and after")
    args = parser.parse_args()
    how = "idiom" if args.idiom else args.precision or not args.eager
    real = real_events(args.oracle, args.gpu, args.model, how, args.mode, args.evaluate, args.cudnn)
    traced = traced_events(args.gpu, args.model, how, args.mode, args.evaluate, args.cudnn, args.oracle)
    print(f"{len(real)} real events, {len(traced)} traced")
    found = first_difference(real, traced)
    if found is None:
        print("the same allocations and frees, in the same order")
        return 0
    for label, events, at in (("real", real, found[0]), ("traced", traced, found[1])):
        print(f"\n{label}, from event {max(at - args.context, 0)} (the first difference at {at}):")
        for i in range(max(at - args.context, 0), min(at + args.context, len(events))):
            kind, size, where = events[i]
            print(f"{'>' if i == at else ' '} {i:6} {kind:5} {size:>12,}  {where}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
