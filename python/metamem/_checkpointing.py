"""Activation checkpointing of a model's layers as its users turn it on
(torch.utils.checkpoint, non-reentrant, around each layer), and the search
`metamem checkpoint --hf` runs: the fewest layers to recompute, fully or
selectively, whose traced peak fits a budget, and of those plans the one
that recomputes the fewest FLOPs.

    t = metamem.hf.trace_step(cfg, batch=8, seq=2048,
                              checkpointing=metamem.Checkpointing(layers=12, selective=True))
    t.flops["recompute"]
"""

import contextlib
import dataclasses
import functools
import time

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

__all__ = ["Checkpointing", "checkpoint_blocks", "recomputing", "least_recompute", "SOLVERS"]

_aten = torch.ops.aten
# What selective recomputation keeps from the forward: the outputs of matrix
# products, convolutions and attention, whose recomputation costs the most FLOPs for the
# bytes kept (the policy of torch's selective activation checkpointing
# examples, and the ops of torchtitan's). Norms, activations and elementwise
# ops are recomputed.
KEPT_OPS = {
    "aten::mm": _aten.mm.default,
    "aten::addmm": _aten.addmm.default,
    "aten::bmm": _aten.bmm.default,
    "aten::baddbmm": _aten.baddbmm.default,
    "aten::_scaled_mm": _aten._scaled_mm.default,
    "aten::convolution": _aten.convolution.default,
    "aten::_scaled_dot_product_flash_attention": _aten._scaled_dot_product_flash_attention.default,
    "aten::_scaled_dot_product_efficient_attention": _aten._scaled_dot_product_efficient_attention.default,
    "aten::_scaled_dot_product_cudnn_attention": _aten._scaled_dot_product_cudnn_attention.default,
    "aten::_scaled_dot_product_flash_attention_for_cpu": _aten._scaled_dot_product_flash_attention_for_cpu.default,
}
_KEPT = frozenset(KEPT_OPS.values())


def _keep_products(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in _KEPT else CheckpointPolicy.PREFER_RECOMPUTE


@dataclasses.dataclass(frozen=True)
class Checkpointing:
    """The first `layers` layers of a model (all of them: None) recomputed
    in backward, each through torch.utils.checkpoint (non-reentrant);
    `selective`: keeping the outputs of matrix products, convolutions and
    attention (KEPT_OPS) through torch's selective activation
    checkpointing. The first layers, because backward reaches them last:
    their recomputation adds to what is live when the least is."""

    layers: int | None = None
    selective: bool = False

    def __post_init__(self):
        if self.layers is not None and self.layers < 0:
            raise ValueError(f"layers to recompute must be at least 0, got {self.layers}")

    def recomputed(self, units):
        """How many of a model's `units` layers it recomputes."""
        return units if self.layers is None else min(self.layers, units)

    def checkpoint_kwargs(self):
        """torch.utils.checkpoint's keyword arguments for each layer."""
        kwargs = {"use_reentrant": False}
        if self.selective:
            kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts, _keep_products)
        return kwargs

    def policy_text(self, units):
        """In the policy syntax of the zoo's `metamem checkpoint`: each
        recomputed layer a segment of its own, ";keep=" the ops kept."""
        recomputed = self.recomputed(units)
        if recomputed == 0:
            return "none"
        return ",".join(map(str, range(recomputed))) + (";keep=" + ",".join(KEPT_OPS) if self.selective else "")

    def shown(self, units):
        recomputed = self.recomputed(units)
        if recomputed == 0:
            return "none"
        return f"{'selective' if self.selective else 'full'}, first {recomputed} of {units} layers"


def checkpoint_blocks(model):
    """(path, module) of the blocks a Checkpointing recomputes in a model
    that transformers does not build (timm's, a script's), in the model's
    order: the innermost modules with parameters and submodules that sit in
    an nn.Sequential or nn.ModuleList (a ViT's blocks, a ConvNeXt stage's
    blocks, a ResNet's bottlenecks, a GPT's layers), as timm's own
    checkpoint_seq walks them."""
    lists = (torch.nn.Sequential, torch.nn.ModuleList)
    in_list = {child for module in model.modules() if isinstance(module, lists) for child in module.children()}
    found = [(path, module) for path, module in model.named_modules()
             if module in in_list and not isinstance(module, lists)
             and next(module.children(), None) is not None and next(module.parameters(), None) is not None]
    return [(path, module) for path, module in found
            if not any(other != path and other.startswith(path + ".") for other, _ in found)]


@contextlib.contextmanager
def recomputing(model, checkpointing):
    """The first blocks `checkpointing` names run through
    torch.utils.checkpoint (non-reentrant) for the block."""
    blocks = [module for _, module in checkpoint_blocks(model)]
    kwargs = checkpointing.checkpoint_kwargs()
    chosen = blocks[:checkpointing.recomputed(len(blocks))]
    for block in chosen:
        block.forward = (lambda forward: lambda *args, **kw: checkpoint(forward, *args, **kwargs, **kw))(block.forward)
    try:
        yield
    finally:
        for block in chosen:
            del block.forward


SOLVERS = {"none": (), "layers": (False,), "selective": (True,), "auto": (False, True)}


def least_recompute(measure, units, budget, solver="auto", pareto=False):
    """The plan of `solver` ("none", "layers": whole layers recomputed,
    "selective", or "auto": both) whose peak is within `budget` bytes with
    the fewest FLOPs recomputed; measure(Checkpointing) traces the step
    under a plan and gives (peak bytes, recompute FLOPs, step FLOPs).

    Without checkpointing first; then, for each kind of recomputation, the
    fewest layers: the peak falls by about the same bytes with each layer
    recomputed, so all layers and all but one give the line, the count where
    it meets the budget is traced and the one below it, which must not fit
    (metamem.largest_batch_by_line, counting layers kept); where the line
    misses, bisection. `pareto`: every count traced, so that the curve of
    the least recompute at each peak is whole.

    Returns a dict: "plan" (a Checkpointing, None where nothing fits),
    "peak", "recompute_flops", "unchecked_peak", "step_flops", "lowest_peak"
    (the least any traced plan reached), "traces", "seconds", "pareto"
    ([(peak, peak, recompute FLOPs)], by peak, of the traced plans that
    recompute less than every traced plan of a lower peak)."""
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {', '.join(SOLVERS)}, got {solver!r}")
    start = time.perf_counter()
    measured = {}

    def traced(plan):
        key = (plan.recomputed(units), plan.selective if plan.recomputed(units) else False)
        if key not in measured:
            measured[key] = measure(plan)
        return measured[key]

    from . import largest_batch_by_line

    plain = traced(Checkpointing(0))
    fitting = [Checkpointing(0)] if plain[0] <= budget else []
    for selective in SOLVERS[solver] if not fitting else ():
        def kept(count):  # count - 1 layers kept, the rest recomputed
            peak = traced(Checkpointing(units - (count - 1), selective))[0]
            return peak, peak

        kept_most = largest_batch_by_line(kept, budget, most=units + 1) - 1
        if kept_most >= 0:
            fitting.append(Checkpointing(units - kept_most, selective))
    if pareto:
        for selective in SOLVERS[solver]:
            for count in range(1, units + 1):
                traced(Checkpointing(count, selective))
    best = min(fitting, key=lambda plan: (traced(plan)[1], traced(plan)[0]), default=None)
    points = []
    for peak, recompute, _ in sorted(measured.values(), key=lambda m: (m[0], m[1])):
        if not points or recompute < points[-1][2]:
            points.append((peak, peak, recompute))
    return {"plan": best, "peak": traced(best)[0] if best else None,
            "recompute_flops": traced(best)[1] if best else None, "unchecked_peak": plain[0],
            "step_flops": plain[2], "lowest_peak": min(m[0] for m in measured.values()),
            "traces": len(measured), "seconds": time.perf_counter() - start, "pareto": points}
