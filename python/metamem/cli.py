"""`metamem profile|fit --hf ...|--timm ...` and `metamem run SCRIPT`: the
command line for models that transformers or timm build and for training
scripts, on the Python engine. The `metamem` command runs this module
(`python -m metamem`) when it sees --hf, --timm or run; the zoo's and
TorchScript models stay in C++.

    metamem profile --hf LlamaForCausalLM --hf-set num_hidden_layers=8 --batch 4 --seq 2048 --dtype bf16
    metamem profile --timm convnext_tiny --batch 64 --gpu A100-80GB --format json
    metamem fit --hf path/to/config.json --seq 4096 --dtype bf16 --checkpointing --gpu H200
    metamem profile --hf llama --hf-set num_hidden_layers=8 --dtype bf16 --dp 64 --fsdp hybrid --rank 9
    metamem fit --hf llama --dtype bf16 --seq 8192 --search --gpus 16 --jobs 2
    metamem checkpoint --hf llama --hf-set num_hidden_layers=8 --batch 8 --seq 2048 --budget 30GiB
    metamem checkpoint --hf llama --hf-set num_hidden_layers=8 --batch 8 --seq 2048 --pp 4 --budget 7GiB
    metamem run --budget 30GiB train.py --batch-size 16
"""

import argparse
import contextlib
import json
import logging
import os
import sys
import time

from . import (Sharding, UnsupportedOpError, _metamem, achieved_cpu, gpu_memory, largest_batch_by_line,
               trace)
from . import torchtitan as titan
from ._checkpointing import SOLVERS, Checkpointing, least_recompute
from ._run import ScriptError
from ._search import each_apart
from ._sharding import ranks_that_differ

class UsageError(Exception):
    pass


def parse_setting(text):
    """KEY=VALUE with VALUE read as JSON where it is (8, 1e-5, true, [1, 2]), else a string."""
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise UsageError(f"--hf-set expects KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def add_report_flags(p):
    """The report's outputs, as the zoo's `metamem profile` takes them."""
    p.add_argument("--format", choices=["table", "csv", "json"], default="table",
                   help="csv prints the --table's rows (fit: table or json)")
    p.add_argument("--table", choices=["summary", "nodes", "modules"], default="summary",
                   help="rows per op or per module path before the summary")
    p.add_argument("--depth", type=int, default=2, help="module paths cut at this depth")
    p.add_argument("--html", metavar="FILE.html", help="the report as one self-contained page")
    p.add_argument("--snapshot", metavar="FILE.pickle", help="a memory snapshot for PyTorch's memory_viz")
    p.add_argument("--allocator-events", metavar="FILE.txt",
                   help="allocations and frees for metamem-allocator-oracle")


def add_trace_flags(p, values):
    """Where the trace runs, what reading a value does (`values` by
    default), and how an error is told."""
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--gpu", default="H100-80GB", help="the GPU a cuda trace is for: " + ", ".join(_metamem.gpu_keys()))
    p.add_argument("--values", choices=["error", "placeholder"], default=values,
                   help="what reading a traced value (loss.item()) does: zeros, or an error naming it")
    p.add_argument("--debug", action="store_true", help="an error prints its traceback")


def add_checkpoint_flags(p, prefix):
    """What the search for the least recomputation takes (`prefix` names
    where it applies)."""
    p.add_argument("--budget", help=prefix + "the peak to fit in (16GiB)")
    p.add_argument("--solver", choices=list(SOLVERS), default="auto", help=prefix + "recompute whole layers, "
                   "selectively (keeping matrix products, convolutions and attention), or the one of both that "
                   "recomputes less")
    p.add_argument("--pareto", action="store_true", help=prefix + "trace every count of layers recomputed, "
                   "so that the curve of the least recompute at each peak (the traced plans') is whole")


def run_parser():
    p = argparse.ArgumentParser(
        prog="metamem run", description="Runs a training script unchanged under a trace, as `python SCRIPT ARGS` "
        "would run it, stops it after --steps optimizer steps and reports what they held.",
        epilog="metamem run --device cuda --gpu A100-80GB --steps 2 train.py --batch-size 32\n"
               "metamem run --nproc-per-node 8 --nnodes 4 --rank 13 train_fsdp.py   # rank 13 of a torchrun job\n"
               "metamem run --budget 30GiB train.py   # the fewest blocks to recompute for a peak within 30 GiB",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2, help="optimizer steps traced; nothing after them runs")
    p.add_argument("--nproc-per-node", type=int, help="as torchrun's: the script is one rank of a job of "
                   "NPROC_PER_NODE x NNODES ranks, with torchrun's environment")
    p.add_argument("--nnodes", type=int, help="as torchrun's (default 1)")
    p.add_argument("--rank", type=int, help="the rank traced (default 0)")
    add_trace_flags(p, values="placeholder")
    add_report_flags(p)
    add_checkpoint_flags(p, "with --budget, the blocks of the script's model to recompute: ")
    p.add_argument("script", help="the training script")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def parser():
    p = argparse.ArgumentParser(prog="metamem", description="metamem for transformers and timm models",
                                epilog=__doc__.split("\n\n")[1])
    p.add_argument("command", choices=["profile", "fit", "checkpoint"])
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--hf", metavar="TYPE|ARCHITECTURE|CONFIG.json",
                       help="a transformers model type, architecture or config.json")
    model.add_argument("--timm", metavar="NAME", help="a model of timm's registry")
    model.add_argument("--torchtitan", metavar="FLAVOR", help="torchtitan's Llama 3 preset, one rank of its job: "
                       + ", ".join(titan.PRESETS))
    p.add_argument("--hf-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config attribute to set (repeat for more)")
    p.add_argument("--attn-implementation", choices=["sdpa", "eager"], help="transformers' attention")
    p.add_argument("--batch", type=int, help="samples per step (default 1; --torchtitan: the preset's local batch)")
    p.add_argument("--seq", type=int, help="tokens per sequence (default 128; --torchtitan: the preset's)")
    p.add_argument("--dtype", choices=["f32", "bf16", "f16"], default="f32")
    p.add_argument("--optimizer", choices=["adamw", "sgd", "none"], default="adamw")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--checkpointing", action="store_true", help="recompute every layer or block in backward")
    p.add_argument("--dp", type=int, metavar="N", help="one rank of N data-parallel ranks (--hf): the model "
                   "sharded by FSDP2's fully_shard on each layer and on the model (--zero 3 or --fsdp)")
    p.add_argument("--zero", type=int, choices=[0, 1, 2, 3], help="with --dp: 3 (FSDP2's full sharding) is "
                   "traced for --hf models; 0 to 2 for the zoo's")
    p.add_argument("--fsdp", choices=["full", "hybrid"], help="with --dp: FSDP2 sharding across all ranks, or "
                   "within each node's (--gpus-per-node) and replicated across nodes")
    p.add_argument("--gpus-per-node", type=int, help="--fsdp hybrid: ranks to a node (default 8)")
    p.add_argument("--rank", type=int, help="with --dp: the rank traced (default 0)")
    p.add_argument("--tp", type=int, metavar="T", help="tensor-parallel degree (--torchtitan: default the "
                   "preset's; --hf: transformers' tp_plan); the job is --dp x --tp ranks")
    p.add_argument("--pp", type=int, metavar="P", help="pipeline-parallel degree (default 1): --torchtitan, "
                   "torchtitan's stages and schedule; --hf, a decoder split as transformers splits it, under "
                   "torch's 1F1B schedule; the job is --pp x --dp x --tp ranks, the pipeline outermost")
    p.add_argument("--microbatches", type=int, metavar="N", help="with --pp: the local batch's microbatches "
                   "(default --pp, the fewest a 1F1B schedule takes); fit finds the largest batch of N equal "
                   "microbatches")
    p.add_argument("--recompute", choices=["none", "selective", "full"], help="--torchtitan: its activation "
                   "checkpointing (default the preset's)")
    p.add_argument("--compile", choices=["on", "off"], help="--torchtitan: torch.compile of each block and of the "
                   "loss (default the preset's: on for 405B)")
    p.add_argument("--float8", choices=["on", "off"], help="--torchtitan: float8 linears, rowwise, the output "
                   "layer in bf16 (default the preset's: on for 405B; GPUs of compute capability 8.9 and up)")
    add_trace_flags(p, values="error")
    add_report_flags(p)
    p.add_argument("--achieved", action="store_true", help="profile: also run the step for real (--device cpu)")
    p.add_argument("--memory", help="fit: the GPU's memory (default: the --gpu's)")
    p.add_argument("--cuda-context", help="fit: the CUDA context's size, measured, in place of metamem's estimate "
                                          "(docs/gpu-memory.md)")
    p.add_argument("--max-batch", type=int, default=1 << 16, help="fit: the largest batch tried")
    p.add_argument("--search", action="store_true", help="fit --hf: the layouts FSDP2 gives --gpus GPUs "
                   "(fully sharded, hybrid within nodes of --gpus-per-node), with and without recomputing each "
                   "layer, each with its largest local batch")
    add_checkpoint_flags(p, "checkpoint: ")
    p.add_argument("--gpus", type=int, help="fit --search: the GPUs of the job")
    p.add_argument("--jobs", type=int, default=1, help="fit --search: layouts searched in this many processes")
    p.add_argument("--ray", metavar="ADDRESS", help="fit --search: layouts searched as Ray tasks on the cluster "
                   "at ADDRESS (\"auto\": the one this machine is in; \"local\": one started here for the search), "
                   "whose machines have metamem and transformers")
    return p


def check(args):
    args.rank_given = args.rank is not None  # fit traces the ranks that differ unless --rank names one
    if args.torchtitan:
        check_torchtitan(args)
    else:
        if args.recompute is not None:
            raise UsageError("--recompute is for --torchtitan presets (--checkpointing for other models)")
        if args.compile is not None or args.float8 is not None:
            raise UsageError("--compile and --float8 are for --torchtitan presets")
        if args.timm and (args.pp is not None or args.microbatches is not None):
            raise UsageError("--pp and --microbatches are for --hf and --torchtitan models")
        if args.microbatches is not None and (args.pp or 1) == 1:
            raise UsageError("--microbatches is for a pipeline: give --pp P (2 or more)")
        # a sample to each microbatch by default
        args.batch = (args.microbatches or args.pp or 1) if args.batch is None else args.batch
        args.seq = 128 if args.seq is None else args.seq
    if args.batch < 1 or args.seq < 1 or args.max_batch < 1:
        raise UsageError("--batch, --seq and --max-batch must be positive")
    if not 1 <= args.steps <= 1000:
        raise UsageError("--steps must be between 1 and 1000")
    if args.timm and (args.hf_set or args.attn_implementation):
        raise UsageError("--hf-set and --attn-implementation are for --hf models")
    if args.achieved and (args.device != "cpu" or args.command != "profile" or args.dp is not None):
        raise UsageError("--achieved is for profile --device cpu (a real CPU run) of one process")
    if args.command == "fit" and args.device != "cuda":
        raise UsageError("fit compares the CUDA allocator's reserved bytes: --device cuda")
    if args.command == "fit" and (args.html or args.snapshot or args.allocator_events or args.table != "summary"
                                  or args.format == "csv"):
        raise UsageError("--html, --snapshot, --allocator-events, --table and --format csv are for profile")
    check_checkpoint(args)
    if args.search:
        if args.command != "fit" or not (args.hf or args.torchtitan):
            raise UsageError("--search is for fit --hf and fit --torchtitan")
        if args.gpus is None or args.gpus < 1:
            raise UsageError("fit --search needs --gpus N (positive)")
        if (args.dp is not None or args.zero is not None or args.fsdp or args.rank is not None or args.checkpointing
                or args.tp is not None or args.pp is not None or args.microbatches is not None
                or args.recompute is not None):
            raise UsageError("fit --search picks the layout and recomputation: drop --dp, --tp, --pp, "
                             "--microbatches, --zero, --fsdp, --rank, --checkpointing and --recompute")
        if args.jobs < 1:
            raise UsageError("--jobs must be positive")
        if args.ray is not None and args.jobs != 1:
            raise UsageError("--jobs and --ray each say where the layouts are searched: give one")
        if args.gpus_per_node is not None and args.gpus_per_node < 1:
            raise UsageError("--gpus-per-node must be positive")
        args.sharding = None
    else:
        if args.gpus is not None or args.ray is not None or args.jobs != 1:
            raise UsageError("--gpus, --jobs and --ray are for fit --search")
        args.sharding = None if args.torchtitan else sharding_of(args)
    check_shared_flags(args)


def check_checkpoint(args):
    """checkpoint recomputes transformers' layers or timm's blocks itself and
    writes its plan as the zoo's does (--format table or json, --html)."""
    if args.command != "checkpoint":
        if args.budget is not None or args.solver != "auto" or args.pareto:
            raise UsageError("--budget, --solver and --pareto are for checkpoint")
        return
    if args.torchtitan:
        raise UsageError("checkpoint recomputes --hf layers and --timm blocks; torchtitan's presets recompute as "
                         "torchtitan does: fit --torchtitan --search tries its modes")
    if args.budget is None:
        raise UsageError("checkpoint needs --budget")
    if args.checkpointing:
        raise UsageError("checkpoint chooses what to recompute itself: leave out --checkpointing")
    if args.snapshot or args.allocator_events or args.table != "summary" or args.format == "csv":
        raise UsageError("--snapshot, --allocator-events, --table and --format csv are for profile")


def check_torchtitan(args):
    """torchtitan's presets train as its Trainer does (bf16 FSDP2, AdamW, its
    activation checkpointing) on GPUs: the flags of other sources do not
    apply. The job's layout, the preset's unless given, checked."""
    if args.torchtitan not in titan.PRESETS:
        raise UsageError(f"unknown torchtitan flavor {args.torchtitan!r}: one of {', '.join(titan.PRESETS)}")
    others = {"--hf-set": args.hf_set, "--attn-implementation": args.attn_implementation,
              "--checkpointing": args.checkpointing, "--zero": args.zero is not None, "--fsdp": args.fsdp,
              "--gpus-per-node": args.gpus_per_node is not None, "--achieved": args.achieved,
              "--dtype": args.dtype != "f32", "--optimizer": args.optimizer != "adamw"}
    if any(others.values()):
        raise UsageError(f"{', '.join(flag for flag, given in others.items() if given)}: not for --torchtitan, "
                         "which trains as its preset does (--recompute for its activation checkpointing)")
    if args.device != "cuda":
        raise UsageError("--torchtitan trains on GPUs: --device cuda")
    preset = titan.PRESETS[args.torchtitan]
    batch_given = args.batch is not None
    args.batch = preset.local_batch_size if args.batch is None else args.batch
    args.seq = preset.seq_len if args.seq is None else args.seq
    args.compile = preset.compile if args.compile is None else args.compile == "on"
    args.float8 = preset.float8 if args.float8 is None else args.float8 == "on"
    if args.search:
        return
    if args.microbatches is not None and (args.pp or 1) == 1:
        raise UsageError("--microbatches is for a pipeline: give --pp P (2 or more)")
    args.tp = preset.tensor_parallel if args.tp is None else args.tp
    args.pp = 1 if args.pp is None else args.pp
    args.microbatches = args.microbatches or args.pp
    if not batch_given:  # the preset's, or a sample to each microbatch where it has fewer
        args.batch = max(args.batch, args.microbatches)
    if args.tp < 1 or args.pp < 1 or args.microbatches < 1 or (args.dp is not None and args.dp < 1):
        raise UsageError("--tp, --pp, --microbatches and --dp must be positive")
    if args.batch % args.microbatches:
        raise UsageError(f"--batch {args.batch} does not split into --microbatches {args.microbatches} equal ones")
    args.dp = max(preset.world_size // (args.tp * args.pp), 1) if args.dp is None else args.dp
    args.recompute = preset.activation_checkpoint if args.recompute is None else args.recompute
    args.rank = 0 if args.rank is None else args.rank
    if not 0 <= args.rank < args.pp * args.dp * args.tp:
        raise UsageError(f"--rank must be in [0, {args.pp * args.dp * args.tp}) for "
                         + (f"--pp {args.pp} x " if args.pp > 1 else "") + f"--dp {args.dp} x --tp {args.tp}")


def sharding_of(args):
    """The Sharding that --dp, --tp, --pp, --microbatches, --zero, --fsdp and
    --gpus-per-node ask for (None without --dp, --tp or --pp); --rank and
    --batch checked against it."""
    if args.dp is None and args.tp is None and args.pp is None:
        if args.zero is not None or args.fsdp or args.gpus_per_node is not None or args.rank is not None:
            raise UsageError("--zero, --fsdp, --gpus-per-node and --rank are for data parallelism: give --dp N")
        return None
    if args.timm:
        raise UsageError("--dp and --tp are for --hf models (transformers names their layers to shard and plans "
                         "their tensor parallelism)")
    dp, tp, pp = (1 if value is None else value for value in (args.dp, args.tp, args.pp))
    if dp < 1 or tp < 1 or pp < 1 or (args.microbatches is not None and args.microbatches < 1):
        raise UsageError("--dp, --tp, --pp and --microbatches must be positive")
    if args.zero is not None and args.zero != 3:
        raise UsageError(f"--zero {args.zero}: --hf models are sharded by FSDP2 (--zero 3, --fsdp full or "
                         "hybrid); DDP and ZeRO 1 and 2 are traced for the zoo's models (docs/parallelism.md)")
    if args.zero == 3 and args.fsdp == "hybrid":
        raise UsageError("--zero 3 shards across every rank; --fsdp hybrid within a node: give one")
    if args.gpus_per_node is not None and args.fsdp != "hybrid":
        raise UsageError("--gpus-per-node is for --fsdp hybrid")
    shape = (f"--pp {pp} x " if pp > 1 else "") + f"--dp {dp}" + (f" x --tp {tp}" if tp > 1 else "")
    rank = 0 if args.rank is None else args.rank
    if not 0 <= rank < pp * dp * tp:
        raise UsageError(f"--rank must be in [0, {pp * dp * tp}) for {shape}")
    args.rank = rank
    pipeline = {"pipeline_parallel": pp, "microbatches": args.microbatches or (pp if pp > 1 else None)}
    if pp > 1 and args.batch % pipeline["microbatches"]:
        raise UsageError(f"--batch {args.batch} does not split into --microbatches {pipeline['microbatches']} "
                         "equal ones")
    if args.fsdp != "hybrid":
        return Sharding(dp, tensor_parallel=tp, **pipeline)
    gpus_per_node = 8 if args.gpus_per_node is None else args.gpus_per_node
    if gpus_per_node < 1 or (dp * tp) % gpus_per_node:
        raise UsageError(f"--fsdp hybrid needs whole nodes: --dp {dp}" + (f" x --tp {tp}" if tp > 1 else "") +
                         f" is not a multiple of --gpus-per-node {gpus_per_node}")
    if gpus_per_node % tp:
        raise UsageError(f"--fsdp hybrid: a node of --gpus-per-node {gpus_per_node} must hold whole tensor-parallel "
                         f"groups of --tp {tp}")
    return Sharding(dp, gpus_per_node // tp, tp, **pipeline)


def compiled_float8(compile, float8):
    """", compiled, float8" as far as a torchtitan job is either."""
    return "".join(f", {what}" for what, on in (("compiled", compile), ("float8", float8)) if on)


def job_lines(args):
    """(JSON, summary lines) naming the data-parallel job the trace is a rank of."""
    if args.torchtitan:
        job = {"data_parallel": args.dp, "tensor_parallel": args.tp, "pipeline_parallel": args.pp,
               "microbatches": args.microbatches, "rank": args.rank, "sharding": "fsdp2",
               "recompute": args.recompute, "compile": args.compile, "float8": args.float8}
        pipeline = (f", pipeline parallel {args.pp} (pipeline rank {args.rank // (args.dp * args.tp)}, "
                    f"{args.microbatches} microbatches)" if args.pp > 1 else "")
        return {"job": job}, [f"  as rank {args.rank} of torchtitan's {args.torchtitan} on "
                              f"{args.pp * args.dp * args.tp} GPUs: tensor parallel {args.tp}, FSDP2 over {args.dp}"
                              f"{pipeline}, recompute {args.recompute}{compiled_float8(args.compile, args.float8)}"]
    if args.sharding is None:
        return None, []
    sharding = args.sharding
    how = ("FSDP2, each layer and the model fully sharded" if sharding.ranks_per_node is None else
           f"FSDP2 hybrid: sharded within nodes of {sharding.ranks_per_node}, replicated across "
           f"{sharding.ranks // sharding.ranks_per_node}")
    job = {"data_parallel": sharding.ranks, "tensor_parallel": sharding.tensor_parallel,
           "pipeline_parallel": sharding.pipeline_parallel, "microbatches": sharding.microbatches, "rank": args.rank,
           "ranks_per_node": sharding.ranks_per_node, "sharding": "fsdp2"}
    if sharding.world_size == sharding.ranks:
        return {"job": job}, [f"  as data-parallel rank {args.rank} of {sharding.ranks} ({how})"]
    parts = []
    if sharding.pipeline_parallel > 1:
        stage = args.rank // (sharding.world_size // sharding.pipeline_parallel)
        parts.append(f"pipeline parallel {sharding.pipeline_parallel} (stage {stage} as transformers splits the "
                     f"layers, {sharding.microbatches} microbatches under torch's 1F1B schedule)")
    if sharding.tensor_parallel > 1:
        parts.append(f"tensor parallel {sharding.tensor_parallel} (transformers' tp_plan)")
    if sharding.ranks > 1:
        parts.append(f"{how} over {sharding.ranks} data-parallel ranks")
    return {"job": job}, [f"  as rank {args.rank} of {sharding.world_size}: {', '.join(parts)}"]


def check_shared_flags(args):
    """What profile, fit and run check alike."""
    if args.depth < 1:
        raise UsageError("--depth must be at least 1")
    args.depth = min(args.depth, 1000)  # deeper than any module tree: all of it
    _metamem.gpu(args.gpu)  # ValueError naming the known GPUs


def step_of(args, batch):
    """The training step and the modules built before it."""
    optimizer = None if args.optimizer == "none" else args.optimizer
    if args.hf:
        from . import hf
        cfg = hf.config(args.hf, **dict(parse_setting(s) for s in args.hf_set))
        step = hf.training_step(cfg, batch, args.seq, args.device, args.dtype, optimizer, args.steps,
                                args.attn_implementation, args.checkpointing, args.sharding)
        return step, ()
    from . import timm
    model = timm.create(args.timm)
    step = timm.training_step(model, batch, args.device, args.dtype, optimizer, args.steps, args.checkpointing)
    return step, (model,)


def traced(args, batch):
    """The Trace of the step at `batch`, the step and the modules built before it."""
    if args.torchtitan:
        t = titan.trace(args.torchtitan, args.pp * args.dp * args.tp, args.rank, args.gpu, args.steps,
                        local_batch_size=batch, seq_len=args.seq, tensor_parallel=args.tp, pipeline_parallel=args.pp,
                        microbatches=args.microbatches if args.pp > 1 else None,
                        activation_checkpoint=args.recompute,
                        compile=args.compile, float8=args.float8)
        return t, None, ()
    step, modules = step_of(args, batch)
    world = None if args.sharding is None else args.sharding.world_size
    with trace(device=args.device, modules=modules, gpu=args.gpu, values=args.values, world_size=world,
               rank=args.rank or 0) as t:
        step()
    return t, step, modules


def render(t, args, extra=None, lines=()):
    """What `metamem profile` prints and writes for the zoo's models: the
    same flags, the same report model. `extra` adds to the JSON report,
    `lines` to the summary."""
    if args.snapshot:
        t.snapshot(args.snapshot)
    if args.allocator_events:
        t.save_allocator_events(args.allocator_events)
    if args.html:
        t.html(args.html, args.depth)
    rows = "modules" if args.table == "modules" else "nodes"
    if args.format == "json":
        print(json.dumps({**t.json(args.depth), **(extra or {})}, indent=2))
    elif args.format == "csv":
        print(t.table(rows, args.depth, csv=True), end="")
    else:
        if args.table != "summary":
            print(t.table(rows, args.depth), end="")
        print(t.report(), end="")
        print("".join(line + "\n" for line in lines), end="")


def profile(args):
    t, step, modules = traced(args, args.batch)
    extra, lines = job_lines(args)
    if not args.achieved:
        render(t, args, extra, lines)
        return 0
    achieved = achieved_cpu(step, modules=modules)
    render(t, args, {**(extra or {}), "achieved": {"peak_bytes": achieved}},
           lines + [f"  {'achieved peak (real CPU)':<39}{achieved:,} B   "
                    f"predicted - achieved {max(t.step_peaks) - achieved:+,} B"])
    return 0


def fit(args):
    """The largest batch whose step's reserved peak fits in what the GPU's
    memory leaves the allocator beside the CUDA context."""
    memory = _metamem.parse_memory(args.memory, "--memory") if args.memory else 0
    context = _metamem.parse_memory_or_zero(args.cuda_context, "--cuda-context") if args.cuda_context else None

    def gpu_for(layout):
        """The GPU's memory beside the CUDA context and the layout's NCCL communicators."""
        return gpu_memory(args.gpu, memory, context, job_of_layout(layout).process_groups())

    if args.search:
        found = search(args, gpu_for)
        if args.format == "json":
            print(json.dumps(found, indent=2))
        else:
            print_search(found)
        return 0
    gpu = gpu_for(args)
    budget = gpu["allocator_bytes"]
    best, tried, _ = largest_local_batch(args, argparse.Namespace(), budget)
    ranks = [rank["rank"] for rank in next(iter(tried.values()))]
    tried = {batch: max(rank["reserved_bytes"] for rank in traced) for batch, traced in tried.items()}
    extra, lines = job_lines(args)
    if len(ranks) > 1:
        lines.append(f"  ranks {' and '.join(map(str, ranks))} traced (the first and the last stage's first), "
                     "the larger reserved counting")
    if args.format == "json":
        print(json.dumps({"gpu": args.gpu, "memory_bytes": gpu["total_bytes"], "gpu_memory": gpu,
                          "largest_batch": best, "max_batch": args.max_batch, "capped": best == args.max_batch,
                          "reserved_bytes": {str(b): r for b, r in sorted(tried.items())}, "ranks_traced": ranks,
                          **(extra or {})}, indent=2))
    else:
        beside = ", ".join(f"{use['what']} {use['bytes'] / 2**20:.0f} MiB" for use in gpu["beside_allocator"])
        print(f"{args.gpu}, {gpu['total_bytes'] / 2**30:.2f} GiB ({budget / 2**30:.2f} GiB left to the CUDA "
              f"allocator beside {beside}): largest batch that fits: {best}")
        print("".join(line + "\n" for line in lines), end="")
        if best == args.max_batch:
            print(f"  {best} is the --max-batch cap: larger batches were not tried and may fit")
        for batch, reserved in sorted(tried.items()):
            print(f"  batch {batch:>6}   reserved {reserved / 2**30:10.2f} GiB   "
                  f"{'fits' if reserved <= budget else 'does not fit'}")
    return 0


def checkpoint_units(args, stage=0):
    """The module paths of the layers (--hf) or blocks (--timm) a
    Checkpointing recomputes, in order: with --pp, pipeline stage `stage`'s."""
    if args.hf:
        from . import hf

        cfg = hf.config(args.hf, **dict(parse_setting(s) for s in args.hf_set))
        stages = 1 if args.sharding is None else args.sharding.pipeline_parallel
        return hf.checkpoint_layers(cfg, args.attn_implementation, stage, stages)
    from . import timm

    model = timm.create(args.timm)
    return [f"{type(model).__name__}.{path}" for path, _ in timm.checkpoint_blocks(model)]


def checkpoint(args):
    """The layers or blocks to recompute, fully or selectively, with the
    fewest FLOPs recomputed that bring the step's peak within --budget:
    with --pp, each pipeline stage's own (checkpoint_stages)."""
    if args.sharding is not None and args.sharding.pipeline_parallel > 1:
        return checkpoint_stages(args)
    units = checkpoint_units(args)
    model = args.hf or args.timm
    if not units:
        raise UsageError(f"{model} has no layers or blocks to recompute one by one")
    return least_recompute_report(args, model, args.batch, units, measuring(args))


def measuring(args):
    """measure(plan) for least_recompute_found: the step of the rank the
    flags name traced under the plan, with the job that rank is of."""
    extra, lines = job_lines(args)

    def measure(plan):
        return traced(argparse.Namespace(**{**vars(args), "checkpointing": plan}), args.batch)[0], extra or {}, lines
    return measure


def checkpoint_stages(args):
    """checkpoint --pp: a plan for each pipeline stage (that of --rank
    alone where it is given). A rank holds its stage's layers only and the
    stages hold different numbers of microbatches' activations under 1F1B
    (the first the most), so each stage is searched apart, on its first
    rank (a stage's ranks differ only in the padding of uneven shards):
    which of its layers to recompute for its peak to fit --budget. The
    summary prints each stage's plan in turn, the JSON gives them in
    "stages", and --html writes a page for each stage (PATH.stageN.html).
    1 where a stage does not fit."""
    sharding = args.sharding
    stages, per_stage = sharding.pipeline_parallel, sharding.world_size // sharding.pipeline_parallel
    ranks = [args.rank] if args.rank_given else [stage * per_stage for stage in range(stages)]
    fitting, texts, reports = True, [], []
    for rank in ranks:
        stage = rank // per_stage
        units = checkpoint_units(args, stage)
        at_rank = argparse.Namespace(**{**vars(args), "rank": rank})
        heading = f"pipeline stage {stage} of {stages} (rank {rank})"
        try:
            t, text, report = least_recompute_found(args, args.hf, args.batch, units, measuring(at_rank))
        except NoPlanFits as none:
            fitting = False
            print(f"metamem: {heading}: {none}", file=sys.stderr)
            reports.append({"stage": stage, "rank": rank, "fits": False, "lowest_peak_bytes": none.lowest_peak,
                            **job_lines(at_rank)[0]})
            continue
        if args.html:
            stem, suffix = os.path.splitext(args.html)
            t.html(f"{stem}.stage{stage}{suffix}", args.depth, checkpoint=json.dumps(report))
        texts.append(f"{heading}\n{text}")
        reports.append({"stage": stage, "rank": rank, "fits": True, **report})
    if args.format == "json":
        print(json.dumps({"stages": reports}, indent=2))
    else:
        print("".join(texts), end="")
    return 0 if fitting else 1


class NoPlanFits(Exception):
    """No plan the solver traced brings the peak within --budget."""

    def __init__(self, message, lowest_peak):
        super().__init__(message)
        self.lowest_peak = lowest_peak


def least_recompute_found(args, source, batch, units, measure, seconds_before=0.0):
    """Searches the plans of `units` (least_recompute) with measure(plan) ->
    (Trace, JSON to add, lines to add): the plan's Trace and its report's
    text and JSON object (the zoo's `metamem checkpoint` report, with the
    lines and JSON to add). NoPlanFits, naming `source`, where none fits --budget.
    `seconds_before`: the search's time before it (a trace that found the
    units)."""
    budget = _metamem.parse_memory(args.budget, "--budget")
    traces = {}

    def peak_and_flops(plan):
        traces[plan] = measure(plan)
        t = traces[plan][0]
        return max(t.step_peaks), t.flops["recompute"], t.flops["total"]

    found = least_recompute(peak_and_flops, len(units), budget, args.solver, args.pareto)
    plan = found["plan"]
    if plan is None:
        raise NoPlanFits(f"{source} does not fit in {_metamem.human_bytes(budget)} with the {args.solver} "
                         f"solver; the least memory a traced plan reaches is "
                         f"{_metamem.human_bytes(found['lowest_peak'])} ({found['lowest_peak']} B)",
                         found["lowest_peak"])
    t, extra, lines = traces[plan]
    run = t.json(1)
    text, report = _metamem.checkpoint_report(
        model=run["model"], device=run["device"], batch=batch or 0, dtype=run["dtype"], optimizer=run["optimizer"],
        budget=budget, solver=args.solver, policy=plan.policy_text(len(units)), units=units, peak=found["peak"],
        unchecked_peak=found["unchecked_peak"], recompute_flops=found["recompute_flops"],
        step_flops=found["step_flops"], search_ms=1000 * (seconds_before + found["seconds"]), traces=found["traces"],
        pareto=found["pareto"])
    return t, text + "".join(line + "\n" for line in lines), {**json.loads(report), **extra}


def least_recompute_report(args, source, batch, units, measure, seconds_before=0.0):
    """least_recompute_found's plan printed as the zoo's are printed
    (--format, --html); 1 where none fits --budget."""
    try:
        t, text, report = least_recompute_found(args, source, batch, units, measure, seconds_before)
    except NoPlanFits as none:
        print(f"metamem: {none}", file=sys.stderr)
        return 1
    if args.html:
        t.html(args.html, args.depth, checkpoint=json.dumps(report))
    if args.format == "json":
        print(json.dumps(report, indent=2))
    else:
        print(text, end="")
    return 0


def job_of_layout(layout):
    """The Sharding a layout (the flags, or a search's layout) is a rank of:
    --hf's own; torchtitan's from its pipeline, FSDP2 and tensor-parallel
    degrees; one process for the rest."""
    sharding = getattr(layout, "sharding", None)
    if sharding is None and getattr(layout, "tp", None) is not None:  # torchtitan's: FSDP2 over dp, tp over tp
        return Sharding(layout.dp, tensor_parallel=layout.tp, pipeline_parallel=layout.pp,
                        microbatches=layout.microbatches if layout.pp > 1 else None)
    return sharding or Sharding(1)



def layouts_of(args):
    """The layouts fit --search tries on --gpus, each a Namespace of the
    flags it sets. --hf: one GPU unsharded; more, pipeline parallel 1, 2,
    4 or 8 (where transformers splits the model into stages of a layer or
    more), tensor parallel 1, 2, 4 or 8 (within a node, where transformers
    splits the model so) and FSDP2 over the rest, fully sharded and, where
    a stage's ranks span whole nodes of --gpus-per-node (8), hybrid; each
    without recompute and with every layer recomputed; a pipeline runs as
    many microbatches as it has stages. --torchtitan: pipeline parallel 1, 2, 4 or 8 and
    tensor parallel 1, 2, 4 or 8 (within a node) whose product divides the
    GPUs, FSDP2 over the rest, with each of torchtitan's activation
    checkpointing modes; a pipeline runs as many microbatches as it has
    ranks (the fewest its 1F1B schedule takes)."""
    if args.torchtitan:
        return [argparse.Namespace(pp=pp, tp=tp, dp=args.gpus // (pp * tp), microbatches=pp, recompute=recompute)
                for recompute in ("none", "selective", "full") for pp in (1, 2, 4, 8) for tp in (1, 2, 4, 8)
                if tp <= min(args.gpus, 8) and args.gpus % (pp * tp) == 0]
    from . import hf
    from ._pipeline import pipeline_refusal
    from ._sharding import tensor_parallel_refusal

    config = hf.config(args.hf, **dict(parse_setting(s) for s in args.hf_set))
    per_node = args.gpus_per_node or 8
    shardings = [None] if args.gpus == 1 else []
    # transformers splits the model into pp stages and tp ways where it has the plans, the layers and heads
    stages = [pp for pp in (1, 2, 4, 8) if pp == 1 or pipeline_refusal(config, pp) is None]
    ways = [tp for tp in (1, 2, 4, 8) if tp == 1 or tensor_parallel_refusal(config, tp) is None]
    for pp in stages:
        for tp in ways:
            if tp > min(args.gpus, per_node) or args.gpus % (pp * tp):
                continue
            dp, pipeline = args.gpus // (pp * tp), {"pipeline_parallel": pp}
            if pp * tp > 1 or dp > 1:
                shardings.append(Sharding(dp, tensor_parallel=tp, **pipeline))
            if dp * tp > per_node and dp * tp % per_node == 0 and per_node % tp == 0:
                shardings.append(Sharding(dp, per_node // tp, tp, **pipeline))
    return [argparse.Namespace(sharding=sharding, checkpointing=recompute)
            for recompute in (False, True) for sharding in shardings]


def largest_local_batch(args, layout, budget):
    """(largest batch, {batch: [{"rank", "peak_bytes", "reserved_bytes"} of
    each rank traced]}, traces) of the flags' layout with `layout`'s flags
    set, read off the line through batches 1 and 2 and verified
    (metamem.largest_batch_by_line). The ranks that differ are traced
    (ranks_that_differ: rank 0, and a pipeline's last stage's first), the
    larger of each figure counting, unless --rank names one. A pipeline's
    batches are its microbatches' multiples (its stages hold microbatches
    of activations, however many there are)."""
    args = argparse.Namespace(**{**vars(args), **vars(layout)})
    job = job_of_layout(args)
    ranks = [args.rank] if args.rank_given else ranks_that_differ(job.world_size, job.pipeline_parallel)
    tried = {}

    def measure(batch):
        traces = {rank: traced(argparse.Namespace(**{**vars(args), "rank": rank}), batch)[0] for rank in ranks}
        tried[batch] = [{"rank": rank, "peak_bytes": max(t.step_peaks), "reserved_bytes": t.reserved_peak_bytes}
                        for rank, t in traces.items()]
        return (max(rank["peak_bytes"] for rank in tried[batch]),
                max(rank["reserved_bytes"] for rank in tried[batch]))

    return (largest_batch_by_line(measure, budget, args.max_batch, job.microbatches or 1), tried,
            len(tried) * len(ranks))


def layout_row(args, layout):
    """A search row's layout: its fields and how the table shows them."""
    if args.torchtitan:
        pipeline = f"pp {layout.pp} x " if layout.pp > 1 else ""
        return {"pp": layout.pp, "tp": layout.tp, "dp": layout.dp, "microbatches": layout.microbatches,
                "recompute": layout.recompute, "shown": f"{pipeline}tp {layout.tp} x FSDP2 {layout.dp}"}
    sharding = layout.sharding or Sharding(1)
    tp, pp, dp = sharding.tensor_parallel, sharding.pipeline_parallel, sharding.ranks
    kind = "none" if dp == 1 else "full" if sharding.ranks_per_node is None else "hybrid"
    shown = {"none": "none (one GPU)" if tp * pp == 1 else "", "full": f"FSDP2 full ({dp})",
             "hybrid": f"FSDP2 hybrid ({dp // (sharding.ranks_per_node or 1)} x {sharding.ranks_per_node})"}[kind]
    shown = " x ".join([f"pp {pp}"] * (pp > 1) + [f"tp {tp}"] * (tp > 1) + [shown] * bool(shown))
    return {"sharding": kind, "dp": dp, "tp": tp, "pp": pp, "microbatches": sharding.microbatches,
            "ranks_per_node": sharding.ranks_per_node, "recompute": "layers" if layout.checkpointing else "none",
            "shown": shown}


def search(args, gpu_for):
    """fit --search: each layout's largest local batch within what
    gpu_for(layout) leaves the allocator, in --jobs processes or on Ray."""
    import time

    start = time.perf_counter()
    layouts = layouts_of(args)
    budgets = [gpu_for(layout)["allocator_bytes"] for layout in layouts]
    asked = [(args, layout, budget) for layout, budget in zip(layouts, budgets)]
    results = each_apart(largest_local_batch, asked, args.jobs, args.ray, quiet_imports)
    rows = []
    for layout, budget, (best, tried, traces) in zip(layouts, budgets, results):
        ranks = tried.get(best)
        rows.append({**layout_row(args, layout), "local_batch": best,
                     "peak_bytes": ranks and max(rank["peak_bytes"] for rank in ranks),
                     "reserved_bytes": ranks and max(rank["reserved_bytes"] for rank in ranks), "ranks": ranks,
                     "allocator_bytes": budget, "traces": traces})
    rows.sort(key=lambda row: (row["recompute"] != "none", row["recompute"] == "full", -row["local_batch"]))
    found = {"model": args.torchtitan or args.hf, "gpus": args.gpus, "gpu": args.gpu,
             "memory_bytes": gpu_for(argparse.Namespace(sharding=None))["total_bytes"],
             "max_batch": args.max_batch, "layouts": rows, "traces": sum(row["traces"] for row in rows),
             "seconds": round(time.perf_counter() - start, 1), "jobs": args.jobs, "ray": args.ray}
    if args.torchtitan:
        found.update(compile=args.compile, float8=args.float8)
    return found


def print_search(found):
    where = (f"Ray tasks at {found['ray']}" if found["ray"] is not None
             else f"{found['jobs']} process{'es' * (found['jobs'] > 1)}")
    extras = compiled_float8(found.get("compile"), found.get("float8"))
    pipelines = ", and a pipeline's last rank" if any(row.get("pp", 1) > 1 for row in found["layouts"]) else ""
    print(f"{len(found['layouts'])} layouts on {found['gpus']} {found['gpu']} of {found['memory_bytes'] / 2**30:.2f} "
          f"GiB (rank 0 traced, whose shards are the largest{pipelines}{extras}): {found['traces']} traces, "
          f"{found['seconds']} s, {where}")
    width = max(len("layout"), *(len(row["shown"]) for row in found["layouts"])) + 2
    print(f"  {'layout':<{width}}{'recompute':<11}{'local batch':>11}{'peak':>14}{'reserved':>14}{'allocator':>14}")
    for row in found["layouts"]:
        peak, reserved = ("-" if row[key] is None else f"{row[key] / 2**30:.2f} GiB"
                          for key in ("peak_bytes", "reserved_bytes"))
        print(f"  {row['shown']:<{width}}{row['recompute']:<11}{row['local_batch']:>11}{peak:>14}{reserved:>14}"
              f"{row['allocator_bytes'] / 2**30:>10.2f} GiB")
    if any(row["local_batch"] == found["max_batch"] for row in found["layouts"]):
        print(f"  {found['max_batch']} is the --max-batch cap: larger batches were not tried and may fit")


def failure(error):
    """(exit status, one line) for an error that ends the command: bad input
    (a flag, a file, a config) is 2, what metamem cannot trace or an error
    of its own 1."""
    lines = str(error).strip().splitlines() or [type(error).__name__]
    line = lines[0] if len(lines[0]) <= 300 else lines[0][:300] + "..."
    if isinstance(error, UnsupportedOpError):  # ValueReadError too; its message names metamem
        return 1, line
    if isinstance(error, ScriptError):  # the script's own error, as Python would have ended on it
        return 1, f"metamem: {line} (--debug prints the traceback)"
    if isinstance(error, (UsageError, ValueError, TypeError, KeyError, OSError, ImportError)):
        return 2, f"metamem: {line}"
    return 1, f"metamem: {type(error).__name__}: {line} (--debug prints the traceback)"


def job_of(args):
    """(world size, rank, ranks to a node) of a run's torchrun flags;
    (None, 0, None) without them."""
    if args.nproc_per_node is None:
        if args.nnodes is not None or args.rank is not None:
            raise UsageError("--nnodes and --rank are for a job: give --nproc-per-node")
        return None, 0, None
    nnodes = 1 if args.nnodes is None else args.nnodes
    if args.nproc_per_node < 1 or nnodes < 1:
        raise UsageError("--nproc-per-node and --nnodes must be positive")
    world = args.nproc_per_node * nnodes
    rank = 0 if args.rank is None else args.rank
    if not 0 <= rank < world:
        raise UsageError(f"--rank must be in [0, {world}) for {nnodes} node(s) of {args.nproc_per_node}")
    return world, rank, args.nproc_per_node


def run(args):
    """`metamem run SCRIPT ARGS`: the report of the script's first steps;
    with --budget, the plan of what to recompute in its model."""
    from ._run import trace_script

    world, rank, nproc_per_node = job_of(args)
    # JSON and CSV are for programs to read: what the script prints goes to stderr.
    printed = contextlib.redirect_stdout(sys.stderr) if args.format != "table" else contextlib.nullcontext()

    def script_traced(checkpointing=None):
        with printed:
            return trace_script(args.script, args.args, args.steps, args.device, args.gpu, args.values,
                                world_size=world, rank=rank, nproc_per_node=nproc_per_node,
                                checkpointing=checkpointing)

    if args.budget is None:
        if args.solver != "auto" or args.pareto:
            raise UsageError("--solver and --pareto are for a search of what to recompute: give --budget")
        t, script = script_traced()
        render(t, args, {"run": script.json()}, script.lines())
        return 0
    if args.snapshot or args.allocator_events or args.table != "summary" or args.format == "csv":
        raise UsageError("--snapshot, --allocator-events, --table and --format csv are for a run without --budget")
    start = time.perf_counter()
    plain = script_traced(Checkpointing(0))
    units = plain[1].blocks
    if not units:
        raise UsageError(f"{args.script}: its model has no blocks to recompute one by one (modules with "
                         "parameters and submodules in an nn.Sequential or nn.ModuleList)")

    def measure(plan):
        t, script = plain if plan == Checkpointing(0) else script_traced(plan)
        return t, {"run": script.json()}, script.lines()

    return least_recompute_report(args, args.script, None, units, measure, time.perf_counter() - start)


def quiet_imports(script=False):
    """Notices for the authors of the libraries a trace runs, not for this
    command's user, whose output (bad input: one line; a search's progress
    bar) they would break; in the command's process and in a search's.
    torchao, which transformers imports wherever it is installed (the
    float8 extra installs it), registers enums with torch's pytree as torch
    2.14 deprecates, and torch logs a warning for each at import; FSDP2
    warns at each step that torchtitan's sharded embedding returns a view,
    and DTensor that some of its redistributions take two collectives.
    Unless the command runs the user's `script` (whose libraries speak as
    they would): what torchtitan's Trainer logs below an error through the
    root logger (lspci missing, no checkpoint folder, the process group
    made already: each trace's, about the config metamem gives it) and
    torch's notices of deprecated c10d names (reduce_scatter_tensor,
    all_gather_into_tensor: some of a 70B search's collectives)."""
    import warnings

    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    if script:
        return
    import importlib.util

    torchtitan = importlib.util.find_spec("torchtitan")
    if torchtitan is not None and torchtitan.submodule_search_locations:
        logging.getLogger().addFilter(_BelowErrorFrom(list(torchtitan.submodule_search_locations)[0]))
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)


class _BelowErrorFrom(logging.Filter):
    """Drops the records below ERROR that the files under `folder` log."""

    def __init__(self, folder):
        super().__init__()
        self.folder = folder + "/"

    def filter(self, record):
        return record.levelno >= logging.ERROR or not record.pathname.startswith(self.folder)

    def __eq__(self, other):  # added once however many commands a process runs
        return isinstance(other, _BelowErrorFrom) and other.folder == self.folder

    def __hash__(self):
        return hash(self.folder)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    running = argv[:1] == ["run"]
    quiet_imports(script=running)
    args = run_parser().parse_args(argv[1:]) if running else parser().parse_args(argv)
    try:
        if running:
            check_shared_flags(args)
            return run(args)
        check(args)
        return {"profile": profile, "fit": fit, "checkpoint": checkpoint}[args.command](args)
    except Exception as error:
        if args.debug:
            raise
        status, line = failure(error)
        print(line, file=sys.stderr)
        return status
