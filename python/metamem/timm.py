"""timm models in a trace: a model from timm's registry (no weights are
downloaded) and its training step, cross entropy over its classes at its own
input size.

    import timm, metamem, metamem.timm
    model = timm.create_model("convnext_tiny")
    t = metamem.timm.trace_step(model, batch=64, dtype="bf16", gpu="A100-80GB")
    t.peak_bytes

The model is built before the trace and named to it (`modules=[model]`):
timm's constructors read values of what they make (drop-path rates from
`torch.linspace(...).tolist()`, `trunc_normal_`'s bounds) that a trace of
random initial weights does not know. timm is an optional dependency
(`pip install .[models]`).
"""

import contextlib

import torch
import torch.nn.functional as F

from . import trace
# checkpoint_blocks: the blocks a Checkpointing recomputes, as for any model.
from ._checkpointing import Checkpointing, checkpoint_blocks, recomputing
from ._step import checked, positive, train


def create(name, **kwargs):
    """timm.create_model(name, **kwargs), seeded; a clear error for a name
    timm does not know."""
    try:
        import timm
    except ImportError as error:
        raise ImportError("metamem.timm needs timm: pip install .[models]") from error
    if not timm.is_model(name):
        raise ValueError(f"unknown timm model {name!r} (timm.list_models() lists them)")
    torch.manual_seed(0)
    return timm.create_model(name, **kwargs)


def training_step(model, batch=2, device="cuda", dtype="f32", optimizer="adamw", steps=2, checkpointing=False):
    """A function that runs `steps` training steps of `model` (moved to
    `device` and `dtype` inside it) on random images of its input size:
    forward, cross entropy over its classes (a backbone without classifier:
    its features' sum; distilled models train both heads), backward, an
    optimizer step ("adamw", "sgd" or None) and zero_grad. `checkpointing`:
    True recomputes its blocks in backward (timm's set_grad_checkpointing);
    a metamem.Checkpointing, the first of checkpoint_blocks(model), whole or
    selectively."""
    torch_dtype = checked(dtype, optimizer)
    positive(batch=batch, steps=steps)
    input_size = model.pretrained_cfg["input_size"]

    def head_loss(out, y):
        if model.num_classes == 0:
            return out.float().sum()
        return F.cross_entropy(out.float(), y)

    def step():
        torch.manual_seed(0)
        # Only where it changes something: moving an LSTM re-flattens its
        # weights, which reads their addresses (sequencer2d).
        if any(p.device.type != torch.device(device).type or p.dtype != torch_dtype for p in model.parameters()):
            model.to(device=device, dtype=torch_dtype)
        model.train()
        if checkpointing is True:
            model.set_grad_checkpointing(True)
        x = torch.randn(batch, *input_size, device=device, dtype=torch_dtype)
        y = torch.randint(0, max(model.num_classes, 1), (batch,), device=device)

        def forward_backward():
            out = model(x)  # alive through backward, as in a training loop
            outs = out if isinstance(out, (tuple, list)) else (out,)
            sum(head_loss(o, y) for o in outs).backward()

        with recomputing(model, checkpointing) if isinstance(checkpointing, Checkpointing) \
                else contextlib.nullcontext():
            train(model, forward_backward, optimizer, steps)
    return step


def trace_step(model, batch=2, device="cuda", dtype="f32", optimizer="adamw", steps=2, gpu="H100-80GB",
               checkpointing=False, values="error"):
    """training_step(...) traced on a fake `device` for `gpu`: the Trace."""
    step = training_step(model, batch, device, dtype, optimizer, steps, checkpointing)
    with trace(device=device, modules=[model], gpu=gpu, values=values) as t:
        step()
    return t
