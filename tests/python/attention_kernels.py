"""Which of scaled_dot_product_attention's kernels a block runs."""

from torch.utils._python_dispatch import TorchDispatchMode


class AttentionKernels(TorchDispatchMode):
    """The names of the attention ops a block runs, backward ones included
    ("_scaled_dot_product_cudnn_attention", ..._backward)."""

    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "attention" in func.__name__:
            self.names.add(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))
