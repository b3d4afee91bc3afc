"""Llama 3 as torchtitan trains it, one rank at a time: torchtitan's own
model, float8 converter, parallelize function (tensor parallelism,
activation checkpointing, torch.compile of each block, FSDP2 with bf16
compute), loss (compiled with the blocks), optimizer and gradient clipping,
set up and stepped as its Trainer does, with torchtitan's presets for 8B,
70B and 405B as it ships them (405B compiled, with float8), inside
trace(world_size=N, rank=r).

    import metamem.torchtitan as titan
    t = titan.trace("8B", world_size=8)           # rank 0 of torchtitan's 8B preset
    t.reserved_peak_bytes
    titan.largest_batch("70B", world_size=64)      # local batch on 80 GiB H100s
    titan.trace("405B", compile=False, float8=False)   # 405B eager, in bf16

torchtitan is an optional dependency (`pip install .[models]`).
"""

import copy
import dataclasses
import os
import unittest.mock

import torch

from . import gpu_memory
from . import largest_batch_by_line
from . import trace as metamem_trace

__all__ = ["PRESETS", "Preset", "job_config", "training_step", "trace", "largest_batch"]


@dataclasses.dataclass(frozen=True)
class Preset:
    """A torchtitan training configuration: its GPUs and what each rank runs."""

    world_size: int
    local_batch_size: int
    seq_len: int
    tensor_parallel: int
    activation_checkpoint: str  # "none", "selective" (torchtitan's op policy) or "full"
    compile: bool = False  # each block and the loss compiled
    float8: bool = False  # float8 linears (tensorwise), all-gathered in float8 by FSDP2
    async_tensor_parallel: bool = False  # Inductor's micro-pipelined TP (asks for compile)


# torchtitan's train_configs/llama3_{8b,70b,405b}.toml; the debug model is
# its debug_model.toml with two-way tensor parallelism, for quick checks.
PRESETS = {
    "debugmodel": Preset(8, 8, 2048, 2, "selective"),
    "8B": Preset(8, 1, 8192, 1, "selective"),
    "70B": Preset(64, 8, 8192, 8, "full"),
    "405B": Preset(512, 2, 8192, 8, "full", compile=True, float8=True, async_tensor_parallel=True),
}


def _torchtitan():
    try:
        import torchtitan  # noqa: F401
    except ImportError as error:
        raise ImportError("metamem.torchtitan needs torchtitan: pip install .[models]") from error


def job_config(flavor, local_batch_size=None, seq_len=None, tensor_parallel=None, activation_checkpoint=None,
               compile=None, float8=None):
    """torchtitan's JobConfig for Llama 3 `flavor` (a key of PRESETS) with its
    preset, any of whose values the arguments replace."""
    _torchtitan()
    from torchtitan.config import JobConfig

    if flavor not in PRESETS:
        raise ValueError(f"unknown flavor {flavor!r}: one of {', '.join(PRESETS)}")
    preset = PRESETS[flavor]
    config = JobConfig()
    config.model.name, config.model.flavor = "llama3", flavor
    config.training.local_batch_size = local_batch_size or preset.local_batch_size
    config.training.seq_len = seq_len or preset.seq_len
    config.parallelism.tensor_parallel_degree = tensor_parallel or preset.tensor_parallel
    config.activation_checkpoint.mode = activation_checkpoint or preset.activation_checkpoint
    config.activation_checkpoint.selective_ac_option = "op"
    config.compile.enable = preset.compile if compile is None else compile
    config.parallelism.enable_async_tensor_parallel = preset.async_tensor_parallel and config.compile.enable
    if preset.float8 if float8 is None else float8:
        # The 405B toml names the converter "float8", which torchtitan 0.2.2
        # no longer registers (its Trainer stops with a KeyError); its float8
        # docs name it as here. parallelize_llama still looks for "float8" to
        # split float8 linears with float8 tensor parallelism: under this
        # name they are split as bf16 ones are, as torchtitan runs them.
        config.model.converters = ["quantize.linear.float8"]
        float8_config = config.quantize.linear.float8
        float8_config.enable_fsdp_float8_all_gather = True
        float8_config.precompute_float8_dynamic_scale_for_fsdp = True
        float8_config.filter_fqns = ["output"]
    return config


def training_step(config, steps=2, device="cuda"):
    """A function that runs `steps` of torchtitan's training step for
    `config` on this rank, from process group to optimizer, as its Trainer
    sets up and steps: model built on the meta device, converted (float8),
    parallelized (compiled), materialized on the rank's GPU and initialized;
    each step forward and loss (loss parallel under tensor parallelism),
    backward, gradient clipping, AdamW, float8 scales. Tokens are random:
    the data loader and tokenizer change no memory on the GPU. On the CPU
    (`device="cpu"`, gloo) for real runs to check traces against.
    Inductor's settings that torchtitan changes are put back after."""
    _torchtitan()
    import torch._inductor.config
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule
    import torchtitan.components.quantization.float8  # noqa: F401  (registers the float8 converter)
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.distributed import ParallelDims, parallel_dims
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.protocols.model_converter import build_model_converters
    from torchtitan.protocols.train_spec import get_train_spec
    from torchtitan.tools import utils

    inductor = torch._inductor.config
    set_by_torchtitan = {"_micro_pipeline_tp": inductor._micro_pipeline_tp,
                         "emulate_precision_casts": inductor.emulate_precision_casts}

    @inductor.patch(set_by_torchtitan)
    @unittest.mock.patch.object(parallel_dims, "device_type", device)  # its meshes' device, "cuda" without a GPU
    def step():
        if not dist.is_initialized():  # a real gloo run's process made its group
            dist.init_process_group("nccl" if device == "cuda" else "gloo")
        rank_device = torch.device(device)
        if device == "cuda":
            rank_device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(rank_device)
        parallelism = config.parallelism
        dims = ParallelDims(dp_shard=parallelism.data_parallel_shard_degree,
                            dp_replicate=parallelism.data_parallel_replicate_degree,
                            cp=parallelism.context_parallel_degree, tp=parallelism.tensor_parallel_degree,
                            pp=parallelism.pipeline_parallel_degree, ep=parallelism.expert_parallel_degree,
                            etp=parallelism.expert_tensor_parallel_degree, world_size=dist.get_world_size())
        spec = get_train_spec(config.model.name)
        model_args = copy.deepcopy(spec.model_args[config.model.flavor])  # the Trainer changes torchtitan's own
        model_args.update_from_config(config)
        with torch.device("meta"), utils.set_default_dtype(TORCH_DTYPE_MAP[config.training.dtype]):
            model = spec.model_cls(model_args)
        converters = build_model_converters(config, dims)
        converters.convert(model)
        loss_fn = spec.build_loss_fn(config, parallel_dims=dims)
        model = spec.parallelize_fn(model, dims, config)
        if device == "cpu":  # gloo has no premultiplied sum: FSDP2 sums, then divides in place
            for module in model.modules():
                if isinstance(module, FSDPModule):
                    module.set_force_sum_reduction_for_comms(True)
        model.to_empty(device=device)
        with torch.no_grad():
            model.init_weights(buffer_device=None)
        model.train()
        optimizers = spec.build_optimizers_fn([model], config.optimizer, dims)
        optimizers.register_step_post_hook(lambda *args, **kwargs: converters.post_optimizer_hook([model]))
        train_context = dist_utils.get_train_context(dims.tp_enabled and not parallelism.disable_loss_parallel)
        amp = dist_utils.maybe_enable_amp(dims, config.training.mixed_precision_param, device)
        batch, seq = config.training.local_batch_size, config.training.seq_len
        for _ in range(steps):
            optimizers.zero_grad()
            tokens = torch.randint(0, model_args.vocab_size, (batch, seq + 1))
            inputs, labels = tokens[:, :-1].to(rank_device), tokens[:, 1:].to(rank_device)
            # The Trainer sums valid tokens over the data-parallel ranks.
            valid_tokens = torch.tensor(batch * seq * dims.dp_shard, dtype=torch.float, device=rank_device)
            with train_context():
                with amp:
                    pred = model(inputs)
                    loss = loss_fn(pred, labels) / valid_tokens
                del pred
                loss.backward()
            dist_utils.clip_grad_norm_(list(model.parameters()), config.training.max_norm, foreach=True,
                                       pp_mesh=dims.get_optional_mesh("pp"), ep_enabled=dims.ep_enabled)
            optimizers.step()

    return step


def trace(flavor, world_size=None, rank=0, gpu="H100-80GB", steps=2, **overrides):
    """Rank `rank` of torchtitan's `flavor` preset on `world_size` GPUs (the
    preset's by default) traced on fake cuda; `overrides` go to job_config().
    Initialization's truncated normals branch on values: they read zeros."""
    config = job_config(flavor, **overrides)
    world_size = world_size or PRESETS[flavor].world_size
    with metamem_trace(device="cuda", gpu=gpu, world_size=world_size, rank=rank, values="placeholder") as t:
        training_step(config, steps)()
    return t


def largest_batch(flavor, world_size=None, gpu="H100-80GB", memory=None, most=64, **overrides):
    """The largest local batch size (up to `most`) whose rank 0 step reserves
    no more than what the CUDA context leaves of `memory` bytes of `gpu`
    (all of it by default): two-step traces of batches 1 and 2, then where
    their line meets the memory and the next batch, to verify
    (metamem.largest_batch_by_line)."""
    capacity = gpu_memory(gpu, memory)["allocator_bytes"]

    def measure(batch):
        t = trace(flavor, world_size, 0, gpu, local_batch_size=batch, **overrides)
        return max(t.step_peaks), t.reserved_peak_bytes

    return largest_batch_by_line(measure, capacity, most)
