"""fit --search's rows, checked one by one with `metamem profile`: each row's
micro-batch fits on every stage the search traces (the first and last of a
pipeline) with the bytes it reports, and the next three do not fit (the
search reads larger batches off a batch line, so a batch past a bump in the
allocator's reserved bytes would have been found). The rows are the same
searched in one process or in several.

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


def reserved(row, batch):
    """The most any traced stage of the row's layout reserves at `batch`."""
    flags = ["--tp", str(row["tp"]), "--dp", str(row["dp"]), "--batch", str(batch)]
    if row["sequence_parallel"]:
        flags.append("--sequence-parallel")
    if row["zero_stage"]:
        flags += ["--zero", str(row["zero_stage"])]
    if row["recompute"] == "selective":
        flags.append("--selective-recompute")
    elif row["recompute"] == "full":
        flags += ["--policy", ",".join(str(u) for u in range(4 // row["pp"]))]
    stages = [0]
    if row["pp"] > 1:
        flags += ["--pp", str(row["pp"]), "--microbatches", str(row["pp"])]
        stages.append(row["pp"] - 1)
    return max(metamem("profile", *MODEL, *flags, "--stage", str(s), "--format", "json")["predicted"]
               ["allocator_reserved_peak_bytes"] for s in stages)


def main():
    search = ["fit", *MODEL, "--memory", str(MEMORY), "--search", "--gpus", "4", "--format", "json"]
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
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
