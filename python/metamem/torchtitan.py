"""Llama 3 as torchtitan 0.3 trains it, one rank at a time: torchtitan's own
Trainer, built from its config registry's presets for 8B, 70B and 405B as
it ships them (FlexAttention, the chunked loss, the forward and backward
captured in a CUDA graph, spmd_types' tensor parallelism, FSDP2 with bf16
compute; 405B compiled, with rowwise float8 and async tensor parallelism),
stepped as its training loop steps it, inside trace(world_size=N, rank=r).

    import metamem.torchtitan as titan
    t = titan.trace("8B", world_size=8)           # rank 0 of torchtitan's 8B preset
    t.reserved_peak_bytes
    titan.largest_batch("70B", world_size=64)      # local batch on 80 GiB H100s
    titan.trace("405B", compile=False, float8=False)   # 405B eager, in bf16
    titan.trace("8B", rank=4, pipeline_parallel=2, local_batch_size=2, microbatches=2)  # the last stage's rank

The tokenizer and the data loader are stand-ins: batches of random tokens,
one document to a sequence, shaped as torchtitan's text loader shapes them
(they change no memory on the GPU beyond the batch itself); validation,
metrics files and checkpoints are off (none runs in the steps traced).
torchtitan is an optional dependency (`pip install .[models]`).
"""

import contextlib
import dataclasses
import functools

import torch

from . import gpu_memory
from . import largest_batch_by_line
from . import trace as metamem_trace
from ._compiled_graphs import ranks_compile_alike
from ._sharding import ranks_that_differ
from ._step import positive

__all__ = ["PRESETS", "Preset", "trainer_config", "stages_told_their_shapes", "training_step", "trace",
           "largest_batch", "ranks_that_differ"]


@dataclasses.dataclass(frozen=True)
class Preset:
    """A torchtitan training configuration: its GPUs and what each rank runs,
    as its config registry function `registry` sets it."""

    world_size: int
    registry: str
    local_batch_size: int
    seq_len: int
    tensor_parallel: int
    activation_checkpoint: str  # "none", "selective" (torchtitan's op policy) or "full"
    compile: bool = False  # each block and the loss compiled
    float8: bool = False  # float8 linears (rowwise), the output layer kept in bf16
    async_tensor_parallel: bool = False  # Inductor's micro-pipelined TP (asks for compile)


# torchtitan.models.llama3.config_registry, with the GPUs each job is for
# (tests/python/test_torchtitan.py checks them against it).
PRESETS = {
    "debugmodel": Preset(8, "llama3_debugmodel", 8, 2048, 1, "selective"),
    "8B": Preset(8, "llama3_8b", 1, 8192, 1, "selective"),
    "70B": Preset(64, "llama3_70b", 8, 8192, 8, "full"),
    "405B": Preset(512, "llama3_405b", 2, 8192, 8, "full", compile=True, float8=True, async_tensor_parallel=True),
}


def _torchtitan():
    try:
        import torchtitan  # noqa: F401
    except ImportError as error:
        raise ImportError("metamem.torchtitan needs torchtitan: pip install .[models]") from error


@functools.cache
def _stand_ins():
    """The tokenizer and the data loader torchtitan's Trainer builds, in
    place of its Hugging Face ones (no files, no downloads)."""
    from torchtitan.components.dataloader import BaseDataLoader
    from torchtitan.components.tokenizer import BaseTokenizer

    class RandomTokens(BaseDataLoader):
        """Batches as torchtitan's text loader yields them: inputs, labels
        and per-document positions, each a contiguous host tensor."""

        @dataclasses.dataclass(kw_only=True, slots=True)
        class Config(BaseDataLoader.Config):
            vocab_size: int = 0

        def __init__(self, config, *, local_batch_size, seq_len, **unused):
            self.vocab_size, self.batch, self.seq = config.vocab_size, local_batch_size, seq_len

        def __iter__(self):
            while True:
                inputs = torch.randint(0, self.vocab_size, (self.batch, self.seq))
                labels = torch.randint(0, self.vocab_size, (self.batch, self.seq))
                positions = torch.arange(self.seq).repeat(self.batch, 1)
                yield {"input": inputs, "positions": positions}, labels

        def state_dict(self):
            return {}

        def load_state_dict(self, state_dict):
            pass

    class NoTokenizer(BaseTokenizer):
        @dataclasses.dataclass(kw_only=True, slots=True)
        class Config(BaseTokenizer.Config):
            pass

        def __init__(self, config, **unused):
            super().__init__()

        def encode(self, *args, **kwargs):
            raise NotImplementedError("metamem's torchtitan runs on random tokens")

        decode = encode

        def get_vocab_size(self):
            return 0

    return RandomTokens, NoTokenizer


def _preset(flavor):
    """PRESETS[flavor], or ValueError naming the flavors."""
    if flavor not in PRESETS:
        raise ValueError(f"unknown flavor {flavor!r}: one of {', '.join(PRESETS)}")
    return PRESETS[flavor]


def trainer_config(flavor, local_batch_size=None, seq_len=None, tensor_parallel=None, activation_checkpoint=None,
                   compile=None, float8=None, cuda_graphs=None, pipeline_parallel=None, microbatches=None):
    """torchtitan's Trainer.Config for Llama 3 `flavor` (a key of PRESETS)
    as its config registry ships it, any of whose values the arguments
    replace, with random tokens for data. Call it inside a trace on fake
    cuda: torchtitan's float8 converter asks the GPU whether it runs float8
    (and, as torchtitan builds it, turns Inductor's emulate_precision_casts
    on for the process). With `pipeline_parallel` P > 1 the job's ranks
    are P pipeline ranks deep (torchtitan's stages and schedule), the
    local batch split into `microbatches` (by default torchtitan's
    microbatches of one sample), and the step is not captured in a CUDA
    graph (torchtitan captures none of a pipeline)."""
    _torchtitan()
    from torchtitan.components.quantization import Float8LinearConverter
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.models.llama3 import config_registry, model_registry

    preset = _preset(flavor)
    if activation_checkpoint not in (None, "none", "selective", "full"):
        raise ValueError(f"activation_checkpoint {activation_checkpoint!r}: none, selective or full")
    given = {"local_batch_size": local_batch_size, "seq_len": seq_len, "tensor_parallel": tensor_parallel,
             "pipeline_parallel": pipeline_parallel}
    positive(**{name: value for name, value in given.items() if value is not None})
    config = getattr(config_registry, preset.registry)()
    if compile is not None:
        config.compile.enable = compile
        config.compile.enable_async_tensor_parallel = compile and preset.async_tensor_parallel
    float8 = preset.float8 if float8 is None else float8
    if float8 != preset.float8 or (float8 and compile is not None):
        # The float8 converter is part of the model's config, told whether the
        # model is compiled: rebuilt as the 405B preset builds it.
        compiled = config.compile.enable and "model" in config.compile.components
        converters = [Float8LinearConverter.Config(filter_fqns=["lm_head"], model_compile_enabled=compiled)]
        config.model_spec = model_registry(flavor, converters=converters if float8 else None)
    training, parallelism = config.training, config.parallelism
    training.local_batch_size = local_batch_size or training.local_batch_size
    training.seq_len = seq_len or training.seq_len
    parallelism.tensor_parallel_degree = tensor_parallel or parallelism.tensor_parallel_degree
    parallelism.pipeline_parallel_degree = pipeline_parallel or parallelism.pipeline_parallel_degree
    if microbatches is not None:
        if microbatches < 1 or training.local_batch_size % microbatches:
            raise ValueError(f"microbatches {microbatches}: the local batch {training.local_batch_size} must split "
                             "into that many equal microbatches")
        parallelism.pipeline_parallel_microbatch_size = training.local_batch_size // microbatches
    if activation_checkpoint is not None:
        config.activation_checkpoint = {"none": None, "selective": SelectiveAC.Config(),
                                        "full": FullAC.Config()}[activation_checkpoint]
    if cuda_graphs is not None:
        training.disable_cuda_graphs = not cuda_graphs
    elif parallelism.pipeline_parallel_degree > 1:
        training.disable_cuda_graphs = True
    random_tokens, no_tokenizer = _stand_ins()
    config.tokenizer = no_tokenizer.Config()
    config.dataloader = random_tokens.Config(vocab_size=config.model_spec.model.vocab_size)
    config.validator.enable = False
    config.metrics.enable_tensorboard = config.metrics.enable_wandb = False
    return config


def training_step(flavor, steps=2, **overrides):
    """A function that builds torchtitan's Trainer for `flavor` on this rank
    (trainer_config(flavor, **overrides)) and runs `steps` of its training
    step as its training loop does: model built on the meta device,
    converted (float8), parallelized (compiled), materialized on the rank's
    GPU and initialized; each step forward and loss, backward (both
    captured in a CUDA graph from the second step, and replayed after),
    gradient clipping, AdamW, the learning-rate schedule."""
    _torchtitan()
    from torchtitan.trainer import Trainer

    def step():
        config = trainer_config(flavor, **overrides)
        # torchtitan's init_distributed turns autograd's multithreading off
        # before it makes the process group; a trace's group is made
        # already, which it takes instead, skipping both.
        torch.autograd.set_multithreading_enabled(False)
        with stages_told_their_shapes(config):
            trainer = Trainer(config)
        batches = trainer.batch_generator(trainer.dataloader)
        for _ in range(steps):
            trainer.step += 1
            trainer.gc_handler.run(trainer.step)
            trainer.train_step(batches)
        trainer.close()

    return step


@contextlib.contextmanager
def stages_told_their_shapes(config):
    """While torchtitan's Trainer(config) is built: each PipelineStage told
    the shapes of what it receives and sends. torchtitan gives it none, to
    learn them from its neighbours in the first step; under torch's fake
    process group (a trace's, or torchtitan's comm mode "fake_backend"),
    where one process stands for one rank and nothing is exchanged, torch
    refuses such a stage. Llama 3's stages pass its residual stream: the
    tokens [microbatch, sequence] into the first stage; hidden states
    [microbatch, sequence, dim] in the parameters' compute dtype between
    stages, the sequence split over the tensor-parallel ranks under
    sequence parallelism; out of the last, the final norm's hidden states
    over the whole sequence, which the chunked loss takes. Every stage
    checks, at every forward, that it receives and makes exactly these,
    so a model that passes anything else stops the trace instead of
    sizing its buffers wrongly."""
    import torchtitan.distributed.pipeline_parallel as pipeline
    from torchtitan.config import TORCH_DTYPE_MAP

    training, parallelism = config.training, config.parallelism
    microbatch, seq, dim = parallelism.pipeline_parallel_microbatch_size, training.seq_len, config.model_spec.model.dim
    split = parallelism.tensor_parallel_degree if parallelism.enable_sequence_parallel else 1
    dtype = TORCH_DTYPE_MAP[training.mixed_precision_param]
    tokens = torch.empty(microbatch, seq, dtype=torch.long, device="meta")
    hidden = torch.empty(microbatch, seq // split, dim, dtype=dtype, device="meta", requires_grad=True)
    last = torch.empty(microbatch, seq, dim, dtype=dtype, device="meta", requires_grad=True)
    built = pipeline.PipelineStage

    class Stage(built):
        def __init__(self, submodule, stage_index, num_stages, device, **options):
            inputs = tokens if stage_index == 0 else hidden
            outputs = last if stage_index == num_stages - 1 else hidden
            super().__init__(submodule, stage_index, num_stages, device, input_args=inputs, output_args=outputs,
                             **options)

            def check(module, args, output):
                for what, told, met in (("receives", inputs, args[0]), ("makes", outputs, output)):
                    if (told.shape, told.dtype) != (met.shape, met.dtype):
                        raise RuntimeError(
                            f"metamem: torchtitan's pipeline stage {stage_index} {what} "
                            f"{tuple(met.shape)} {met.dtype}, where metamem told its schedule "
                            f"{tuple(told.shape)} {told.dtype} (Llama 3's residual stream)")

            submodule.register_forward_hook(check)

    pipeline.PipelineStage = Stage
    try:
        yield
    finally:
        pipeline.PipelineStage = built


def trace(flavor, world_size=None, rank=0, gpu="H100-80GB", steps=2, **overrides):
    """Rank `rank` of torchtitan's `flavor` preset on `world_size` GPUs (the
    preset's by default) traced on fake cuda; `overrides` go to
    trainer_config(). Values the step reads (the loss it logs) are
    placeholders; initialization's truncated normals read zeros. The
    loader's batches stay on the host until train_step copies them, as
    in torchtitan's own run (metamem.trace's host_tensors="host")."""
    world_size = world_size or _preset(flavor).world_size
    alike = ranks_compile_alike() if _splits_evenly(flavor, **overrides) else contextlib.nullcontext()
    with alike, metamem_trace(device="cuda", gpu=gpu, world_size=world_size, rank=rank, values="placeholder",
                              host_tensors="host") as t:
        training_step(flavor, steps, **overrides)()
    return t


# The sizes of a Llama 3 model's configuration that tensor parallelism
# splits: its linears' features (heads in its fused QKV) and its
# embedding's rows (the vocabulary).
_SPLIT_SIZES = ("in_features", "out_features", "num_embeddings", "n_heads", "n_kv_heads", "vocab_size")


def _splits_evenly(flavor, tensor_parallel=None, seq_len=None, **unused):
    """Whether tensor parallelism splits every size of `flavor`'s model, and
    its sequence (sequence parallelism), evenly. Then every rank of the job
    compiles the same graphs (no shard's size depends on where the rank
    lies), and a trace of one rank runs those another's trace compiled
    (metamem._compiled_graphs)."""
    _torchtitan()
    from torchtitan.models.llama3 import model_registry

    preset = _preset(flavor)
    degree = tensor_parallel or preset.tensor_parallel
    sizes = [seq_len or preset.seq_len]

    def collect(config):
        if dataclasses.is_dataclass(config):
            for field in dataclasses.fields(config):
                value = getattr(config, field.name)
                if field.name in _SPLIT_SIZES and isinstance(value, int):
                    sizes.append(value)
                else:
                    collect(value)
        elif isinstance(config, (list, tuple)):
            for item in config:
                collect(item)

    collect(model_registry(flavor).model)
    return all(size % degree == 0 for size in sizes)


def largest_batch(flavor, world_size=None, gpu="H100-80GB", memory=None, most=64, **overrides):
    """The largest local batch size (up to `most`) whose rank 0 step reserves
    no more than what the CUDA context leaves of `memory` bytes of `gpu`
    (all of it by default): two-step traces of batches 1 and 2, then where
    their line meets the memory and the next batch, to verify
    (metamem.largest_batch_by_line). A pipeline (`pipeline_parallel` P > 1)
    runs `microbatches` (by default P, the fewest its 1F1B schedule
    takes) of one sequence, then two, and so on; its last pipeline rank's
    first rank is traced too, and the larger figures count."""
    capacity = gpu_memory(gpu, memory)["allocator_bytes"]
    world_size = world_size or _preset(flavor).world_size
    pipeline = overrides.get("pipeline_parallel") or 1
    if pipeline > 1:
        overrides.setdefault("microbatches", pipeline)
    ranks = ranks_that_differ(world_size, pipeline)

    def measure(batch):
        traces = [trace(flavor, world_size, rank, gpu, local_batch_size=batch, **overrides) for rank in ranks]
        return max(max(t.step_peaks) for t in traces), max(t.reserved_peak_bytes for t in traces)

    return largest_batch_by_line(measure, capacity, most, overrides.get("microbatches") or 1)

