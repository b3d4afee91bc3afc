"""metamem: memory of a PyTorch training step, traced without a GPU.

    import torch, metamem
    with metamem.trace(device="cuda") as t:   # "cpu" or "cuda"; no GPU needed
        step()                                # any eager code: model, loss, backward, optimizer
    t.peak_bytes                              # the last step's peak
    print(t.report())                         # the CLI's summary
    print(t.table("modules", depth=2))
    metamem.achieved_cpu(step)                # the same step for real on CPU: peak bytes

Inside the block tensors live on a fake device (no data is ever
allocated), every allocation and free is recorded, and module scopes come
from the nn.Module names.
"""

import contextlib
import json
import os

import torch
from torch.overrides import TorchFunctionMode

from . import _metamem

__all__ = ["trace", "achieved_cpu", "Trace", "UnsupportedOpError"]


class UnsupportedOpError(NotImplementedError):
    """An op metamem cannot trace (no meta kernel, or it reads a tensor's value)."""

    @property
    def op(self):
        """The op's name, e.g. "aten::histc"."""
        message = str(self.args[0]) if self.args else ""
        marker = "no meta kernel for "
        start = message.find(marker)
        return message[start + len(marker):].split(" ", 1)[0] if start >= 0 else ""


_metamem.set_unsupported_op_error(UnsupportedOpError)


class Trace:
    """What a traced block did to memory; filled when the block ends."""

    def __init__(self, device):
        self.device = device
        self._result = None

    def _done(self):
        if self._result is None:
            raise RuntimeError("the trace is read after its block ends")
        return self._result

    @property
    def peak_bytes(self):
        """Peak live bytes of the last step (the steady state when several ran)."""
        return self._done().peak_bytes

    @property
    def step_peaks(self):
        """Peak live bytes of each step the block ran (a step ends at optimizer.step())."""
        return self._done().step_peaks

    def report(self):
        """The CLI's summary: model states, peaks, what is live at the peak, allocator, plan."""
        return self._done().report()

    def table(self, kind="nodes", depth=2, csv=False):
        """Rows per op ("nodes") or per module path cut at `depth` ("modules")."""
        return self._done().table(kind, depth, csv)

    def to_json(self, depth=2):
        """The whole report as the CLI's JSON (a string)."""
        return self._done().to_json(depth)

    def json(self, depth=2):
        """The whole report as a dict."""
        return json.loads(self.to_json(depth))

    def snapshot(self, path):
        """Writes a memory snapshot for PyTorch's memory_viz page."""
        self._done().snapshot(os.fspath(path))


class _ModuleScopes:
    """Module paths from nn.Module names, via global forward hooks."""

    def __init__(self, session):
        self.session = session
        self.names = {}  # id(module) -> path
        self.roots = []
        self.depth = 0
        self.handles = []

    def __enter__(self):
        hooks = torch.nn.modules.module
        self.handles = [hooks.register_module_forward_pre_hook(self._enter),
                        hooks.register_module_forward_hook(self._leave)]
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()

    def adopt(self, module):
        """Names `module`'s submodules from it and marks its parameters."""
        if id(module) in self.names:
            return
        root = type(module).__name__
        for name, sub in module.named_modules():
            self.names.setdefault(id(sub), f"{root}.{name}" if name else root)
        self.roots.append(module)
        self.session.parameters(list(module.parameters()))

    def _enter(self, module, inputs):
        if self.depth == 0:
            self.adopt(module)
            self.session.forward()
        self.depth += 1
        self.session.push_scope(self.names.get(id(module), type(module).__name__))

    def _leave(self, module, inputs, output):
        self.depth = max(self.depth - 1, 0)
        self.session.pop_scope()


class _CudaSkipsInit:
    """On a fake cpu, code written for CUDA reaches the fake device: torch's
    lazy CUDA initialisation is skipped, the meta layer puts every tensor on
    the fake device, and torch.cuda.is_available() keeps its answer."""

    def __enter__(self):
        self.saved = torch.cuda._initialized
        torch.cuda._initialized = True
        return self

    def __exit__(self, *exc):
        torch.cuda._initialized = self.saved


class _FakeCuda:
    """What torch.cuda says while a trace runs on fake cuda: initialized, one device."""

    def __enter__(self):
        cuda = torch.cuda
        self.saved = (cuda._initialized, cuda.is_available, cuda.device_count, cuda.current_device)
        cuda._initialized = True
        cuda.is_available = lambda: True
        cuda.device_count = lambda: 1
        cuda.current_device = lambda: 0
        return self

    def __exit__(self, *exc):
        cuda = torch.cuda
        cuda._initialized, cuda.is_available, cuda.device_count, cuda.current_device = self.saved


class _CppMetaKernels:
    """libtorch's own meta kernels for the trace. Importing torch registers
    Python meta functions (torch._meta_registrations) on the Meta key above
    libtorch's C++ kernels for some 1,300 ops, for symbolic shapes; a trace
    runs every op at the Meta key and needs neither their symbols nor their
    Python calls (they made a traced step twenty times slower). The first
    block splits torch's registrations in two: those with a C++ kernel below
    go to a library of their own, lifted for the length of each block so
    that the C++ kernel serves as in metamem's own programs; the rest (no
    C++ kernel below) stay registered throughout."""

    lifted = None  # (op, Python meta function) pairs above a C++ meta kernel
    library = None  # where they are registered between blocks

    @classmethod
    def _split(cls):
        registrations = torch._meta_registrations
        kernels = []
        for key in registrations._meta_lib_dont_use_me_use_register_meta._op_impls:
            namespace, name, _ = key.split("/")
            packet, _, overload = name.partition(".")
            op = getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")
            kernels.append((op, op.py_kernels[torch._C.DispatchKey.Meta]))
        registrations._meta_lib_dont_use_me_use_register_meta._destroy()
        kept = torch.library.Library("aten", "IMPL", "Meta")
        cls.lifted = []
        for op, kernel in kernels:
            if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "Meta"):
                cls.lifted.append((op, kernel))
            else:
                kept.impl(op, kernel)
        registrations._meta_lib_dont_use_me_use_register_meta = kept

    def __enter__(self):
        cls = type(self)
        if cls.lifted is None:
            cls._split()
        else:
            cls.library._destroy()
        return self

    def __exit__(self, *exc):
        cls = type(self)
        cls.library = torch.library.Library("aten", "IMPL", "Meta")
        for op, kernel in cls.lifted:
            cls.library.impl(op, kernel)


@contextlib.contextmanager
def _backward_marked(session, scopes):
    """torch.autograd.backward tells the trace where backward begins and ends."""
    original = torch.autograd.backward

    def backward(tensors, *args, **kwargs):
        outputs = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        session.backward(outputs)
        try:
            return original(tensors, *args, **kwargs)
        finally:
            grads = [p.grad for root in scopes.roots for p in root.parameters() if p.grad is not None]
            session.backward_done(grads)

    torch.autograd.backward = backward
    try:
        yield
    finally:
        torch.autograd.backward = original


@contextlib.contextmanager
def _swapped(modules, device):
    """Each module's parameters and buffers replaced by fake-device ones of the
    same shape (no data is copied), the originals put back afterwards."""
    saved = []
    for module in modules:
        for sub in module.modules():
            for store in (sub._parameters, sub._buffers):
                for name, tensor in list(store.items()):
                    if tensor is None:
                        continue
                    saved.append((store, name, tensor))
                    fake = torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device=device)
                    if isinstance(tensor, torch.nn.Parameter):
                        fake = torch.nn.Parameter(fake, requires_grad=tensor.requires_grad)
                    store[name] = fake
    try:
        yield
    finally:
        for store, name, tensor in reversed(saved):
            store[name] = tensor


def _dtype_name(modules):
    for module in modules:
        for p in module.parameters():
            return {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}.get(p.dtype, str(p.dtype))
    return "f32"


class _CudaOnCpu(TorchFunctionMode):
    """Runs code written for CUDA on the CPU: device "cuda" becomes "cpu"."""

    @staticmethod
    def _cpu(value):
        if isinstance(value, torch.device) and value.type == "cuda":
            return torch.device("cpu")
        if isinstance(value, str) and value.startswith("cuda"):
            return "cpu"
        return value

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = {k: self._cpu(v) for k, v in (kwargs or {}).items()}
        args = tuple(self._cpu(a) for a in args)
        if getattr(func, "__name__", "") == "cuda":  # Tensor.cuda()
            return args[0]
        return func(*args, **kwargs)


@contextlib.contextmanager
def trace(device="cuda", modules=()):
    """Traces the block on a fake `device` ("cpu" or "cuda") and yields a
    Trace, readable once the block ends. `modules` built before the block
    run in it on the fake device, their states put back afterwards. On a
    fake cpu, code written for CUDA runs on the fake cpu, as achieved_cpu
    runs it on the CPU.
    Leaving the block, also by an exception, restores every state it changed."""
    result = Trace(device)
    session = _metamem.Session(device)
    finished = False
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(_FakeCuda() if device == "cuda" else _CudaSkipsInit())
            stack.enter_context(_CppMetaKernels())
            scopes = stack.enter_context(_ModuleScopes(session))
            stack.enter_context(_swapped(modules, device))
            for module in modules:
                scopes.adopt(module)
            stack.enter_context(_backward_marked(session, scopes))
            yield result
            roots = scopes.roots
        model = "+".join(type(m).__name__ for m in roots) or "python"
        result._result = session.finish(model, _dtype_name(roots))
        finished = True
    finally:
        if not finished:
            session.finish("python", "f32")


def achieved_cpu(step, modules=()):
    """Runs `step` for real on CPU (code written for CUDA included) and
    returns the peak bytes it held through the CPU allocator, counting the
    parameters and buffers of `modules` (built before it) as live, as a
    trace with modules=[...] does."""
    held = set()
    states = 0
    for module in modules:
        for tensor in list(module.parameters()) + list(module.buffers()):
            storage = tensor.storage()
            if storage.data_ptr() not in held:
                held.add(storage.data_ptr())
                states += storage.nbytes()
    with _CudaOnCpu():
        return states + _metamem.achieved_cpu(step)
