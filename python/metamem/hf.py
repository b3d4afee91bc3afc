"""Hugging Face transformers models in a trace: a model built from its
config (no weights are downloaded), the head its task trains, synthetic
inputs of the right shapes, and a training step.

    import metamem.hf
    cfg = metamem.hf.config("llama", num_hidden_layers=4)        # or "LlamaForCausalLM", "config.json"
    t = metamem.hf.trace_step(cfg, batch=4, seq=2048, dtype="bf16", gpu="H100-80GB")
    t.peak_bytes
    step = metamem.hf.training_step(cfg, batch=2, seq=16, device="cpu")
    metamem.achieved_cpu(step)                                   # the same step for real on CPU

transformers is an optional dependency (`pip install .[models]`).
"""

import json
import os

import torch

from . import UnsupportedOpError, gpu_memory, trace
from ._checkpointing import Checkpointing
from ._hf_tasks import TASKS, inputs, task_of
from ._pipeline import Pipeline, pipeline_refusal, stage_module
from ._sharding import ranks_that_differ
from ._step import checked, positive, train
from . import largest_batch_by_line

__all__ = ["config", "training_step", "trace_step", "checkpoint_layers", "TASKS"]


def _transformers():
    try:
        import transformers
    except ImportError as error:
        raise ImportError("metamem.hf needs transformers: pip install .[models]") from error
    transformers.logging.set_verbosity_error()
    return transformers


def config(spec, **overrides):
    """A transformers config from a model type ("llama"), an architecture
    ("LlamaForCausalLM": its head is the one trained), a config.json path or a
    config object, with `overrides` set on it (transformers' attribute names:
    num_hidden_layers=2 works for GPT-2's n_layer too)."""
    transformers = _transformers()
    if isinstance(spec, transformers.PretrainedConfig):
        cfg = spec.__class__.from_dict(spec.to_dict())
    elif isinstance(spec, (str, os.PathLike)) and os.path.isfile(spec):
        with open(spec) as f:
            try:
                values = json.load(f)
            except json.JSONDecodeError as error:
                raise ValueError(f"{spec}: not a JSON config ({error})") from None
        if not isinstance(values, dict) or "model_type" not in values:
            raise ValueError(f"{spec}: a config.json is an object that names its model_type")
        if not isinstance(values["model_type"], str) or values["model_type"] not in transformers.CONFIG_MAPPING:
            raise ValueError(f"{spec}: transformers {transformers.__version__} knows no model_type "
                             f"{values['model_type']!r}")
        try:
            cfg = transformers.AutoConfig.for_model(**values)
        except Exception as error:  # transformers' own checks of the values, on one line
            raise ValueError(f"{spec}: {' '.join(str(error).split())}") from error
    elif isinstance(spec, str) and spec in transformers.CONFIG_MAPPING:
        cfg = transformers.AutoConfig.for_model(spec)
    elif isinstance(spec, str):
        # The architecture's own config class names its model type (several
        # model types share some architectures: EXAONE's is LlamaForCausalLM).
        model_class = getattr(transformers, spec, None)
        config_class = getattr(model_class, "config_class", None)
        model_type = getattr(config_class, "model_type", None) or None
        if model_type is None:
            raise ValueError(f"unknown Hugging Face model type or architecture {spec!r} "
                             "(a model type such as 'llama', an architecture such as 'LlamaForCausalLM', "
                             "or a config.json path)")
        cfg = transformers.AutoConfig.for_model(model_type)
        cfg.architectures = [spec]
    else:
        raise TypeError(f"a config is a model type, an architecture, a path or a PretrainedConfig, not {spec!r}")
    for key, value in overrides.items():
        if not hasattr(cfg, key):
            raise ValueError(f"{cfg.model_type}'s config has no attribute {key!r}")
        current = getattr(cfg, key)
        if _number(current) and not _number(value) or isinstance(current, int) and isinstance(value, float):
            raise ValueError(f"{cfg.model_type}'s {key} is {type(current).__name__} ({current!r}), "
                             f"not {value!r}")
        setattr(cfg, key, value)
    return cfg


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


MOST_LAYERS = 10_000  # a trace's work grows with them; ten times what any model has


def _check_sizes(cfg, batch, seq):
    """ValueError naming the config's key where the model has no position
    for a token, would take forever to build, or would make a tensor whose
    bytes overflow int64 (as torch's storage sizes must fit; 8 bytes to an
    element at most)."""
    positions = next((key for key in ("max_position_embeddings", "n_positions")
                      if isinstance(getattr(cfg, key, None), int)), None)
    if positions and getattr(cfg, positions) < seq:
        raise ValueError(f"seq {seq} is beyond the {getattr(cfg, positions)} positions of {cfg.model_type}'s "
                         f"config ({positions})")
    layers = getattr(cfg, "num_hidden_layers", None)
    if isinstance(layers, int) and layers > MOST_LAYERS:
        raise ValueError(f"num_hidden_layers must be at most {MOST_LAYERS:,}, got {layers}")
    for key in ("vocab_size", "hidden_size", "intermediate_size"):
        size = getattr(cfg, key, None)
        if isinstance(size, int) and batch * seq * size > 2**60:
            raise ValueError(f"batch {batch} x seq {seq} x {key} {size}: a tensor of more than 2^60 elements, "
                             f"whose bytes overflow int64")


def _layers(model):
    """The layers transformers checkpoints one by one, in the model's order."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]


def checkpoint_layers(cfg, attn_implementation=None, stage=0, stages=1):
    """The module paths of the layers `checkpointing` recomputes, in order
    (the model built on the meta device: nothing is allocated); with
    `stages` > 1, those pipeline rank `stage` holds, which a Checkpointing
    counts on that rank."""
    task, architecture = task_of(cfg)
    built_with = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    with torch.device("meta"):
        model = getattr(_transformers(), architecture)._from_config(cfg, **built_with)
    if stages > 1:
        refusal = pipeline_refusal(cfg, stages)
        if refusal:
            raise ValueError(refusal)
        stage_module(model, stage, stages)
    path = {module: name for name, module in model.named_modules()}
    return [f"{type(model).__name__}.{path[layer]}" for layer in _layers(model)]


def _recompute(model, checkpointing):
    """Turns on transformers' activation checkpointing as `checkpointing`
    (a Checkpointing) asks: its checkpoint function's arguments, and in
    each layer whether it recomputes."""
    model.activation_checkpointing_enable(activation_checkpointing_kwargs=checkpointing.checkpoint_kwargs())
    layers = _layers(model)
    for index, layer in enumerate(layers):
        layer.gradient_checkpointing = index < checkpointing.recomputed(len(layers))


def training_step(cfg, batch=1, seq=128, device="cuda", dtype="f32", optimizer="adamw", steps=2,
                  attn_implementation=None, checkpointing=False, sharding=None):
    """A function that builds the model on `device`, then runs `steps`
    training steps: forward with labels, backward of the model's loss, an
    optimizer step ("adamw", "sgd" or None) and zero_grad. Inputs are drawn
    once, from a generator seeded inside the function. `checkpointing`
    (True, or a metamem.Checkpointing naming the layers and whether
    selectively) recomputes layers in backward (transformers'
    activation_checkpointing_enable, non-reentrant). `sharding` (a
    metamem.Sharding) shards the model with FSDP2 over a data-parallel job's
    ranks, each of its layers a unit, splits its layers by its
    tensor-parallel plan, and with pipeline_parallel P > 1 builds the
    pipeline rank's stage of a decoder (on the meta device, then its own
    layers on `device`, initialized as transformers initializes them) and
    trains the batch in its microbatches under torch's 1F1B schedule
    (metamem._pipeline); checkpointing counts the stage's layers. Run it as
    one rank of that job (trace(world_size=...), or in a process group)."""
    transformers = _transformers()
    torch_dtype = checked(dtype, optimizer)
    positive(batch=batch, seq=seq, steps=steps)
    task, architecture = task_of(cfg)
    model_class = getattr(transformers, architecture)
    built_with = {"dtype": torch_dtype}
    if attn_implementation is not None:
        built_with["attn_implementation"] = attn_implementation

    _check_sizes(cfg, batch, seq)
    if checkpointing is True:
        checkpointing = Checkpointing()
    if checkpointing and checkpointing.layers == 0:
        checkpointing = None
    stages = 1 if sharding is None else sharding.pipeline_parallel
    if stages > 1:
        refusal = pipeline_refusal(cfg, stages)
        if refusal:
            raise ValueError(refusal)
        if batch % sharding.microbatches:
            raise ValueError(f"batch {batch} does not split into {sharding.microbatches} equal microbatches")

    def build():
        try:
            return model_class._from_config(cfg, **built_with)
        except UnsupportedOpError:
            raise
        except Exception as error:  # the config's values, not the trace, are at fault
            raise ValueError(f"{cfg.model_type}'s config does not build {architecture}: "
                             f"{type(error).__name__}: {error}") from error

    def step():
        torch.manual_seed(0)
        mesh = None if sharding is None else sharding.mesh(device)
        if stages > 1:
            stage = mesh["pp"].get_local_rank()
            with torch.device("meta"):
                model = build()
            root = stage_module(model, stage, stages).to_empty(device=device)
            model.initialize_weights()
        else:
            with torch.device(device):
                model = root = build()
        model.train()
        if checkpointing:
            _recompute(model, checkpointing)
        if sharding is not None:
            sharding.shard(model, model._no_split_modules, mesh, root)
        batch_inputs = inputs(cfg, task, batch, seq, device, torch_dtype)
        if stages > 1:
            pipeline = Pipeline(root, stage, stages, mesh["pp"].get_group(), device, batch, seq,
                                sharding.microbatches)
            train(root, lambda: pipeline.step(batch_inputs["input_ids"], batch_inputs["labels"]), optimizer, steps)
        else:
            train(model, lambda: model(**batch_inputs).loss.backward(), optimizer, steps)
    return step


def trace_step(cfg, batch=1, seq=128, device="cuda", dtype="f32", optimizer="adamw", steps=2, gpu="H100-80GB",
               attn_implementation=None, values="error", checkpointing=False, sharding=None, rank=0):
    """training_step(...) traced on a fake `device` for `gpu`: the Trace.
    `values` as metamem.trace takes it; with `sharding`, as data-parallel
    rank `rank` of its ranks."""
    step = training_step(cfg, batch, seq, device, dtype, optimizer, steps, attn_implementation, checkpointing,
                         sharding)
    world = None if sharding is None else sharding.world_size
    with trace(device=device, gpu=gpu, values=values, world_size=world, rank=rank) as t:
        step()
    return t


def reserved_peak(cfg, batch=1, seq=128, gpu="H100-80GB", **options):
    """The bytes PyTorch's caching allocator reserves at most over
    training_step(cfg, batch, seq, device="cuda", **options) on `gpu`: what
    must fit in the GPU's memory beside the CUDA context and libraries."""
    return trace_step(cfg, batch, seq, device="cuda", gpu=gpu, **options).reserved_peak_bytes


def largest_batch(cfg, seq=128, gpu="H100-80GB", memory=None, most=1 << 16, **options):
    """The largest batch size (up to `most`) whose reserved_peak fits in what
    `memory` bytes of the GPU (all of it by default) leave the allocator
    beside the CUDA context (docs/gpu-memory.md), 0 when batch 1 does not:
    read off the line through batches 1 and 2 and verified, else doubling and
    bisection (metamem.largest_batch_by_line).
    With a `sharding`, the NCCL communicators of its process groups come
    off the allocator's memory too, and the ranks that differ are traced
    (rank 0, and a pipeline's last stage's first rank), the larger figures
    counting; a pipeline's batches are its microbatches' multiples."""
    sharding = options.pop("sharding", None)
    capacity = gpu_memory(gpu, memory, nccl_communicators=sharding.process_groups() if sharding else 0)[
        "allocator_bytes"]
    ranks = [0] if sharding is None else ranks_that_differ(sharding.world_size, sharding.pipeline_parallel)

    def measure(batch):
        traces = [trace_step(cfg, batch, seq, device="cuda", gpu=gpu, sharding=sharding, rank=rank, **options)
                  for rank in ranks]
        return max(max(t.step_peaks) for t in traces), max(t.reserved_peak_bytes for t in traces)

    return largest_batch_by_line(measure, capacity, most, (sharding and sharding.microbatches) or 1)
