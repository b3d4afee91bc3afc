"""Training steps written as users write distributed torch 2.x code, for
test_distributed.py: each builds its mesh and model, parallelizes it and
runs two AdamW steps (DDP's, three SGD steps). Real gloo processes and
per-rank traces run the same functions (spawned processes import them from
here)."""

import functools

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
# Imported here, not in the step: importing the module makes a tensor.
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                               parallelize_module)


def _train(model, device, features):
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        model(torch.randn(8, features, device=device)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()


def fsdp2(world, device="cpu", reshard_after_forward=True):
    """Four 512 x 512 layers, each its own FSDP2 unit with bf16 compute."""
    mesh = init_device_mesh(device, (world,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)]).to(device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    for layer in model:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    _train(model, device, 512)


def tensor_parallel(world, device="cpu"):
    """An MLP split Megatron's way: column-wise, then row-wise."""
    mesh = init_device_mesh(device, (world,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)).to(device)
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    _train(model, device, 64)


def sequence_parallel(world, device="cpu"):
    """A norm, then the MLP split Megatron's way, with the sequence split
    outside it: the norm works on the rank's tokens, the first linear
    gathers them, the second reduce-scatters its output."""
    mesh = init_device_mesh(device, (world,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LayerNorm(64), torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 64)).to(device)
    parallelize_module(model, mesh, {"0": SequenceParallel(),
                                     "1": ColwiseParallel(input_layouts=Shard(1)),
                                     "3": RowwiseParallel(output_layouts=Shard(1))})
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        tokens = torch.randn(4, 32 // world, 64, device=device)  # this rank's part of the sequence
        model(tokens).sum().backward()
        optimizer.step()
        optimizer.zero_grad()


class _WithAnUnusedHead(torch.nn.Module):
    """Layers of which the forward leaves the last out."""

    def __init__(self, layers):
        super().__init__()
        self.layers, self.unused = torch.nn.Sequential(*layers[:-1]), layers[-1]

    def forward(self, x):
        return self.layers(x)


def ddp(world, device="cpu", comm_hook=None, unused=False, accumulate=False, **options):
    """Six 512 x 512 layers and a batch norm under DistributedDataParallel,
    three SGD steps with momentum: its buckets (6 MiB, one at first, then
    rebuilt as gradients arrived: a first of 1 MiB) and its buffers'
    broadcast before each forward."""
    torch.manual_seed(0)
    layers = [torch.nn.BatchNorm1d(512)] + [torch.nn.Linear(512, 512) for _ in range(6 + unused)]
    model = (_WithAnUnusedHead(layers) if unused else torch.nn.Sequential(*layers)).to(device)
    model = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=unused, **options)
    if comm_hook is not None:  # a hook of torch's default_hooks, by name
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, getattr(default_hooks, f"{comm_hook}_hook"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in range(3):
        if accumulate:  # a first micro-batch's gradients kept, not reduced
            with model.no_sync():
                model(torch.randn(16, 512, device=device)).sum().backward()
        model(torch.randn(16, 512, device=device)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()


def pipeline(world, schedule="GPipe", microbatches=8):
    """Four 128 x 128 layers split into `world` stages, one a rank, under a
    torch.distributed.pipelining schedule, batch 256 in `microbatches`;
    stage shapes given (a process group that exchanges no values needs
    them; real runs then skip shape inference)."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers = [torch.nn.Linear(128, 128) for _ in range(4)]
    per = len(layers) // world
    module = torch.nn.Sequential(*layers[rank * per:(rank + 1) * per])
    shape = (256 // microbatches, 128)
    stage = PipelineStage(module, rank, world, torch.device("cpu"),
                          input_args=(torch.empty(shape, device="meta", requires_grad=rank > 0),),
                          output_args=(torch.empty(shape, device="meta", requires_grad=True),))
    kind = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}[schedule]
    steps = kind(stage, n_microbatches=microbatches, loss_fn=lambda output, target: output.sum())
    optimizer = torch.optim.AdamW(module.parameters())
    for _ in range(2):
        if rank == 0:
            steps.step(torch.randn(256, 128))
        else:
            steps.step(target=torch.zeros(256, 128))
        optimizer.step()
        optimizer.zero_grad()


def hf_llama(world, ranks_per_node=None, tensor_parallel=1, pipeline_parallel=1):
    """transformers' Llama (two layers, width 72: shards padded on 4 ranks)
    as `metamem profile --hf llama --dp N [--tp T] [--pp P]` shards and
    trains it: a pipeline rank's stage (one layer each of two), the linears
    split by its tp_plan, FSDP2 on each decoder layer and on the model (the
    stage), two AdamW steps of batch 2 (in two microbatches in a
    pipeline)."""
    import metamem
    from metamem import hf

    cfg = hf.config("llama", num_hidden_layers=2, hidden_size=72, intermediate_size=144, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=250)
    sharding = metamem.Sharding(world // (tensor_parallel * pipeline_parallel), ranks_per_node, tensor_parallel,
                                pipeline_parallel)
    hf.training_step(cfg, batch=2, seq=32, device="cpu", sharding=sharding)()


def hf_pipeline(world, model_type, layers=3):
    """A transformers decoder of the sweeps' reduced size (hf_configs.py)
    with `layers` layers, in a pipeline of two stages over `world` ranks
    (FSDP2 over the rest), two AdamW steps of batch 2 in two microbatches.
    Three layers: the first stage holds two, as transformers splits them."""
    import metamem
    from hf_configs import SEQ, reduced
    from metamem import hf

    cfg = reduced(model_type)
    cfg.num_hidden_layers = layers
    hf.training_step(cfg, batch=2, seq=SEQ, device="cpu", sharding=metamem.Sharding(world // 2, pipeline_parallel=2))()


DDP_OPTIONS = {"ddp": {}, "ddp_find_unused_parameters": {"unused": True},
               "ddp_gradient_as_bucket_view": {"gradient_as_bucket_view": True},
               "ddp_static_graph": {"static_graph": True}, "ddp_fp16_compress_hook": {"comm_hook": "fp16_compress"},
               "ddp_no_sync": {"accumulate": True}}

STEPS = {"fsdp2": fsdp2, "fsdp2_keep_unsharded": lambda world: fsdp2(world, reshard_after_forward=False),
         "tensor_parallel": tensor_parallel, "sequence_parallel": sequence_parallel,
         "pipeline_gpipe": pipeline,
         "pipeline_1f1b": lambda world: pipeline(world, "1F1B"),
         "hf_llama": hf_llama, "hf_llama_hybrid": lambda world: hf_llama(world, ranks_per_node=2),
         "hf_llama_tp": lambda world: hf_llama(world, tensor_parallel=2),
         "hf_llama_tp_alone": lambda world: hf_llama(world, tensor_parallel=world),
         "hf_llama_pp": lambda world: hf_llama(world, pipeline_parallel=2),
         "hf_llama_pp_tp": lambda world: hf_llama(world, tensor_parallel=2, pipeline_parallel=2),
         # GPT-NeoX's pipeline plan names its parts as Llama's does not
         # (embed_in, emb_dropout, layers, final_layer_norm)
         "hf_gpt_neox_pp": lambda world: hf_pipeline(world, "gpt_neox"),
         **{name: functools.partial(ddp, **options) for name, options in DDP_OPTIONS.items()}}


def _gloo_rank(rank, world, store, name, repeats, results):
    import metamem

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    make = STEPS[name] if isinstance(name, str) else name  # a name, or a function that pickles
    step = lambda: make(world)  # noqa: E731
    step()  # gloo connects its pairs at the first collective of each group
    results.put((rank, [metamem.achieved_cpu(step) for _ in range(repeats)]))
    dist.barrier()
    dist.destroy_process_group()


def gloo_peaks(name, world, store, repeats=3):
    """Each rank's achieved CPU peaks of `repeats` runs of STEPS[name] (or
    name(world), a function that pickles) in `world` real gloo processes:
    {rank: [bytes, ...]}."""
    return _in_processes(_gloo_rank, world, store, name, repeats)


def _torchrun_rank(rank, world, ports, script, argv, results):
    import os
    import runpy
    import sys

    import metamem

    sys.argv = [script, *argv]
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      GROUP_RANK="0", MASTER_ADDR="127.0.0.1")
    peaks = []
    for port in ports:  # each run makes and destroys its process group: a port of its own
        os.environ["MASTER_PORT"] = str(port)
        peaks.append(metamem.achieved_cpu(lambda: runpy.run_path(script, run_name="__main__")))
    results.put((rank, peaks))


def torchrun_peaks(script, argv, world, repeats=3):
    """Each rank's achieved CPU peaks of `repeats` runs of `script` with
    `argv`, in `world` real processes with torchrun's environment (one
    node): {rank: [bytes, ...]}."""
    import socket

    ports = []
    for _ in range(repeats):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
    return _in_processes(_torchrun_rank, world, ports, script, argv)


def _in_processes(target, world, *args):
    """{rank: result} of target(rank, world, *args, results) in `world`
    spawned processes, each putting (rank, result) on `results`."""
    import queue

    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=target, args=(rank, world, *args, results)) for rank in range(world)]
    for process in processes:
        process.start()
    peaks = {}
    while len(peaks) < world:
        try:
            rank, peak = results.get(timeout=1)
            peaks[rank] = peak
        except queue.Empty:
            failed = [process.exitcode for process in processes if process.exitcode not in (None, 0)]
            if failed:
                for process in processes:
                    process.kill()  # the others wait for it in a collective
                raise RuntimeError(f"a rank exited with {failed[0]}") from None
    for process in processes:
        process.join()
    return peaks
