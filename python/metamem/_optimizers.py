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
    are there. Where the block replaced them (`modules=`, or a `.cuda()` in
    it), it steps the replacements, as an optimizer steps a model that
    `.cuda()` moved in place: at each step() or zero_grad() in the block,
    its parameter groups take the replacements made so far. Otherwise (a
    fake cpu's real parameters) it steps them as they are. Either way the
    block's steps start from its state as it was, and leaving the block puts
    its groups and its state back: what the block's steps made (a first
    step's moments, counts) is the trace's.

    A state from before the block over replaced parameters is refused: its
    tensors would have to be the device's from the start of the block, and
    the trace cannot know them until the optimizer first runs there."""

    def __init__(self, replacements):
        self.replacements = replacements
        self.owner = threading.get_ident()
        self.patches = Patches()
        self.groups = []  # (group, its params as they were)
        self.adopted = weakref.WeakSet()
        self.made_in_the_block = weakref.WeakSet()

    def __enter__(self):
        self.handle = register_optimizer_step_pre_hook(
            lambda optimizer, args, kwargs: self._follow(optimizer))
        zero_grad = torch.optim.Optimizer.zero_grad

        def zeroing(optimizer, *args, **kwargs):
            self._follow(optimizer)
            return zero_grad(optimizer, *args, **kwargs)

        self.patches.set(torch.optim.Optimizer, "zero_grad", zeroing)
        return self

    def __exit__(self, *exc):
        self.handle.remove()
        for group, params in reversed(self.groups):
            group["params"] = params
        self.patches.restore()

    def _follow(self, optimizer):
        # Another thread's optimizers are its own; a step Dynamo compiles
        # runs this hook as it traces, where it would break the graph.
        if threading.get_ident() != self.owner or torch.compiler.is_compiling() or optimizer in self.made_in_the_block:
            return
        if optimizer not in self.adopted:
            if all(_metamem.is_traced(p) for group in optimizer.param_groups for p in group["params"]):
                self.made_in_the_block.add(optimizer)
                return
            self._adopt(optimizer)
        if any(self.replacements.of(p) is not None for p in optimizer.state):
            raise ValueError(
                f"metamem: the {type(optimizer).__name__} stepped in the block holds state from before it for "
                "parameters that the block replaced (modules=, a .cuda() in it), state the trace cannot place "
                "on the device: build the optimizer in the block, or trace before its first step")
        for group in optimizer.param_groups:
            group["params"] = [self.replacements.current(p) for p in group["params"]]

    def _adopt(self, optimizer):
        self.adopted.add(optimizer)
        self.groups += [(group, group["params"]) for group in optimizer.param_groups]
        state = collections.defaultdict(dict)  # as torch's
        state.update((p, dict(entry)) for p, entry in optimizer.state.items())
        self.patches.set(optimizer, "state", state)
