"""One rank of a distributed job, traced alone.

Inside trace(world_size=N, rank=r) the default process group is metamem's:
collectives communicate nothing (a trace has no values to send) but hold
the memory the real backend holds while they run, so that FSDP2's
fully_shard, DTensor, the functional collectives and pipeline schedules
trace as rank r runs them (DistributedDataParallel too, its C++ Reducer
modelled by metamem._ddp). Every group made from it (new_group, a
DeviceMesh's dimensions) is one too. It is torch's "fake" backend for the
block: torch's own code knows that such a group, one process standing for
one rank, exchanges no values (a pipeline stage then takes its shapes from
the user instead of asking its neighbours).

What a backend holds beside its arguments:
- gloo (a fake cpu) copies: all-gathers and gathers receive into one flat
  buffer of all outputs and copy out, a scatter sends from a flat copy on
  its root; reduce_scatter into a tensor reduces a clone of the whole
  input; a work keeps what it holds (that clone, a sent tensor) until it
  is dropped; an average divides in place.
- NCCL (fake cuda) reduces and gathers in the tensors it is given, an
  average included; its own buffers live outside the caching allocator
  (metamem.gpu_memory() counts them beside it).
"""

import contextlib
import functools
import hashlib
import os
from unittest import mock

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import FakeStore

from . import _ddp, _foreach_sharding, _metamem
from ._cuda import Patches

_BACKEND = "fake"


class _Work(dist.Work):
    """Done at once; keeps what the backend's work keeps for as long as the
    work lives (gloo's works own their tensors until they die, waited on
    or not). Its future's value is the collective's output tensors, as a
    backend's is (DDP's Reducer reads its reduced bucket there)."""

    def __init__(self, held=(), result=None):
        super().__init__()
        self._held = list(held)
        self._result = result

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def get_future(self):
        future = torch.futures.Future()
        future.set_result(self._result)
        return future


def _reduced(tensors):
    """A reduction's result holds the other ranks' values, which this rank's
    trace does not have: values it knew (ones, a count) are forgotten, and
    reading them is reading an unknown value."""
    for tensor in tensors:
        _metamem.forget_values(tensor)


def _gloo_reduction(tensor, opts, size):
    """What gloo does beyond summing `tensor`: it averages by dividing after
    it sums, and refuses a premultiplied sum (FSDP2's, given a gradient
    divide factor), in its words."""
    if opts is not None and opts.reduceOp == dist.ReduceOp.PREMUL_SUM:
        raise RuntimeError("Cannot use ReduceOp.PREMUL_SUM with Gloo")
    if opts is not None and opts.reduceOp == dist.ReduceOp.AVG:
        tensor /= float(size)


class TracedProcessGroup(dist.ProcessGroup):
    """A group of `size` ranks seen from `rank`, on a fake device whose
    backend (gloo on cpu, NCCL on cuda) it models."""

    def __init__(self, rank, size, copies):
        super().__init__(rank, size)
        self._copies = copies  # gloo's staging; NCCL has none in the allocator

    def getBackendName(self):
        return _BACKEND

    def _get_backend(self, device):
        """The group stands for its backend on every device."""
        return self

    # A ProcessGroup reads its name from its C++ backends, which a Python
    # group has none of.
    def _set_group_name(self, name):
        self._group_name = name

    @property
    def group_name(self):
        return self._group_name

    def _set_group_desc(self, desc):
        self._group_desc = desc

    @property
    def group_desc(self):
        return self._group_desc

    def _staged(self, tensors, receive):
        """gloo moves a list of tensors through one flat buffer of them all:
        received into it and copied out, or copied in and sent."""
        if not self._copies or not tensors:
            return
        first = tensors[0]
        flat = torch.empty((len(tensors),) + tuple(first.shape), dtype=first.dtype, device=first.device)
        for index, tensor in enumerate(tensors):
            if receive:
                tensor.copy_(flat[index])
            else:
                flat[index].copy_(tensor)

    def all_gather_single(self, output, input, opts=None):
        self._staged([output], receive=True)
        return _Work(result=[output])

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        for output in outputs:
            self._staged([output], receive=True)
        return _Work()

    def allgather(self, output_lists, inputs, opts=None):
        for outputs in output_lists:
            self._staged(outputs, receive=True)
        return _Work(result=output_lists)

    def gather(self, output_lists, inputs, opts=None):
        if self.rank() == opts.rootRank:
            for outputs in output_lists:
                self._staged(outputs, receive=True)
        return _Work()

    def scatter(self, outputs, input_lists, opts=None):
        if self.rank() == opts.rootRank:
            for inputs in input_lists:
                self._staged(inputs, receive=False)
        return _Work()

    def reduce_scatter_single(self, output, input, opts=None):
        held = []
        if self._copies:  # gloo reduces a copy of the whole input, then copies this rank's chunk out
            whole = input.clone()
            _gloo_reduction(whole, opts, self.size())
            output.copy_(whole.chunk(self.size())[self.rank()])
            held.append(whole)
        _reduced([output])
        return _Work(held=held, result=[output])

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        works = [self.reduce_scatter_single(output, input, opts) for output, input in zip(outputs, inputs)]
        return _Work(held=[tensor for work in works for tensor in work._held])

    def reduce_scatter(self, outputs, input_lists, opts=None):
        _reduced(outputs)
        return _Work(result=outputs)

    def allreduce(self, tensors, opts=None):
        if self._copies:
            for tensor in tensors:
                _gloo_reduction(tensor, opts, self.size())
        _reduced(tensors)
        return _Work(result=tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def reduce(self, tensors, opts=None):
        _reduced(tensors)
        return _Work(result=tensors)

    def broadcast(self, tensors, opts=None):
        return _Work(result=tensors)

    def alltoall(self, outputs, inputs, opts=None):
        return _Work()

    def all_to_all_single(self, output, input, output_splits, input_splits, opts=None):
        return _Work()

    def barrier(self, opts=None):
        return _Work()

    def send(self, tensors, dst, tag=0):
        # gloo's send reads the tensor while its work lives: a pipeline
        # stage's output stays until the schedule drops the work.
        return _Work(held=tensors if self._copies else ())

    def recv(self, tensors, src, tag=0):
        return _Work()

    def __repr__(self):
        return f"metamem.TracedProcessGroup(rank={self.rank()}, size={self.size()})"

    communicated = False  # whether it ran a collective or sent (NCCL makes its communicator then)


def _communicating(collective):
    @functools.wraps(collective)
    def marked(self, *args, **kwargs):
        self.communicated = True
        return collective(self, *args, **kwargs)
    return marked


for _name in ("all_gather_single", "all_gather_single_coalesced", "allgather", "gather", "scatter",
              "reduce_scatter_single", "reduce_scatter_single_coalesced", "reduce_scatter", "allreduce",
              "allreduce_coalesced", "reduce", "broadcast", "alltoall", "all_to_all_single", "barrier", "send",
              "recv"):
    setattr(TracedProcessGroup, _name, _communicating(getattr(TracedProcessGroup, _name)))


def _real(tensor):
    """A traced tensor of known values (a mesh's rank numbers) as a real CPU
    tensor made now: on a fake cpu it is recorded as the real one was."""
    if not isinstance(tensor, torch.Tensor):
        return tensor
    values = _metamem.known_values(tensor)
    if values is None:
        return tensor
    return values.clone()


def _host_meshes(patches):
    """A DeviceMesh keeps its ranks in a CPU tensor and finds its own place
    in it with nonzero(), whose size depends on values: it is made for real,
    from the rank numbers the trace knows, as the real run makes it on the
    host. Its process groups are metamem's."""
    from torch.distributed.device_mesh import DeviceMesh

    init = DeviceMesh.__init__

    def host_init(self, device_type, mesh=None, *args, **kwargs):
        with _metamem.OutsideTrace():
            kwargs = {key: _real(value) for key, value in kwargs.items()}
            return init(self, device_type, _real(mesh), *args, **kwargs)

    patches.set(DeviceMesh, "__init__", host_init)


def _forget_meshes():
    """DTensor caches what it worked out for a mesh by the mesh's shape, not
    its process groups: a trace's groups die with it, so the caches must
    not outlive it (nor hand a trace the groups of an earlier one)."""
    from torch.distributed.tensor import _redistribute, _sharding_prop
    from torch.distributed.tensor._collective_utils import MeshTopoInfo
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()
    _sharding_prop.ShardingPropagator._propagate_tensor_meta_cached.cache_clear()
    _redistribute.clear_redistribute_planner_cache()
    getattr(_redistribute._gen_transform_infos, "cache_clear", lambda: None)()
    MeshTopoInfo.build_from_mesh.cache_clear()


def _random_op_on_traced_tensors(start_offset, end_offset, op, *args, **kwargs):
    """DTensor's random ops (init on sharded parameters) step the generator
    of a real GPU around the op; a trace draws no values: the op alone."""
    return op(*args, **kwargs)


# A traced tensor's backend key is metamem's own (PrivateUse1): the kernel
# serves traces alone.
torch._prims.rng_prims.run_dtensor_rng_op.py_impl(torch._C.DispatchKey.PrivateUse1)(_random_op_on_traced_tensors)



def _first_shard_sizes_once(patches):
    """DTensor's random ops offset a rank's draws by the size of rank 0's
    shard (_random._calc_first_shard_size), which for a _StridedShard it
    finds by splitting a torch.arange of the dimension: 0.66 s of a 405B
    rank's weight initialization, for some 1,100 parameters of a dozen
    shapes. A trace works each out once, from the global shape, the
    placements and the mesh's shape (what torch's function reads)."""
    from torch.distributed.tensor import _random

    first_shard_size = _random._calc_first_shard_size
    sizes = {}

    def once(spec):
        shape = tuple(spec.shape)
        if not all(type(size) is int for size in shape):  # symbolic in a compile
            return first_shard_size(spec)
        key = (shape, spec.placements, tuple(spec.mesh.shape))
        if key not in sizes:
            sizes[key] = first_shard_size(spec)
        return list(sizes[key])

    patches.set(_random, "_calc_first_shard_size", once)


def _names_by_role(patches, world_size, rank):
    """Each group this rank is in named for its part in the job rather than
    for its members or its number among every group the job made (torch
    counts each rank's groups with the others' it is not in): its size,
    the steps between its ranks, and which such group of this rank's it
    is. The corresponding groups of two ranks of a layout then have one
    name. A compiled graph names the groups of its collectives, so the
    graph one rank's trace compiled is the graph another's compiles, and
    Inductor's caches (on disk too) give it to the other
    (metamem._compiled_graphs keeps it in the process). Groups this rank
    is not in keep torch's names; no collective of its runs on them."""
    name = dist.distributed_c10d._process_group_name
    seen = {}

    def by_role(ranks, use_hashed_name):
        named = name(ranks, use_hashed_name)  # torch's count of groups moves on as it does
        members = list(ranks) or list(range(world_size))
        if rank not in members:
            return named
        role = (len(members), tuple(b - a for a, b in zip(members, members[1:])))
        seen[role] = seen.get(role, 0) + 1
        digest = hashlib.sha1(repr((world_size, role, seen[role])).encode()).hexdigest()[:12]
        return f"metamem_{len(members)}_{digest}"

    patches.set(dist.distributed_c10d, "_process_group_name", by_role)


# torch keeps tables of every rank of a group (init_process_group's rank map:
# 80 MiB at 2^20 ranks); ten times the largest jobs run.
MOST_RANKS = 2**20


def check(world_size, rank, nproc_per_node=None):
    """ValueError or RuntimeError where trace(world_size, rank,
    nproc_per_node) cannot begin."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or not 1 <= world_size <= MOST_RANKS:
        raise ValueError(f"world_size must be an int in [1, {MOST_RANKS:,}], got {world_size!r}")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, {world_size}), got {rank!r}")
    if nproc_per_node is not None and (not isinstance(nproc_per_node, int) or isinstance(nproc_per_node, bool)
                                       or not 1 <= nproc_per_node <= world_size):
        raise ValueError(f"nproc_per_node must be an int in [1, {world_size}], got {nproc_per_node!r}")
    if dist.is_initialized():
        raise RuntimeError("a process group exists already: a trace with world_size makes its own "
                           "(call torch.distributed.destroy_process_group() first)")


def _keep_every_ranks_statistics(patches):
    """SyncBatchNorm drops the statistics of ranks whose batch was empty,
    asking which ranks counted samples (count_all[count_all >= 1], values
    gathered from the other ranks). A trace takes every rank to hold what
    this one holds, a batch: each rank's statistics are kept, as torch's
    meta nonzero keeps every element when asked to assume all are set
    (meta_nonzero_assume_all_nonzero)."""
    from torch.fx.experimental import _config
    from torch.nn.modules import _functions

    forward = _functions.SyncBatchNorm.forward

    def keeping_every_rank(*args, **kwargs):
        with _config.patch(meta_nonzero_assume_all_nonzero=True):
            return forward(*args, **kwargs)

    patches.set(_functions.SyncBatchNorm, "forward", staticmethod(keeping_every_rank))


def _destroy_default_group():
    if dist.is_initialized():  # the script may have destroyed it, as torchrun's scripts end
        dist.destroy_process_group()


def local_world_size(world_size, nproc_per_node=None):
    """Ranks to a node: torchrun's --nproc-per-node where given, else one
    per GPU and eight GPUs to a node."""
    return nproc_per_node or min(world_size, 8)


class Groups:
    """The process groups a block made (the default one, new_group's, a
    DeviceMesh's dimensions), as the backend makes them for this rank."""

    def __init__(self):
        self.made = []

    def communicators(self):
        """The groups of two or more ranks that ran a collective: NCCL makes
        a communicator for each, at its first collective."""
        return sum(1 for group in self.made if group.size() > 1 and group.communicated)


@contextlib.contextmanager
def ranks(device, world_size, rank, nproc_per_node=None):
    """Rank `rank` of `world_size` (check()ed) for the block: metamem's
    default process group, torchrun's environment (`nproc_per_node` ranks
    to a node), and
    torch.distributed.init_process_group answering from them whatever
    backend it names. Everything is put back afterwards. Yields the Groups
    the block makes."""
    local_size = local_world_size(world_size, nproc_per_node)
    environment = {"RANK": rank, "WORLD_SIZE": world_size, "LOCAL_RANK": rank % local_size,
                   "LOCAL_WORLD_SIZE": local_size, "GROUP_RANK": rank // local_size,
                   "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}
    groups = Groups()

    def make_group(store, group_rank, group_size, timeout):
        group = TracedProcessGroup(group_rank, group_size, copies=device == "cpu")
        groups.made.append(group)
        return group

    from torch.distributed.tensor import _random

    patches = Patches()
    with contextlib.ExitStack() as restored:
        # First: the modules it imports import torch.distributed.fsdp, which
        # registers torch's own "fake" backend over the one patched in below.
        _forget_meshes()
        restored.callback(_forget_meshes)
        restored.callback(patches.restore)
        restored.enter_context(mock.patch.dict(os.environ, {key: str(value) for key, value in environment.items()}))
        restored.enter_context(mock.patch.dict(dist.Backend._plugins, {
            _BACKEND.upper(): dist.Backend._BackendPlugin(make_group, extended_api=False)}))
        # DTensor keeps its random-number tracker for the device of the
        # first mesh. (init_process_group's wrapped sys.excepthook is put
        # back with the trace's other globals, metamem._process.)
        patches.set(_random, "_rng_tracker", None)
        dist.init_process_group(_BACKEND, store=FakeStore(), rank=rank, world_size=world_size)
        restored.callback(_destroy_default_group)

        def init_process_group(*args, **kwargs):
            for key, value in (("rank", rank), ("world_size", world_size)):
                if kwargs.get(key, -1) not in (-1, value):
                    raise ValueError(f"init_process_group({key}={kwargs[key]}) in a trace of rank {rank} "
                                     f"of {world_size}")

        _host_meshes(patches)
        _names_by_role(patches, world_size, rank)
        _first_shard_sizes_once(patches)
        _foreach_sharding.quicken(patches)
        _ddp.install(patches)
        _keep_every_ranks_statistics(patches)
        patches.set(dist, "init_process_group", init_process_group)
        patches.set(dist.distributed_c10d, "init_process_group", init_process_group)
        yield groups
