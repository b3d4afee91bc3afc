"""What metamem.hf's and metamem.timm's training steps share: the dtypes
they take by name, the optimizers they make and the loop that trains."""

import torch

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
OPTIMIZERS = ("adamw", "sgd", None)


def checked(dtype, optimizer):
    """The torch dtype named `dtype`; ValueError for a dtype or optimizer neither takes."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be 'adamw', 'sgd' or None, got {optimizer!r}")
    return DTYPES[dtype]


def train(model, forward_backward, optimizer, steps):
    """`steps` times: forward_backward(), then the optimizer's step and
    zero_grad (AdamW at its defaults, SGD at lr 0.01, or none)."""
    opt = None
    if optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters())
    elif optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        forward_backward()
        if opt is not None:
            opt.step()
            opt.zero_grad()
