"""Optimizers built before a trace's block and stepped in it."""

import collections
import gc
import threading
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from . import _metamem
from ._cuda import Patches


class OptimizerRefused(ValueError):
    """An optimizer from before the block that the trace cannot step."""


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
        self.groups = []  # (group, the entries of it the block changes, as they were)
        self.adopted = weakref.WeakSet()
        self.made_in_the_block = weakref.WeakSet()
        self.existing = None  # the optimizers alive at the block's first compile

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
        for group, entries in reversed(self.groups):
            group.update(entries)
        self.patches.restore()

    def before_compiling(self):
        """As a torch.compile'd frame starts compiling in the block: every
        optimizer holding a parameter the block replaced is followed, as at
        its step() or zero_grad(), for a step Dynamo compiles reads the
        groups as they stand (the step pre-hook runs as Dynamo traces, where
        it cannot change them). Which exist is asked of the garbage
        collector once per block, at its first compile: those made later in
        it hold its tensors; and only once the block has replaced something
        (a model built in it, as torchtitan's, replaces nothing). One that
        would be refused (_refused) is left alone: the block may not step it."""
        if not self.replacements.replaced:
            return
        if self.existing is None:
            self.existing = weakref.WeakSet(o for o in gc.get_objects() if issubclass(type(o), torch.optim.Optimizer))
        for optimizer in list(self.existing):
            if not self._refused(optimizer) and any(self.replacements.of(p) is not None
                                                    for group in optimizer.param_groups for p in group["params"]):
                self._follow(optimizer)

    def _follow(self, optimizer):
        # A step Dynamo compiles runs this hook as it traces, where it would
        # break the graph (before_compiling ran as it began); asked first, as
        # Dynamo cannot trace get_ident. Another thread's optimizers are its own.
        if torch.compiler.is_compiling() or threading.get_ident() != self.owner:
            return
        if self.take(optimizer):
            for group in optimizer.param_groups:
                group["params"] = [self.replacements.current(p) for p in group["params"]]

    def take(self, optimizer):
        """Adopts an optimizer from before the block, the first time (its
        state is the block's from then), and refuses it where _refused;
        False for one made in the block, which holds its tensors already.
        Called at its step() and zero_grad(), and as Dynamo makes its state
        while compiling its step."""
        if optimizer not in self.adopted:
            if self._made_in_the_block(optimizer):
                return False
            self._adopt(optimizer)
        if self._refused(optimizer):
            raise OptimizerRefused(
                f"metamem: the {type(optimizer).__name__} stepped in the block holds state from before it for "
                "parameters that the block replaced (modules=, a .cuda() in it), state the trace cannot place "
                "on the device: build the optimizer in the block, or trace before its first step")
        return True

    def _refused(self, optimizer):
        """Whether it holds state from before the block for a parameter the
        block replaced."""
        return any(self.replacements.of(p) is not None for p in optimizer.state)

    def _made_in_the_block(self, optimizer):
        if optimizer in self.made_in_the_block:
            return True
        if all(_metamem.is_traced(p) for group in optimizer.param_groups for p in group["params"]):
            self.made_in_the_block.add(optimizer)
            return True
        return False

    def _adopt(self, optimizer):
        self.adopted.add(optimizer)
        # Dynamo compiling its step on the GPU makes it capturable (its step
        # counters on the device), which a real step on the CPU refuses.
        self.groups += [(group, {key: group[key] for key in ("params", "capturable") if key in group})
                        for group in optimizer.param_groups]
        state = collections.defaultdict(dict)  # as torch's
        state.update((p, dict(entry)) for p, entry in optimizer.state.items())
        self.patches.set(optimizer, "state", state)
