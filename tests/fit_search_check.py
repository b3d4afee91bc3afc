"""fit --search's rows, checked one by one with `metamem profile`: each row's
micro-batch fits on every stage the search traces (the first and last of a
pipeline) with the bytes it reports, and the next three do not fit (the
search reads larger batches off a batch line, so a batch past a bump in the
allocator's reserved bytes would have been found). The rows are the same
searched in one process or in several. With --checkpoint auto the search
adds the solver's plans and changes no other row; each plan is checked.

Usage: fit_search_check.py METAMEM
"""
import json
import subprocess
import sys

MODEL = ["--model", "gpt2", "--seq", "256", "--layers", "4", "--width", "256", "--heads", "4",
         "--vocab", "1000", "--optimizer", "adam"]
MEMORY = 256 << 20


def metamem(*args):
    done = subprocess.run([sys.argv[1], *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"metamem {' '.join(args)} exited {done.returncode}: {done.stderr}")
    return json.loads(done.stdout)


def parallel_flags(row):
    flags = ["--tp", str(row["tp"]), "--dp", str(row["dp"])]
    if row["sequence_parallel"]:
        flags.append("--sequence-parallel")
    if row["zero_stage"]:
        flags += ["--zero", str(row["zero_stage"])]
    return flags


def profile(row, batch, stage=0, recompute=True):
    """`metamem profile` of the row's layout at `batch`, with its recompute or without."""
    flags = parallel_flags(row) + ["--batch", str(batch), "--stage", str(stage)]
    if not recompute:
        pass
    elif row["recompute"] == "selective":
        flags.append("--selective-recompute")
    elif row["recompute"] == "full":
        flags += ["--policy", ",".join(str(u) for u in range(4 // row["pp"]))]
    elif row["recompute"] == "planned":
        flags += ["--policy", row["plan"]["policy_text"]]
    if row["pp"] > 1:
        flags += ["--pp", str(row["pp"]), "--microbatches", str(row["pp"])]
    return metamem("profile", *MODEL, *flags, "--format", "json")


def reserved(row, batch, recompute=True):
    """The most any traced stage of the row's layout reserves at `batch`."""
    stages = [0, row["pp"] - 1] if row["pp"] > 1 else [0]
    return max(profile(row, batch, s, recompute)["predicted"]["allocator_reserved_peak_bytes"] for s in stages)


def check_planned(row, rows):
    """A solver's plan: at its micro-batch the step fits with the plan and
    not without recompute, it recomputes the share of the step's FLOPs the
    row says (the profile's nodes count them), and less than full recompute."""
    batch = row["micro_batch"]
    at, plain = reserved(row, batch), reserved(row, batch, recompute=False)
    nodes = profile(row, batch)["nodes"]
    share = sum(n["recompute_flops"] for n in nodes) / sum(n["fwd_flops"] + n["bwd_flops"] for n in nodes)
    full = next(r for r in rows if r["recompute"] == "full" and r["tp"] == row["tp"] and r["pp"] == row["pp"]
                and r["zero_stage"] == row["zero_stage"])
    ok = (at == row["predicted_bytes"] <= MEMORY < plain and abs(share - row["recomputed_share"]) < 1e-12
          and 0 < share < full["recomputed_share"])
    print(f"{'ok' if ok else 'FAIL'} planned: {json.dumps(row)}: reserved {at} with the plan, {plain} without "
          f"recompute; recomputes {share:.4%} of the step, full recompute {full['recomputed_share']:.4%}")
    return ok


def main():
    # The allocator has all of MEMORY: this checks the search, not the estimates beside it.
    search = ["fit", *MODEL, "--memory", str(MEMORY), "--cuda-context", "0", "--nccl-buffers", "0", "--search",
              "--gpus", "4", "--format", "json"]
    found = metamem(*search, "--jobs", "2")
    rows = found["layouts"]
    failures = 0
    if metamem(*search, "--jobs", "1")["layouts"] != rows:
        print("FAIL: one process found other rows than two")
        failures += 1
    picks = {
        "first": rows[0],
        "pipeline": next(r for r in rows if r["pp"] > 1),
        "zero 3": next(r for r in rows if r["zero_stage"] == 3),
        "full recompute": next(r for r in rows if r["recompute"] == "full"),
    }
    for name, row in picks.items():
        at = reserved(row, row["micro_batch"])
        above = [reserved(row, row["micro_batch"] + more) for more in (1, 2, 3)]
        ok = at == row["predicted_bytes"] and at <= MEMORY < min(above)
        print(f"{'ok' if ok else 'FAIL'} {name}: {json.dumps(row)}: reserved {at} at the micro-batch, "
              f"{above} at the next three")
        failures += not ok
    print(f"{len(rows)} layouts, {found['traces']} traces, {found['line_reads']} batches read off lines, "
          f"{found['seconds']:.1f} s")

    with_plans = metamem(*search, "--checkpoint", "auto", "--jobs", "2")
    planned = [r for r in with_plans["layouts"] if r["recompute"] == "planned"]
    if [r for r in with_plans["layouts"] if r["recompute"] != "planned"] != rows or not planned:
        print(f"FAIL: with --checkpoint auto, {len(planned)} plans and other rows changed")
        failures += 1
    failures += sum(not check_planned(row, rows) for row in planned)
    print(f"{len(planned)} plans, {with_plans['traces']} traces, {with_plans['seconds']:.1f} s")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
