"""DTensor's sharding of a foreach or fused op (the optimizer's step, the
gradient clipping's norms and scaling), worked out as torch works it out,
without its quadratic cost.

torch 2.14.1 finds such an op's sharding tensor by tensor, and for each
tensor of its lists it
- walks every argument of the whole op to learn whether `_StridedShard`
  placements in it encode a shard order (`_propagate_use_strided_shard_flag`):
  1,134 parameters of a 405B rank make 1.3 million walks of 4,500 specs;
- expands the tensor's single-mesh-dimension strategies over the mesh and
  prices each candidate (`expand_to_full_mesh_op_strategy`), though most
  tensors share their shape, stride, dtype and placements with another.

A real rank pays this once per process (DTensor caches the answer for the
next step); a trace pays it once per trace, in a search once per candidate.
Within one propagation, each patch below answers from the first time it was
asked, with torch's own functions and objects: the flag from the two specs
that decide it, an expansion from the earlier expansion of equal arguments.
"""

import threading

from ._cuda import Patches

__all__ = ["quicken"]


class _Propagation:
    """What one sharding propagation has worked out: the specs that decide
    the strided-shard flag of the schema it was last asked about, and the
    expansions by their arguments."""

    def __init__(self):
        self.schema = None
        self.deciding = None
        self.expansions = {}


class _DecidingSpecs:
    """The part of an OpSchema that `_propagate_use_strided_shard_flag` reads."""

    __slots__ = ("args_spec",)

    def __init__(self, specs):
        self.args_spec = specs


def _deciding_specs(specs):
    """Of the specs with a `_StridedShard` placement, the first, and the first
    whose flag differs from it: torch's flag is the first one's where all
    agree and True where any two differ, so these two give it."""
    from torch.distributed.tensor.placement_types import _StridedShard

    deciding = []
    for spec in specs:
        if any(isinstance(placement, _StridedShard) for placement in spec.placements):
            if not deciding or spec.use_strided_shard_as_shard_order != deciding[0].use_strided_shard_as_shard_order:
                deciding.append(spec)
                if len(deciding) == 2:
                    break
    return _DecidingSpecs(tuple(deciding))


def _argument_key(argument):
    """An argument of the op as what the expansion reads of it: an input's
    specs with their strided-shard flags (which DTensorSpec's equality
    leaves out), anything else as itself. Raises TypeError for what cannot
    be a key."""
    from torch.distributed.tensor._op_schema import OpStrategy

    if isinstance(argument, OpStrategy):
        return tuple((spec.output_specs, getattr(spec.output_specs, "use_strided_shard_as_shard_order", None))
                     for spec in argument.strategies)
    if isinstance(argument, (list, tuple)):
        return tuple(_argument_key(item) for item in argument)
    hash(argument)
    return argument


def _expansion_key(mesh, op_schema, strategies, options):
    """The expansion's arguments as a key, or None where one holds a
    function (a filter: a closure over the op's schema)."""
    if options.get("full_mesh_strategy_filter") is not None:
        return None
    try:
        key = (mesh, op_schema.op, _argument_key(op_schema.args_schema),
               tuple((name, _argument_key(value)) for name, value in op_schema.kwargs_schema.items()),
               _argument_key(strategies), tuple((name, _argument_key(value)) for name, value in options.items()))
        hash(key)
    except TypeError:  # a SymInt of a dynamic shape, an unhashable argument
        return None
    return key


def quicken(patches: Patches):
    """DTensor's sharding propagation answers repeated questions once, until
    `patches` are restored."""
    from torch.distributed.tensor import _sharding_prop
    from torch.distributed.tensor._ops import utils

    propagator = _sharding_prop.ShardingPropagator
    propagate = propagator.propagate_op_sharding_non_cached
    fix_flag = _sharding_prop._propagate_use_strided_shard_flag
    expand = utils.expand_to_full_mesh_op_strategy
    current = threading.local()  # each thread's propagation (autograd's runs DTensor ops too)

    def propagate_once(self, op_schema):
        outer = getattr(current, "propagation", None)
        current.propagation = _Propagation()
        try:
            return propagate(self, op_schema)
        finally:
            current.propagation = outer

    def fix_flag_once(op_strategy, op_schema):
        propagation = getattr(current, "propagation", None)
        if propagation is None:
            return fix_flag(op_strategy, op_schema)
        if propagation.schema is not op_schema:
            propagation.schema, propagation.deciding = op_schema, _deciding_specs(op_schema.args_spec)
        return fix_flag(op_strategy, propagation.deciding)

    def expand_once(mesh, op_schema, strategies, **options):
        propagation = getattr(current, "propagation", None)
        key = None if propagation is None else _expansion_key(mesh, op_schema, strategies, options)
        if key is None:
            return expand(mesh, op_schema, strategies, **options)
        expansion = propagation.expansions.get(key)
        if expansion is None:
            expansion = propagation.expansions[key] = expand(mesh, op_schema, strategies, **options)
        return expansion

    patches.set(propagator, "propagate_op_sharding_non_cached", propagate_once)
    patches.set(_sharding_prop, "_propagate_use_strided_shard_flag", fix_flag_once)
    patches.set(utils, "expand_to_full_mesh_op_strategy", expand_once)
