"""How long one rank of a torchtitan preset takes to trace (metamem.torchtitan
on fake H100s), as torchtitan ships it (405B: each block and the loss
compiled, rowwise float8), in one process: the process's first rank, the
job's last rank after it, and the first again. A trace runs the graphs
another rank's trace compiled where the preset's ranks compile alike
(docs/compile.md, "Traces again in one process"); each trace's peak and
reserved bytes are printed beside its time, so that the ones that ran
kept graphs can be compared with the first, which compiled.

    METAMEM_ORACLE=build/oracle PYTHONPATH=build/python .venv/bin/python bench/torchtitan_rank_bench.py [405B]

Each trace's time is wall-clock on this machine, split into building
torchtitan's Trainer, compiling (Dynamo's frame compiles, AOTAutograd's
lazy backward compiles) and the rest of its two steps.
"""

import argparse
import collections
import time

GIB = 1 << 30


def timed_phases():
    """Wall-clock seconds spent in each phase since the last reset, by name."""
    import torch._dynamo.convert_frame as convert_frame
    from torch._functorch._aot_autograd import runtime_wrappers
    from torchtitan.trainer import Trainer

    seconds = collections.Counter()

    def timing(owner, name, phase):
        function = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                seconds[phase] += time.perf_counter() - start
        setattr(owner, name, timed)

    # Wrapped before any trace patches them, so that each wraps these.
    timing(convert_frame, "_compile", "compiling")
    timing(runtime_wrappers._AutogradBackwardCompiler, "get_or_compile", "compiling")
    timing(Trainer, "__init__", "Trainer built")
    return seconds


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("flavor", nargs="?", default="405B")
    args = parser.parse_args()
    start = time.perf_counter()
    import metamem.torchtitan as titan

    titan._torchtitan()
    seconds = timed_phases()
    print(f"imports: {time.perf_counter() - start:.1f} s", flush=True)
    last = titan.PRESETS[args.flavor].world_size - 1
    for rank in (0, last, 0):
        seconds.clear()
        start = time.perf_counter()
        t = titan.trace(args.flavor, rank=rank)
        total = time.perf_counter() - start
        rest = total - seconds["Trainer built"] - seconds["compiling"]
        print(f"rank {rank:>3}: {total:5.1f} s (Trainer built {seconds['Trainer built']:.1f} s, compiling "
              f"{seconds['compiling']:.1f} s, the rest {rest:.1f} s); peak {max(t.step_peaks):,} B "
              f"({max(t.step_peaks) / GIB:.2f} GiB), reserved {t.reserved_peak_bytes:,} B", flush=True)


if __name__ == "__main__":
    main()
