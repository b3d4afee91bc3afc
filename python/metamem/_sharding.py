"""Data, tensor and pipeline parallelism for the models metamem builds
(transformers'), through torch's own FSDP2 and pipelining schedules and
transformers' own tensor-parallel plans and pipeline split, as their users
shard them: a pipeline rank's layers (metamem._pipeline), each layer's
linears split by the model's `tp_plan` over a tensor-parallel mesh
dimension, then fully_shard on each layer and on the model over the
data-parallel one. Traced as one rank of the job (trace(world_size=...)),
it runs their own code; run for real in gloo processes, the same code
gives the rank's achieved peak."""

import dataclasses

__all__ = ["Sharding", "ranks_that_differ"]


@dataclasses.dataclass(frozen=True)
class Sharding:
    """A job of `pipeline_parallel` stages (the outermost dimension), each of
    `ranks` data-parallel ranks, each of `tensor_parallel` ranks
    (consecutive ones: a node's GPUs) that split the model's layers by its
    tensor-parallel plan. FSDP2 shards across the data-parallel ranks
    (ZeRO-3), or, with `ranks_per_node` (data-parallel ranks to a node),
    hybrid: sharded within each node and replicated across nodes. A
    pipeline runs each step's batch in `microbatches` (by default as many
    as it has stages, the fewest its 1F1B schedule takes)."""

    ranks: int
    ranks_per_node: int | None = None
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    microbatches: int | None = None

    def __post_init__(self):
        if self.ranks < 1 or self.tensor_parallel < 1 or self.pipeline_parallel < 1:
            raise ValueError(f"data-, tensor- and pipeline-parallel ranks must be positive, got {self.ranks}, "
                             f"{self.tensor_parallel} and {self.pipeline_parallel}")
        if self.ranks_per_node is not None and (self.ranks_per_node < 1 or self.ranks % self.ranks_per_node):
            raise ValueError(f"hybrid sharding needs whole nodes: {self.ranks} ranks do not split into nodes of "
                             f"{self.ranks_per_node}")
        if self.microbatches is not None and (self.pipeline_parallel == 1 or self.microbatches < 1):
            raise ValueError(f"microbatches ({self.microbatches}) are a pipeline's: a positive number, with "
                             "pipeline_parallel 2 or more")
        if self.pipeline_parallel > 1 and self.microbatches is None:
            object.__setattr__(self, "microbatches", self.pipeline_parallel)

    @property
    def world_size(self):
        """The job's ranks: pipeline- times data- times tensor-parallel."""
        return self.pipeline_parallel * self.ranks * self.tensor_parallel

    def process_groups(self):
        """The process groups of two or more ranks it communicates in: NCCL
        gives each a communicator, whose buffers live beside the caching
        allocator (metamem.gpu_memory)."""
        others = int(self.tensor_parallel > 1) + int(self.pipeline_parallel > 1)
        if self.ranks_per_node is None:
            return int(self.ranks > 1) + others
        return int(self.ranks_per_node > 1) + int(self.ranks // self.ranks_per_node > 1) + others

    def mesh(self, device):
        """The job's device mesh: with a pipeline "pp" outermost, then
        ("replicate",) "shard" and, with tensor parallelism, "tp", its ranks
        innermost."""
        from torch.distributed.device_mesh import init_device_mesh

        shape, names = (self.ranks,), ("shard",)
        if self.ranks_per_node is not None:
            shape, names = (self.ranks // self.ranks_per_node, self.ranks_per_node), ("replicate", "shard")
        if self.tensor_parallel > 1:
            shape, names = shape + (self.tensor_parallel,), names + ("tp",)
        if self.pipeline_parallel > 1:
            shape, names = (self.pipeline_parallel,) + shape, ("pp",) + names
        return init_device_mesh(device, shape, mesh_dim_names=names)

    def shard(self, model, layer_classes, mesh, root=None):
        """With tensor parallelism, the model's linears split as its plan
        (transformers' tp_plan) says; then fully_shard on each submodule whose
        class is named in `layer_classes` (transformers' _no_split_modules:
        its decoder or encoder layers), then on `root` (the module the step
        calls: `model`, or a pipeline stage around it), which keeps the rest
        (embeddings, final norm, head). `mesh` is self.mesh(device). Where
        tensor or pipeline parallelism leaves one data-parallel rank, FSDP2
        shards nothing further."""
        from torch.distributed.fsdp import fully_shard

        names = set(layer_classes or ())
        layers = [module for module in model.modules() if type(module).__name__ in names]
        if not layers:
            raise ValueError(f"{type(model).__name__} names no layers to shard one by one "
                             f"(_no_split_modules: {layer_classes})")
        if self.tensor_parallel > 1:
            _split_by_plan(model, mesh["tp"], self.tensor_parallel)
        if self.ranks == 1 and self.world_size > 1:
            return model
        data = mesh[tuple(name for name in mesh.mesh_dim_names if name not in ("tp", "pp"))]
        for layer in layers:
            fully_shard(layer, mesh=data)
        fully_shard(model if root is None else root, mesh=data)
        return model


def ranks_that_differ(world_size, pipeline_parallel=1):
    """The ranks whose steps bound the job's: rank 0, whose shards are the
    largest (the last rank's are short where a dimension does not divide),
    and in a pipeline the last pipeline rank's first, which computes the
    loss (the pipeline is the outermost dimension)."""
    return [0] if pipeline_parallel == 1 else [0, world_size - world_size // pipeline_parallel]


def tensor_parallel_refusal(config, size):
    """Why transformers cannot split the model of `config` (a transformers
    config) `size` ways: it has no tensor-parallel plan, or its attention
    heads do not divide; None where it can."""
    text = config.get_text_config()
    if not getattr(text, "base_model_tp_plan", None):
        return f"{config.model_type} has no tensor-parallel plan in transformers (base_model_tp_plan)"
    for key in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(text, key, None)
        if isinstance(heads, int) and heads % size:
            return f"tensor parallel {size} splits attention heads: {config.model_type}'s {key} ({heads}) is not a " \
                   "multiple of it"
    return None


def _split_by_plan(model, mesh, size):
    """transformers' tensor parallelism, as from_pretrained(distributed_config=
    DistributedConfig(tp_size=size)) applies it after building the model:
    the model's plan, expanded to its layers, applied on `mesh`; on a
    pipeline stage, to the modules the stage holds (transformers' split
    leaves a PipelineIdentityLayer where another stage's are)."""
    from transformers.distributed import DistributedConfig
    from transformers.distributed.pipeline_parallel import PipelineIdentityLayer
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism

    refusal = tensor_parallel_refusal(model.config, size)
    if refusal:
        raise ValueError(refusal)
    plan = model._resolve_parallel_plans(DistributedConfig(tp_size=size))[0]
    elsewhere = {name for name, module in model.named_modules() if isinstance(module, PipelineIdentityLayer)}
    apply_tensor_parallelism(model, mesh, {name: style for name, style in plan.items() if name not in elsewhere})
