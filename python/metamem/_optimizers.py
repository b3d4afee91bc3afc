"""Optimizers built before a trace's block and stepped in it."""

import collections
import threading
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from . import _metamem
from ._cuda import Patches


class OptimizersFollow:
    """An optimizer built before the block steps in it what its parameters
    are there. Where `modules=` replaced them, it steps the replacements,
    as an optimizer steps a model that `.cuda()` moved in place: at its
    first step() or zero_grad() in the block, its parameter groups take the
    replacements. Otherwise (a fake cpu's real parameters) it steps them as
    they are. Either way the block's steps start from its state as it was,
    and leaving the block puts its groups and its state back: what the
    block's steps made (a first step's moments, counts) is the trace's.

    A state from before the block over replaced parameters is refused: its
    tensors would have to be the device's from the start of the block, and
    the trace cannot know them until the optimizer first runs there."""

    def __init__(self, replacement):
        self.replacement = replacement  # a parameter -> its replacement in the block, or None
        self.owner = threading.get_ident()
        self.patches = Patches()
        self.groups = []  # (group, its params as they were)
        self.seen = weakref.WeakSet()

    def __enter__(self):
        self.handle = register_optimizer_step_pre_hook(
            lambda optimizer, args, kwargs: self._adopt(optimizer))
        zero_grad = torch.optim.Optimizer.zero_grad

        def zeroing(optimizer, *args, **kwargs):
            self._adopt(optimizer)
            return zero_grad(optimizer, *args, **kwargs)

        self.patches.set(torch.optim.Optimizer, "zero_grad", zeroing)
        return self

    def __exit__(self, *exc):
        self.handle.remove()
        for group, params in reversed(self.groups):
            group["params"] = params
        self.patches.restore()

    def _adopt(self, optimizer):
        # Another thread's optimizers are its own; a step Dynamo compiles
        # runs this hook as it traces, where it would break the graph.
        if threading.get_ident() != self.owner or torch.compiler.is_compiling() or optimizer in self.seen:
            return
        self.seen.add(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        replaced = {id(p): self.replacement(p) for p in params}
        if all(replaced[id(p)] is None and _metamem.is_traced(p) for p in params):
            return  # built in the block: nothing of it is from before
        if any(replaced[id(p)] is not None for p in optimizer.state):
            raise ValueError(
                f"metamem: the {type(optimizer).__name__} stepped in the block holds state from before it for "
                "parameters that modules= replaced, state the trace cannot place on the device: build the "
                "optimizer in the block, or trace before its first step")
        for group in optimizer.param_groups:
            self.groups.append((group, group["params"]))
            group["params"] = [p if replaced[id(p)] is None else replaced[id(p)] for p in group["params"]]
        state = collections.defaultdict(dict)  # as torch's
        state.update((p, dict(entry)) for p, entry in optimizer.state.items())
        self.patches.set(optimizer, "state", state)
