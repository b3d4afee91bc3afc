"""OpInfo conformance: PyTorch's own sample inputs, traced on metamem's fake
cpu and run for real on the CPU.

For every float32 sample of an op in torch's op_db, the same code runs
twice: once under metamem.trace(device="cpu"), once for real through
metamem.achieved_cpu. It copies the sample into fresh tensors, runs the op
forward and, where the op supports autograd, backward. The outputs and input
gradients must agree in shape, dtype and strides, and the traced peak must
equal the bytes the real run held through the CPU allocator.

    PYTHONPATH=build/python .venv/bin/python tests/python/opinfo_sweep.py [--markdown] [ops...]

Each op runs in a forked child, so an op that crashed the interpreter would
be reported as such instead of ending the sweep.
"""

import argparse
import collections
import contextlib
import dataclasses
import difflib
import gc
import multiprocessing
import sys
import time

import torch
from torch.utils._pytree import tree_flatten, tree_map

import metamem
from torch.testing._internal.common_methods_invocations import op_db

MATCH, UNSUPPORTED, MISMATCH, CRASH, SKIPPED = "match", "unsupported", "mismatch", "crash", "skipped"

# The ops by which a sample stops on a tensor's value, as under FakeTensorMode:
# a value read (item(), equal), an output sized by values, a kernel reading
# data ("data").
VALUE_READS = {"aten::_local_scalar_dense", "aten::equal", "aten::nonzero", "aten::masked_select", "aten::_unique",
               "aten::_unique2", "aten::unique_consecutive", "data"}


@dataclasses.dataclass
class Outcome:
    op: str
    kind: str
    samples: int = 0
    detail: str = ""


def full_name(opinfo):
    return opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")


def float32_ops():
    return [op for op in op_db if torch.float32 in op.supported_dtypes("cpu")]


def _fresh(value):
    """A new tensor laid out like `value`, holding its data (fake in a trace)."""
    if not isinstance(value, torch.Tensor):
        return value
    copy = torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device="cpu")
    with torch.no_grad():
        copy.copy_(value)
    return copy.requires_grad_(value.requires_grad)


def _layout(value):
    """Shape, dtype and the strides that matter: those of dimensions longer
    than one, in a tensor with elements (as PyTorch's own meta tests compare)."""
    if not isinstance(value, torch.Tensor):
        return None
    strides = tuple(s if n > 1 else None for n, s in zip(value.shape, value.stride())) if value.numel() else ()
    return tuple(value.shape), value.dtype, strides


def _step(opinfo, sample, seen):
    """The code both runs execute; `seen` receives the layouts of the outputs
    and of the input gradients."""

    def step():
        torch.manual_seed(0)
        inputs = tree_map(_fresh, (sample.input, sample.args, sample.kwargs))
        output = opinfo(inputs[0], *inputs[1], **inputs[2])
        outputs = [o for o in tree_flatten(output)[0] if isinstance(o, torch.Tensor)]
        differentiable = [o for o in outputs if o.requires_grad and o.dtype.is_floating_point]
        if differentiable:
            torch.autograd.backward([o.sum() for o in differentiable])
        leaves = [t for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor)]
        seen[:] = [_layout(o) for o in outputs] + [_layout(t.grad) for t in leaves]

    return step


@contextlib.contextmanager
def _no_collection():
    """Python's cyclic collector frees tensors held in reference cycles
    whenever its counters say, within a run or after it: both runs go
    without it."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def check_sample(opinfo, sample):
    """MATCH, UNSUPPORTED or MISMATCH with what differed; None when the real run itself fails."""
    with _no_collection():
        return _check_sample(opinfo, sample)


def _check_sample(opinfo, sample):
    real, fake = [], []
    try:
        achieved = metamem.achieved_cpu(_step(opinfo, sample, real))
    except Exception:
        return None, ""
    try:
        with metamem.trace(device="cpu") as t:
            _step(opinfo, sample, fake)()
    except metamem.UnsupportedOpError as error:
        return UNSUPPORTED, error.op
    except RuntimeError as error:
        if "a traced tensor has no data" in str(error):
            return UNSUPPORTED, "data"
        return MISMATCH, f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
    except Exception as error:
        return MISMATCH, f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
    if fake != real:
        return MISMATCH, f"layouts {fake} != {real}"
    if t.peak_bytes != achieved:
        return MISMATCH, f"peak {t.peak_bytes} B != {achieved} B"
    return MATCH, ""


def _describe(sample):
    """The sample with each tensor as its layout (values are noise here)."""
    brief = lambda v: f"T{list(v.shape)}{list(v.stride())}:{str(v.dtype)[6:]}" if isinstance(v, torch.Tensor) else v
    return tree_map(brief, (sample.input, sample.args, sample.kwargs))


def explain(opinfo, sample):
    """Prints the allocations (op, bytes) one run makes and the other does not."""
    real = metamem._metamem.cpu_allocations(_step(opinfo, sample, []))
    print(f"{full_name(opinfo)}: {_describe(sample)}")
    try:
        with metamem.trace(device="cpu") as t:
            _step(opinfo, sample, [])()
    except Exception as error:
        print(f"  traced: {type(error).__name__}: {error}")
        return
    traced = [(op.split(".")[0], size) for op, size in t._done().allocations()]
    sizes = difflib.SequenceMatcher(a=[size for _, size in traced], b=[size for _, size in real], autojunk=False)
    for tag, i1, i2, j1, j2 in sizes.get_opcodes():
        if tag != "equal":
            print(f"  traced only: {traced[i1:i2]}\n  real only:   {real[j1:j2]}")


def samples_of(opinfo):
    torch.manual_seed(0)
    return list(opinfo.sample_inputs("cpu", torch.float32, requires_grad=opinfo.supports_autograd))


def check_op(opinfo, max_samples=None):
    """Every float32 sample of `opinfo`: MATCH if all match, else the first
    mismatch, else the first unsupported op; SKIPPED if no sample runs on CPU."""
    name = full_name(opinfo)
    try:
        samples = samples_of(opinfo)
    except Exception as error:
        return Outcome(name, SKIPPED, detail=f"samples: {type(error).__name__}")
    ran, unsupported = 0, None
    for sample in samples[:max_samples]:
        kind, detail = check_sample(opinfo, sample)
        if kind is None:
            continue
        ran += 1
        if kind == MISMATCH:
            return Outcome(name, MISMATCH, ran, detail)
        if kind == UNSUPPORTED and unsupported is None:
            unsupported = detail
    if ran == 0:
        return Outcome(name, SKIPPED, detail="no sample runs on CPU")
    return Outcome(name, UNSUPPORTED, ran, unsupported) if unsupported else Outcome(name, MATCH, ran)


def _run_child(index, max_samples, pipe):
    pipe.send(check_op(OPS[index], max_samples))
    pipe.close()


def check_op_isolated(index, max_samples):
    """check_op in a forked child: a crash is an outcome, not the end of the sweep."""
    parent, child = multiprocessing.Pipe(duplex=False)
    process = multiprocessing.get_context("fork").Process(target=_run_child, args=(index, max_samples, child))
    process.start()
    child.close()
    try:
        outcome = parent.recv()
    except EOFError:
        outcome = None
    process.join()
    if outcome is None:
        return Outcome(full_name(OPS[index]), CRASH, detail=f"child exit {process.exitcode}")
    return outcome


OPS = float32_ops()
# op_db's objects (and torch's) live as long as the process: frozen, the
# collection achieved_cpu makes before each real run passes over them
# (0.23 s a sample to a few milliseconds).
gc.freeze()


def summary(outcomes):
    counts = collections.Counter(o.kind for o in outcomes)
    run = len(outcomes) - counts[SKIPPED]
    return counts, run


def value_free_share(outcomes, counts, run):
    """The share of exact ops among those that read no tensor value."""
    reads = sum(1 for o in outcomes if o.kind == UNSUPPORTED and o.detail in VALUE_READS)
    return reads, f"{counts[MATCH]} of the {run - reads} that read no value ({100 * counts[MATCH] / max(run - reads, 1):.1f}%)"


def print_markdown(outcomes):
    counts, run = summary(outcomes)
    print("| ops (float32, CPU) | count | share of ops run |")
    print("|---|---:|---:|")
    for kind in (MATCH, UNSUPPORTED, MISMATCH, CRASH):
        print(f"| {kind} | {counts[kind]} | {100 * counts[kind] / max(run, 1):.1f}% |")
    print(f"| run | {run} | |")
    print(f"| skipped (no float32 sample runs on CPU) | {counts[SKIPPED]} | |")
    reads, share = value_free_share(outcomes, counts, run)
    print(f"\n{reads} of the unsupported ops stop on a tensor's value; match: {share}.")
    unsupported = collections.Counter(o.detail for o in outcomes if o.kind == UNSUPPORTED)
    print("\nUnsupported, by the op named in the error: " +
          ", ".join(f"`{op}` ({n})" for op, n in unsupported.most_common()))
    mismatched = [o.op for o in outcomes if o.kind in (MISMATCH, CRASH)]
    print("\nMismatches: " + (", ".join(f"`{op}`" for op in mismatched) or "none"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ops", nargs="*", help="op names to check (default: every float32 op)")
    parser.add_argument("--max-samples", type=int, default=None, help="samples per op (default: all)")
    parser.add_argument("--explain", action="store_true",
                        help="for each chosen op, list both runs' allocations on its first mismatching sample")
    parser.add_argument("--markdown", action="store_true", help="print the README's table")
    args = parser.parse_args()
    chosen = [i for i, op in enumerate(OPS) if not args.ops or full_name(op) in args.ops or op.name in args.ops]
    if not chosen:
        parser.error("no such op in op_db: " + " ".join(args.ops))
    if args.explain:
        for index in chosen:
            for sample in samples_of(OPS[index])[:args.max_samples]:
                if check_sample(OPS[index], sample)[0] == MISMATCH:
                    explain(OPS[index], sample)
                    break
        return 0
    start = time.perf_counter()
    outcomes = []
    for index in chosen:
        outcome = check_op_isolated(index, args.max_samples)
        outcomes.append(outcome)
        if outcome.kind != MATCH:
            print(f"{outcome.kind:12} {outcome.op:40} {outcome.detail}", file=sys.stderr, flush=True)
    counts, run = summary(outcomes)
    print(f"{len(outcomes)} ops in {time.perf_counter() - start:.0f} s: " +
          ", ".join(f"{counts[k]} {k}" for k in (MATCH, UNSUPPORTED, MISMATCH, CRASH, SKIPPED)) +
          f"; {100 * counts[MATCH] / max(run, 1):.1f}% of ops run match, {value_free_share(outcomes, counts, run)[1]}",
          flush=True)
    if args.markdown:
        print_markdown(outcomes)
    return 1 if counts[CRASH] else 0


if __name__ == "__main__":
    sys.exit(main())
