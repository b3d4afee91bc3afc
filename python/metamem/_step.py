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


def positive(**sizes):
    """ValueError naming the first of `sizes` that is not a positive int (a
    batch of 0 traced a step of empty tensors, and looked like an answer)."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def train(model, forward_backward, optimizer, steps):
    """`steps` times: forward_backward(), then the optimizer's step and
    zero_grad (AdamW at its defaults, SGD at lr 0.01, or none)."""
    params = list(model.parameters())
    # torch's foreach kernels refuse a list that mixes DTensors and tensors
    # (tensor parallelism alone leaves norms whole): such a job steps its
    # parameters one by one.
    foreach = False if len({type(p).__name__ == "DTensor" for p in params}) > 1 else None
    opt = None
    if optimizer == "adamw":
        opt = torch.optim.AdamW(params, foreach=foreach)
    elif optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=0.01, foreach=foreach)
    for _ in range(steps):
        forward_backward()
        if opt is not None:
            opt.step()
            opt.zero_grad()
