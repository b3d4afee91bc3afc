"""Real data-parallel training with torch.distributed's gloo backend on CPU,
one process per rank: each rank's peak against metamem's prediction for it.

usage: gloo_data_parallel.py METAMEM_BINARY [--ranks 2] [--check]

Each rank loads the same scripted MLP, wraps it in DistributedDataParallel
(stage 0) or also steps a ZeroRedundancyOptimizer over Adam (stage 1), runs
two warm-up steps (DDP rebuilds its buckets in the second) and measures the
third: the bytes it holds through the CPU allocator above what was live when
the step began (metamem.achieved_cpu). metamem profile --dp N --zero Z
--rank R --optimizer-impl for-loop (torch.optim's Python Adam, which the
ranks run) predicts the same rise for that rank: peak minus live at step
start. --check asks every rank for the exact bytes.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

import metamem

BATCH, WIDTH = 8, 64


def scripted_mlp(path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    torch.jit.script(model).save(path)


def rank_peak(rank, ranks, model_path, init_file, zero, results):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=ranks)
    model = torch.jit.load(model_path)
    x = torch.randn(BATCH, WIDTH)
    ddp = DistributedDataParallel(model)
    if zero:
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        ddp(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    # metamem runs TorchScript's unoptimized graph; the default executor
    # turns parts of the graph into autodiff subgraphs from the second call
    # on, which save other tensors for backward (40,960 B more here).
    with torch.jit.optimized_execution(False):
        step()
        step()
        results[rank] = metamem.achieved_cpu(step)
    dist.barrier()
    dist.destroy_process_group()


def predicted_rise(metamem_binary, model_path, ranks, zero, rank):
    out = subprocess.run(
        [metamem_binary, "profile", "--model", model_path, "--input", f"{BATCH}x{WIDTH}", "--loss", "sum",
         "--device", "cpu", "--optimizer", "adam", "--optimizer-impl", "for-loop", "--steps", "3",
         "--dp", str(ranks), "--zero", str(zero), "--rank", str(rank), "--format", "json"],
        check=True, capture_output=True, text=True).stdout
    predicted = json.loads(out)["predicted"]
    return predicted["peak_bytes"] - predicted["step_begin_bytes"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("metamem")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--check", action="store_true", help="exit 1 if a rank is off by a byte")
    args = parser.parse_args()
    within = True
    with tempfile.TemporaryDirectory() as tmp:
        model_path = os.path.join(tmp, "mlp.pt")
        scripted_mlp(model_path)
        print(f"| setup | rank | achieved (B) | predicted (B) | error |")
        print(f"| --- | --- | --- | --- | --- |")
        for zero, name in ((0, "DDP"), (1, "DDP + ZeroRedundancyOptimizer")):
            results = mp.Manager().dict()
            init_file = os.path.join(tmp, f"init{zero}")
            mp.spawn(rank_peak, args=(args.ranks, model_path, init_file, zero, results), nprocs=args.ranks)
            for rank in range(args.ranks):
                achieved = results[rank]
                predicted = predicted_rise(args.metamem, model_path, args.ranks, zero, rank)
                within = within and predicted == achieved
                print(f"| {name}, {args.ranks} ranks | {rank} | {achieved:,} | {predicted:,} | {predicted - achieved:+,} B |")
    if args.check and not within:
        sys.exit(1)


if __name__ == "__main__":
    main()
