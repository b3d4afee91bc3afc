"""Data parallelism for the models metamem builds (transformers'), through
torch's own FSDP2 as their users shard them: fully_shard on each layer,
then on the model, over a mesh of the job's ranks. Traced as one rank of
the job (trace(world_size=...)), it runs FSDP2's own code; run for real in
gloo processes, the same code gives the rank's achieved peak."""

import dataclasses

__all__ = ["Sharding"]


@dataclasses.dataclass(frozen=True)
class Sharding:
    """FSDP2 over `ranks` data-parallel ranks: fully sharded (ZeRO-3), or,
    with `ranks_per_node`, hybrid: sharded within each node's ranks and
    replicated across nodes."""

    ranks: int
    ranks_per_node: int | None = None

    def __post_init__(self):
        if self.ranks < 1:
            raise ValueError(f"data-parallel ranks must be positive, got {self.ranks}")
        if self.ranks_per_node is not None and (self.ranks_per_node < 1 or self.ranks % self.ranks_per_node):
            raise ValueError(f"hybrid sharding needs whole nodes: {self.ranks} ranks do not split into nodes of "
                             f"{self.ranks_per_node}")

    def process_groups(self):
        """The process groups of two or more ranks it communicates in: NCCL
        gives each a communicator, whose buffers live beside the caching
        allocator (metamem.gpu_memory)."""
        if self.ranks_per_node is None:
            return int(self.ranks > 1)
        return int(self.ranks_per_node > 1) + int(self.ranks // self.ranks_per_node > 1)

    def mesh(self, device):
        from torch.distributed.device_mesh import init_device_mesh

        if self.ranks_per_node is None:
            return init_device_mesh(device, (self.ranks,))
        return init_device_mesh(device, (self.ranks // self.ranks_per_node, self.ranks_per_node),
                                mesh_dim_names=("replicate", "shard"))

    def shard(self, model, layer_classes, device):
        """fully_shard on each submodule whose class is named in
        `layer_classes` (transformers' _no_split_modules: its decoder or
        encoder layers), then on `model`, which keeps the rest (embeddings,
        final norm, head)."""
        from torch.distributed.fsdp import fully_shard

        layers = [module for module in model.modules() if type(module).__name__ in set(layer_classes or ())]
        if not layers:
            raise ValueError(f"{type(model).__name__} names no layers to shard one by one "
                             f"(_no_split_modules: {layer_classes})")
        mesh = self.mesh(device)
        for layer in layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
