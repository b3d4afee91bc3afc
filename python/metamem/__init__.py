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
import gc
import html
import json
import os
import sys
import threading
import weakref

import torch
from torch.overrides import TorchFunctionMode

from . import _compiled_graphs, _device_checks, _distributed, _fake_gpu, _metamem
from ._compile import CompiledCode, CompilingAside
from ._compile_cuda import UnsupportedCompileError
from ._cuda import FakeCudaRuntime, Patches
from ._process import ProcessState
from ._sharding import Sharding
from ._checkpointing import Checkpointing
from ._optimizers import OptimizersFollow
from ._replacements import Replacements
from ._script_modules import patch_script_modules

__all__ = ["trace", "trace_ranks", "Sharding", "Checkpointing", "achieved_cpu", "gpus", "gpu_memory", "largest_batch", "largest_batch_by_line", "Trace", "UnsupportedOpError", "ValueReadError", "TraceEndedError",
           "UnsupportedCompileError"]


class UnsupportedOpError(NotImplementedError):
    """An op metamem cannot trace (no meta kernel, or it reads a tensor's value)."""

    @property
    def op(self):
        """The op's name, e.g. "aten::histc"."""
        message = str(self.args[0]) if self.args else ""
        marker = "no meta kernel for "
        start = message.find(marker)
        return message[start + len(marker):].split(" ", 1)[0] if start >= 0 else ""


class ValueReadError(UnsupportedOpError):
    """Code read a traced tensor's value (loss.item(), `if torch.isnan(loss)`):
    a trace has shapes, not values. trace(values="placeholder") reads zeros."""

    def __str__(self):
        message = super().__str__()
        if 'values="placeholder"' in message:  # the kernel's own word on placeholders
            return message
        return message + ' metamem.trace(values="placeholder") reads zeros instead.'


class TraceEndedError(RuntimeError):
    """A traced tensor (or a module whose parameters were traced) used after
    its block ended: it holds no data and no trace records it."""


_metamem.set_error_types(UnsupportedOpError, ValueReadError, TraceEndedError)


class Trace:
    """What a traced block did to memory; filled when the block ends."""

    def __init__(self, device):
        self.device = device
        self._result = None
        self._reserved_peak = None

    def _done(self):
        if self._result is None:
            raise RuntimeError("the trace is read after its block ends")
        return self._result

    @property
    def peak_bytes(self):
        """Peak live bytes of the last step (the steady state when several ran)."""
        return self._done().peak_bytes

    @property
    def reserved_peak_bytes(self):
        """On fake cuda, the most bytes the caching allocator reserved over the
        block (torch.cuda.max_memory_reserved() as the block ends): what must
        fit in the GPU beside the CUDA context and libraries. None on a fake cpu."""
        self._done()
        return self._reserved_peak

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

    @property
    def flops(self):
        """FLOPs of the last step: {"total": ..., "recompute": ...}, those
        of its forward ops that checkpointing ran again in backward."""
        return self._done().flops()

    def html(self, path, depth=2, checkpoint=None):
        """Writes the CLI's HTML page (`--html`) to `path`: one file, its
        charts and sortable tables drawn by itself, nothing fetched.
        `checkpoint`: the JSON of `metamem checkpoint`'s plan, shown too."""
        page = self._done().html(depth, checkpoint or "")
        with open(os.fspath(path), "w", encoding="utf-8") as out:
            out.write(page)

    def _repr_html_(self):
        """A notebook cell shows the page, in a frame of its own (its styles
        and script stay out of the notebook's); nothing before the block ends."""
        if self._result is None:
            return None
        page = html.escape(self._result.html(2), quote=True)
        return f'<iframe srcdoc="{page}" style="width: 100%; height: 900px; border: 0"></iframe>'

    def snapshot(self, path):
        """Writes a memory snapshot for PyTorch's memory_viz page."""
        self._done().snapshot(os.fspath(path))

    def save_allocator_events(self, path):
        """Writes the block's allocations and frees for metamem-allocator-oracle,
        which replays them through PyTorch's own CUDA caching allocator."""
        self._done().save_allocator_events(os.fspath(path))


def _local(tensor):
    """A DTensor's shard on this rank (FSDP2's and tensor parallelism's
    parameters and gradients); the tensor a torch.func transform wraps (a
    model called by functional_call inside grad or vmap holds the
    transform's wrappers as parameters); any other tensor itself."""
    while torch._C._functorch.is_functorch_wrapped_tensor(tensor):
        tensor = torch._C._functorch.get_unwrapped(tensor)
    return getattr(tensor, "_local_tensor", tensor)


class _TraceModuleHooks:
    """The global module hooks of every trace, each thread's trace's scopes
    called from them. Dynamo guards a compiled module's call on the keys
    of torch's global hook tables (a hook's handle number), and a graph
    one trace compiled runs in the next (metamem._compiled_graphs) only
    if they are the same: each trace puts the same two functions back
    under the same two numbers, taken from torch once in the process.
    Between traces the tables are as the process had them."""

    keys = None  # (forward pre-hook's, forward hook's)
    scopes = {}  # thread -> its trace's _ModuleScopes

    @classmethod
    def add(cls, scopes):
        tables = torch.nn.modules.module
        if cls.keys is None:
            handles = (tables.register_module_forward_pre_hook(cls.enter),
                       tables.register_module_forward_hook(cls.leave, always_call=True))
            cls.keys = tuple(handle.id for handle in handles)
            for handle in handles:
                handle.remove()
        if not cls.scopes:
            tables._global_forward_pre_hooks[cls.keys[0]] = cls.enter
            tables._global_forward_hooks[cls.keys[1]] = cls.leave
            tables._global_forward_hooks_always_called[cls.keys[1]] = True
        cls.scopes[scopes.owner] = scopes

    @classmethod
    def remove(cls, scopes):
        cls.scopes.pop(scopes.owner, None)
        if not cls.scopes:
            tables = torch.nn.modules.module
            tables._global_forward_pre_hooks.pop(cls.keys[0], None)
            tables._global_forward_hooks.pop(cls.keys[1], None)
            tables._global_forward_hooks_always_called.pop(cls.keys[1], None)

    @staticmethod
    def enter(module, inputs):
        # Dynamo reads is_compiling() as True: inside a compiled region the
        # hook is traced as nothing (no graph break, no op), as if absent.
        if not torch.compiler.is_compiling():
            scopes = _TraceModuleHooks.scopes.get(threading.get_ident())
            if scopes is not None:
                scopes.enter(module, inputs)

    @staticmethod
    def leave(module, inputs, output):
        if not torch.compiler.is_compiling():
            scopes = _TraceModuleHooks.scopes.get(threading.get_ident())
            if scopes is not None:
                scopes.leave(module, inputs, output)


class _ModuleScopes:
    """Module paths from nn.Module names, via global forward hooks that
    see the trace's thread alone. Modules are held weakly: a model the
    block drops is freed as it would be without a trace.

    A module entered in backward, outside every module, is recomputed
    (torch.utils.checkpoint): its ops are the trace's recomputation. The
    leave hook runs when forward raises too, as torch.utils.checkpoint's
    recomputation does where it stops early, so the path never keeps a
    module that has left."""

    def __init__(self, session):
        self.session = session
        self.owner = threading.get_ident()
        self.names = weakref.WeakKeyDictionary()  # module -> path
        self.adopted = []  # (weak root, its name, its parameters' dtype then), in adoption order
        self.path = []  # (module, its path) of the modules running, innermost last
        self.recompute = None  # the recomputation region open, from Session.begin_recompute

    def __enter__(self):
        _TraceModuleHooks.add(self)
        return self

    def __exit__(self, *exc):
        _TraceModuleHooks.remove(self)
        if self.recompute is not None:
            self.session.end_recompute(self.recompute)
            self.recompute = None
    def adopt(self, module):
        """Names `module`'s submodules from it and marks its parameters."""
        if module in self.names:
            return
        # torch.compile(model) is an OptimizedModule around the model: named as the model.
        named = getattr(module, "_orig_mod", module) if type(module).__name__ == "OptimizedModule" else module
        root = _class_name(named)
        self.names[module] = root
        for name, sub in named.named_modules():
            self.names.setdefault(sub, f"{root}.{name}" if name else root)
        self.adopted.append((weakref.ref(module), root, _dtype_name(module)))
        self.session.parameters([_local(p) for p in module.parameters()])

    def roots(self):
        """The adopted models still alive."""
        return [module for module in (ref() for ref, _, _ in self.adopted) if module is not None]

    def model(self):
        """The models' names, and the dtype of the first with parameters (as
        it is now where it lives on)."""
        dtypes = []
        for ref, _, dtype in self.adopted:
            module = ref()
            dtypes.append(dtype if module is None else _dtype_name(module))
        return "+".join(name for _, name, _ in self.adopted) or "python", next(filter(None, dtypes), "f32")

    def enter(self, module, inputs):
        if not self.path:
            if torch._C._current_graph_task_id() == -1:
                self.adopt(module)
                self.session.forward()
            else:
                self.recompute = self.session.begin_recompute()
        self.path.append((module, self.names.get(module, type(module).__name__)))
        self.session.push_scope(self.path[-1][1])

    def leave(self, module, inputs, output):
        # Not entered where a pre-hook before this one raised.
        if not self.path or self.path[-1][0] is not module:
            return
        self.path.pop()
        self.session.pop_scope()
        if not self.path and self.recompute is not None:
            self.session.end_recompute(self.recompute)
            self.recompute = None

    def current(self):
        """The path of the innermost module running, "" outside every module."""
        return self.path[-1][1] if self.path else ""


def _class_name(module):
    """The module's class's name; FSDP2's fully_shard makes each sharded
    module's class a new one, "FSDP" + its name: the model's own."""
    cls = type(module)
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is not None and len(cls.__bases__) == 2 and cls.__bases__[0] is fsdp.FSDPModule:
        cls = cls.__bases__[1]
    return cls.__name__


def _on_cpu(value):
    """A device argument of code written for CUDA, pointed at the CPU."""
    if isinstance(value, torch.device) and value.type == "cuda":
        return torch.device("cpu")
    if isinstance(value, str) and value.startswith("cuda"):
        return "cpu"
    return value


class _CudaOnFakeCpu:
    """On a fake cpu, code written for CUDA runs as achieved_cpu runs it on
    the CPU: Tensor.cuda() is the tensor itself and Tensor.to("cuda") goes
    to the CPU. torch's lazy CUDA initialisation is skipped, so that a
    factory's device="cuda" reaches the meta layer, which puts every tensor
    on the fake device; torch.cuda stays uninitialized, as in the real run."""

    def __enter__(self):
        self.patches = Patches()
        to = torch.Tensor.to

        def to_cpu(tensor, *args, **kwargs):
            return to(tensor, *map(_on_cpu, args), **{k: _on_cpu(v) for k, v in kwargs.items()})

        self.patches.set(torch.cuda, "_lazy_init", lambda: None)
        self.patches.set(torch.Tensor, "cuda", lambda tensor, *args, **kwargs: tensor)
        self.patches.set(torch.Tensor, "to", to_cpu)
        return self

    def __exit__(self, *exc):
        self.patches.restore()


class _CppMetaKernels:
    """libtorch's own meta kernels for the trace. Importing torch registers
    Python meta functions (torch._meta_registrations) on the Meta key above
    libtorch's C++ kernels for some 1,300 ops, for symbolic shapes; a trace
    runs every op at the Meta key and needs neither their symbols nor their
    Python calls (they made a traced step twenty times slower). The first
    block puts, above each Python function that covers a C++ kernel (a meta
    kernel, or a composite one that serves the meta backend), a kernel that
    runs the C++ one inside metamem's meta calls and the Python one for
    every other caller (FakeTensorMode, torch.compile): blocks change no
    registration. The rest (no C++ kernel below) name their op as metamem
    does when they refuse inside a block (nonzero: its size depends on
    values). Those that follow the device's kernel (FFTs lay out their
    output as MKL or cuFFT does) ask torch._meta_registrations.device_hint,
    which takes a meta tensor for CUDA's: in a block it answers the fake
    device."""

    installed = False
    tracing = False

    def __init__(self, device):
        self.device = device
        self.patches = Patches()

    @staticmethod
    def _naming(op, kernel):
        def meta(*args, **kwargs):
            try:
                return kernel(*args, **kwargs)
            except NotImplementedError as error:
                if not _CppMetaKernels.tracing or isinstance(error, UnsupportedOpError):
                    raise
                why = str(error)
            # Raised outside the handler: the refusal's traceback (and the
            # tensors its frames hold) dies here, as it would have unnamed.
            raise UnsupportedOpError(f"metamem: no meta kernel for {op.name()} ({op._schema}): {why}")
        return meta

    @classmethod
    def _install(cls):
        registrations = torch._meta_registrations
        kernels = []
        for key in registrations._meta_lib_dont_use_me_use_register_meta._op_impls:
            namespace, name, _ = key.split("/")
            packet, _, overload = name.partition(".")
            op = getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")
            kernels.append((op, op.py_kernels[torch._C.DispatchKey.Meta]))
        registrations._meta_lib_dont_use_me_use_register_meta._destroy()
        below = ("Meta", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")
        covering = [op.name() for op, _ in kernels
                    if any(torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key) for key in below)]
        covers = set(covering)
        library = torch.library.Library("aten", "IMPL", "Meta")

        def cover():
            for op, kernel in kernels:
                library.impl(op, kernel if op.name() in covers else cls._naming(op, kernel))

        _metamem.run_cpp_meta_kernels_in_traces(covering, cover)
        registrations._meta_lib_dont_use_me_use_register_meta = library
        cls.installed = True

    # Out= overloads that Inductor's wrappers call into a buffer they made
    # (compiled float8: extern_kernels._scaled_mm(..., out=buf)), to which
    # torch gives no meta kernel while their functional overloads have one.
    OUT_WITHOUT_META = ("_scaled_mm",)

    @staticmethod
    def _into_out(functional):
        def meta(*args, out, **kwargs):
            result = functional(*args, **kwargs)
            out.resize_(result.shape)
            return out
        return meta

    def __enter__(self):
        cls = type(self)
        if not cls.installed:
            cls._install()
        cls.tracing = True
        self.patches.set(torch._meta_registrations, "device_hint", lambda tensor: self.device)
        # For the length of the block: outside it, those ops stay as torch has them.
        self.out_kernels = torch.library.Library("aten", "IMPL", "Meta")
        for name in self.OUT_WITHOUT_META:
            self.out_kernels.impl(f"{name}.out", self._into_out(getattr(torch.ops.aten, name).default))
        return self

    def __exit__(self, *exc):
        self.out_kernels._destroy()
        self.patches.restore()
        type(self).tracing = False


@contextlib.contextmanager
def _backward_marked(session, scopes):
    """torch.autograd.backward tells the trace where backward begins and
    ends; on other threads it is torch's own (their autograd is theirs)."""
    original = torch.autograd.backward
    owner = threading.get_ident()

    def backward(tensors, *args, **kwargs):
        if threading.get_ident() != owner:
            return original(tensors, *args, **kwargs)
        outputs = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        session.backward(outputs)
        try:
            return original(tensors, *args, **kwargs)
        finally:
            grads = [_local(p.grad) for root in scopes.roots() for p in root.parameters() if p.grad is not None]
            session.backward_done(grads)

    torch.autograd.backward = backward
    try:
        yield
    finally:
        torch.autograd.backward = original


def _in_apply_order(module):
    """The module and its submodules in the order Module._apply (`.to()`,
    `.cuda()`) moves their tensors: each module's children before it."""
    for child in module.children():
        yield from _in_apply_order(child)
    yield module


def _fake_like(tensor, device):
    """A tensor (a Parameter for a Parameter) of `tensor`'s shape, strides,
    dtype and requires_grad on the fake `device`. A ScriptModule's
    parameters are plain tensors that require grad."""
    fake = torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device=device)
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(fake, requires_grad=tensor.requires_grad)
    return fake.requires_grad_(tensor.requires_grad)


def _swapped(modules, device, replacements, moved=None):
    """Each module's parameters and buffers replaced by fake-device ones of the
    same shape (no data is copied) in `replacements`, which puts the
    originals back. A tensor that two modules share (a language model's head
    tied to its embedding) is replaced by one fake tensor: tied weights stay
    tied. They are made in the order `module.to(device)` makes them, which
    decides where the caching allocator puts them; `moved(sub)` then does
    what that move does next for the submodule (an RNN flattens its weights
    for cuDNN). An RNN's list of its weights is put back too."""
    fakes = {}  # id of each tensor replaced: its replacement
    made = set()  # ids of the replacements
    for module in modules:
        for sub in _in_apply_order(module):
            if isinstance(sub, torch.nn.RNNBase):
                replacements.set(sub.__dict__, "_flat_weights", sub._flat_weights)
                replacements.set(sub.__dict__, "_flat_weight_refs", sub._flat_weight_refs)
            for store in (sub._parameters, sub._buffers):
                for name, tensor in list(store.items()):
                    # A module that two parents hold (CoaT's position
                    # encodings, shared by a stage's blocks) is met again
                    # holding its replacements.
                    if tensor is None or id(tensor) in made:
                        continue
                    if id(tensor) not in fakes:
                        fakes[id(tensor)] = _fake_like(tensor, device)
                        made.add(id(fakes[id(tensor)]))
                    replacements.replace(store, name, fakes[id(tensor)])
            if moved is not None:
                moved(sub)


def _dtype_name(module):
    """The dtype of the module's first parameter, None without one."""
    for p in module.parameters():
        return {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}.get(p.dtype, str(p.dtype))
    return None


class _CudaOnCpu(TorchFunctionMode):
    """Runs code written for CUDA on the CPU: device "cuda" becomes "cpu"."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = {k: _on_cpu(v) for k, v in (kwargs or {}).items()}
        args = tuple(_on_cpu(a) for a in args)
        if getattr(func, "__name__", "") == "cuda":  # Tensor.cuda()
            return args[0]
        return func(*args, **kwargs)


def gpus():
    """The GPUs a fake-cuda trace can be for (trace(gpu=...)), the default first."""
    return list(_metamem.gpu_keys())


def gpu_memory(gpu="H100-80GB", memory=None, cuda_context=None, nccl_communicators=0):
    """`memory` bytes of `gpu` (None: all of it) and what they leave the
    caching allocator beside the CUDA context, metamem's estimate unless
    `cuda_context` gives a measured size, and the buffers of
    `nccl_communicators` NCCL communicators (one per process group of two
    or more ranks; docs/gpu-memory.md): a dict of gpu, total_bytes,
    beside_allocator ([{what, bytes, basis}]) and allocator_bytes.
    ValueError where nothing is left."""
    return json.loads(_metamem.gpu_memory_json(gpu, memory or 0, cuda_context, nccl_communicators))


def _shown_values(tensor, placeholder):
    """The real CPU values a traced tensor shows (printed, listed,
    formatted): those the trace knows (a tensor made from Python numbers
    alone: torch.linspace(0, rate, depth).tolist() for drop-path rates);
    under placeholder values, zeros, as .item() reads; else None."""
    values = _metamem.known_values(tensor)
    if values is None and placeholder:
        with _metamem.OutsideTrace():
            values = torch.zeros((), dtype=tensor.dtype).expand(tensor.shape)
    return values


@contextlib.contextmanager
def _values_shown(placeholder):
    """str(), repr(), format() and tolist() of a traced tensor, which
    would read its values: printing shows the values the trace knows
    (zeros under placeholder values) or none, as a meta tensor prints
    (tensor(..., size=(8, 64), device='cuda:0')), and never raises;
    tolist() lists the known values (zeros under placeholder values) and
    otherwise reads a value as .item() does. .item() and branches read
    known values in C++."""
    patches = Patches()
    tolist, str_, format_ = torch.Tensor.tolist, torch._tensor_str._str, torch.Tensor.__format__

    def shown_tolist(tensor):
        values = _shown_values(tensor, placeholder) if _metamem.is_traced(tensor) else None
        return tolist(tensor if values is None else values)

    def shown_str(tensor, *, tensor_contents=None):
        if tensor_contents is None and _metamem.is_traced(tensor):
            values = _shown_values(tensor, placeholder)
            if values is None:
                tensor_contents = f"..., size={tuple(tensor.shape)}"
            else:
                plain = type(tensor) in (torch.Tensor, torch.nn.Parameter)
                indent = len("tensor(" if plain else type(tensor).__name__ + "(")
                with _metamem.OutsideTrace():
                    tensor_contents = torch._tensor_str._tensor_str(values, indent)
        return str_(tensor, tensor_contents=tensor_contents)

    def shown_format(tensor, spec):
        if tensor.dim() == 0 and _metamem.is_traced(tensor):
            values = _shown_values(tensor, placeholder)
            # Without a value a format spec has nothing to apply to: the tensor as it prints.
            return str(tensor) if values is None else format(values.item(), spec)
        return format_(tensor, spec)

    patches.set(torch.Tensor, "tolist", shown_tolist)
    patches.set(torch._tensor_str, "_str", shown_str)
    patches.set(torch.Tensor, "__format__", shown_format)
    try:
        yield
    finally:
        patches.restore()


def _patch_traced_storages(patches, session):
    """A traced tensor's untyped_storage() as FSDP2 uses a real one: resize_(0)
    frees its buffer and resize_(n) makes one of n bytes (views of it stay
    saved). data_ptr() of a traced storage or tensor on fake cuda (`session`
    given) is its address on the traced GPU, as the simulated allocator
    placed its block: CUDA graph trees and make_graphed_callables compare
    them. On a fake cpu a storage's tells storages apart (a number no two
    live storages share) and a tensor's is refused. Nothing can be read at
    either."""
    storage, tensor = torch.UntypedStorage, torch.Tensor
    resize, data_ptr, tensor_data_ptr = storage.resize_, storage.data_ptr, tensor.data_ptr

    def traced_resize(self, size):
        if not _metamem.is_traced_storage(self):
            return resize(self, size)
        _metamem.resize_traced_storage(self, size)
        return self

    def address(self):
        error = _metamem.traced_storage_access_error(self)
        if error is not None:  # a CUDA graph tree freed it (metamem._cuda_graph_trees)
            raise RuntimeError(error)
        found = session.storage_address(self) if session is not None else None
        return self._cdata if found is None else found

    def traced_data_ptr(self):
        return address(self) if _metamem.is_traced_storage(self) else data_ptr(self)

    def traced_tensor_data_ptr(self):
        if session is None or not _metamem.is_traced(self):
            return tensor_data_ptr(self)
        return address(self.untyped_storage()) + self.storage_offset() * self.element_size()

    patches.set(storage, "resize_", traced_resize)
    patches.set(storage, "data_ptr", traced_data_ptr)
    patches.set(tensor, "data_ptr", traced_tensor_data_ptr)


def _patch_deepcopy(patches):
    """copy.deepcopy of a tensor in a block, as outside it. A traced tensor's
    copy is traced: a copy of its whole storage (torch clones the storage,
    which would make a real one, on the host or the real GPU), viewed as
    the tensor was, with the values the trace knows of it. A real tensor's
    copy is real, as its ops are (Dynamo's guards copy DTensor specs, whose
    device mesh holds real tensors), where the copy's empty tensor would be
    traced and its real storage refused."""
    storage, tensor = torch.UntypedStorage, torch.Tensor
    clone, deepcopy = storage.clone, tensor.__deepcopy__

    def traced_clone(self):
        if not _metamem.is_traced_storage(self):
            return clone(self)
        whole = torch.empty(0, dtype=torch.uint8, device=self.device).set_(self)
        return whole.clone().untyped_storage()

    def real_deepcopy(self, memo):
        if type(self) is torch.Tensor and not _metamem.is_traced(self):
            with _metamem.OutsideTrace():
                return deepcopy(self, memo)
        return deepcopy(self, memo)

    patches.set(storage, "clone", traced_clone)
    patches.set(tensor, "__deepcopy__", real_deepcopy)


def _patch_truncated_normal(patches):
    """nn.init.trunc_normal_ of a traced tensor. torch 2.14 redraws values
    outside the bounds until none is left, and asks whether one is
    (mask.any()), a value the trace does not have. In a trace none is
    outside, so the first draw stands: as in a real run whenever the bounds
    are wide (the std 0.02 within ±2 of timm, torchvision and transformers:
    100 deviations). Where they are narrow, a real run redraws, and holds
    those draws' temporaries while it initializes; a trace does not."""
    init = torch.nn.init
    truncated = init._no_grad_trunc_normal_

    def first_draw(tensor, *args, **kwargs):
        if not _metamem.is_traced(tensor):
            return truncated(tensor, *args, **kwargs)
        with _metamem.PlaceholderValues():
            return truncated(tensor, *args, **kwargs)

    patches.set(init, "_no_grad_trunc_normal_", first_draw)


def _patch_grad_scaler(patches):
    """GradScaler checks for inf and NaN gradients by reading a value (on
    the GPU, and on the CPU with torch.amp.GradScaler("cpu")): in a trace
    it finds none and steps, as a healthy step does."""
    scaler = torch.amp.grad_scaler.GradScaler
    check = scaler._maybe_opt_step

    def finding_none(*args, **kwargs):
        with _metamem.PlaceholderValues():
            return check(*args, **kwargs)

    patches.set(scaler, "_maybe_opt_step", finding_none)


def _patch_fake_tensor_mode(patches):
    """FakeTensorMode inside a block (DTensor's sharding propagation finds
    its outputs' shapes with it) computes on plain meta tensors, as outside
    a trace: none of them is the step's memory."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    dispatch = FakeTensorMode.__torch_dispatch__

    def outside(self, *args, **kwargs):
        with _metamem.OutsideTrace():
            return dispatch(self, *args, **kwargs)

    patches.set(FakeTensorMode, "__torch_dispatch__", outside)


def _patch_autograd_multithreading(patches):
    """torch.autograd.set_multithreading_enabled on the trace's thread sets
    the traced code's own setting: the trace runs backward on this thread
    whatever it is, and the setting decides whose cuBLAS handle backward's
    products take, the device thread's or this thread's (torchtitan turns it
    off: one workspace instead of two). Other threads keep their own."""
    owner = threading.get_ident()
    is_enabled, set_enabled = torch._C._is_multithreading_enabled, torch._C._set_multithreading_enabled

    def traced_is_enabled():
        return _metamem.traced_autograd_multithreading() if threading.get_ident() == owner else is_enabled()

    def traced_set_enabled(enabled):
        if threading.get_ident() != owner:
            return set_enabled(enabled)
        _metamem.set_traced_autograd_multithreading(bool(enabled))

    patches.set(torch._C, "_is_multithreading_enabled", traced_is_enabled)
    patches.set(torch._C, "_set_multithreading_enabled", traced_set_enabled)
    patches.set(torch.autograd, "is_multithreading_enabled", traced_is_enabled)


def _patch_data_loader_workers(patches):
    """A DataLoader's workers are processes, each with its own copy of the
    dataset: traced tensors there have no trace, and a batch in shared
    memory would need their data. Inside a block the loader yields its
    batches from this process, as with num_workers=0: the same batches, in
    the same order; what workers hold (their prefetched batches) is host
    memory, none of the device's."""
    from torch.utils.data import dataloader

    def in_process(loader):
        workers, timeout = loader.num_workers, loader.timeout  # the iterator takes both from the loader
        loader.num_workers, loader.timeout = 0, 0
        try:
            return dataloader._SingleProcessDataLoaderIter(loader)
        finally:
            loader.num_workers, loader.timeout = workers, timeout

    patches.set(dataloader.DataLoader, "_get_iterator", in_process)


@contextlib.contextmanager
def trace(device="cuda", modules=(), gpu="H100-80GB", values="error", alloc_conf=None, world_size=None, rank=0,
          nproc_per_node=None, fake_gpu=None, host_tensors="device"):
    """Traces the block on a fake `device` ("cpu" or "cuda") and yields a
    Trace, readable once the block ends. `modules` built before the block
    run in it on the fake device, their states put back afterwards.

    On fake cuda, torch.cuda answers for one `gpu` (metamem.gpus() lists
    them): its properties, memory statistics from the simulated caching
    allocator at that moment, streams and events, seeds and RNG state. On a
    fake cpu, code written for CUDA runs on the fake cpu, as achieved_cpu
    runs it on the CPU. The simulated allocator takes `alloc_conf` as torch
    takes PYTORCH_ALLOC_CONF (None: that variable, else
    PYTORCH_CUDA_ALLOC_CONF, as torch reads them); a memory fraction is of
    the `gpu`'s memory.

    A tensor made from Python numbers alone by deterministic ops (a mask of
    ones, arange, linspace) and small has known values, computed for real
    beside the trace: .item(), branches and .tolist() read them. Reading
    any other traced tensor's value (loss.item(), `if torch.isnan(loss)`)
    raises ValueReadError; with values="placeholder" it reads zero (False,
    0, 0.0), so that a loop that logs its loss goes on: what it printed and
    every branch taken on it are zero's, not the run's.

    On fake cuda, what the block makes on the host (a factory naming no
    device, or the CPU) stands on the traced GPU with host_tensors="device",
    so that a block that builds its model and inputs without .cuda() traces
    them there. With host_tensors="host" it stays on the host, as in a real
    run of code written for a GPU (`metamem run`'s way): an in-memory
    dataset and the batches a DataLoader collates claim the CPU and hold
    none of the GPU's memory, an op on host tensors alone runs on the host,
    and .cuda(), .to("cuda") copy onto the GPU. A fake cpu's host is its
    device.

    With `fake_gpu`, the folder of metamem's fake GPU (build/oracle; by
    default $METAMEM_FAKE_GPU, if set; "" for none), a fake-cuda trace asks real torch
    on it, once per distinct call, what convolutions allocate inside, and
    follows that: cuDNN's engines and workspaces as cuDNN chooses them for
    the `gpu` under torch.backends.cudnn's flags, where metamem's own
    models know only torch's own kernels (metamem._fake_gpu); where the
    `gpu`, beside its CUDA context, cannot hold an engine's workspace, the
    next engine, as torch falls back on it.

    With `world_size`, the block is rank `rank` of a distributed job:
    torch.distributed's default process group is metamem's (whatever
    backend init_process_group names), torchrun's environment variables
    say which rank, and collectives hold the memory their backend holds
    (gloo's copies on a fake cpu, none on fake cuda) without communicating,
    so that fully_shard (FSDP2), DTensor, pipeline schedules and device
    meshes trace as that rank runs them. A node has `nproc_per_node` ranks
    (torchrun's flag; by default eight, or world_size where fewer), one per
    GPU: torch.cuda sees that many devices and LOCAL_RANK names this rank's.

    Leaving the block, by an exception, KeyboardInterrupt or SystemExit
    too, puts back every global setting that it or the code inside changed
    (metamem._process.SETTINGS lists them), the CPU generator's state
    included: real runs after it draw as before. The trace is its
    thread's: other threads' tensors and autograd are their own."""
    device, modules = _device_name(device), _modules_of(modules)
    if values not in ("error", "placeholder"):
        raise ValueError(f"values must be 'error' or 'placeholder', got {values!r}")
    if host_tensors not in ("device", "host"):
        raise ValueError(f"host_tensors must be 'device' or 'host', got {host_tensors!r}")
    gpu_spec = _metamem.gpu(gpu)  # ValueError for an unknown GPU, before anything changes
    fake_gpu = os.environ.get("METAMEM_FAKE_GPU") if fake_gpu is None else fake_gpu
    recordings = _fake_gpu.recordings(fake_gpu, gpu) if fake_gpu and device == "cuda" else None
    if world_size is not None:
        _distributed.check(world_size, rank, nproc_per_node)
    elif nproc_per_node is not None:
        raise ValueError("nproc_per_node is for a trace with world_size")
    if device == "cuda" and host_tensors == "host":
        _device_checks.install()
    result = Trace(device)
    with ProcessState():
        session = _metamem.Session(device, alloc_conf, gpu, host_tensors)
        finished = False
        try:
            with contextlib.ExitStack() as stack:
                devices = _distributed.local_world_size(world_size, nproc_per_node) if world_size else 1
                runtime = FakeCudaRuntime(session, gpu_spec, devices) if device == "cuda" else None
                stack.enter_context(runtime or _CudaOnFakeCpu())
                stack.enter_context(_CppMetaKernels(device))
                stack.enter_context(_values_shown(placeholder=values == "placeholder"))
                patches = Patches()
                stack.callback(patches.restore)
                _patch_traced_storages(patches, session if device == "cuda" else None)
                _patch_deepcopy(patches)
                _patch_truncated_normal(patches)
                _patch_grad_scaler(patches)
                _patch_fake_tensor_mode(patches)
                _patch_data_loader_workers(patches)
                if device == "cuda":
                    _patch_autograd_multithreading(patches)
                if recordings is not None:
                    stack.enter_context(recordings)
                    runtime.rnns.follow_cudnn(patches)
                groups = None
                if world_size is not None:
                    groups = stack.enter_context(_distributed.ranks(device, world_size, rank, nproc_per_node))
                if values == "placeholder":
                    stack.enter_context(_metamem.PlaceholderValues())
                scopes = stack.enter_context(_ModuleScopes(session))
                replacements = Replacements()
                optimizers = OptimizersFollow(replacements)
                traces = stack.enter_context(_compiled_graphs.Traces(
                    _compiled_graphs.kind_of_trace(device, gpu_spec["key"], world_size, devices, rank),
                    keeps=device == "cuda"))
                stack.enter_context(CompiledCode(session, scopes, optimizers, traces, runtime,
                                                 ranks=world_size is not None))
                stack.callback(replacements.restore)
                replacements.patch_module_moves(patches)
                patch_script_modules(patches, replacements, on_host=device == "cpu" or host_tensors == "host")
                _swapped(modules, device, replacements, runtime.rnns.moved if runtime else None)
                stack.enter_context(optimizers)
                for module in modules:
                    scopes.adopt(module)
                stack.enter_context(_backward_marked(session, scopes))
                yield result
                model, dtype = scopes.model()
                if device == "cuda":
                    result._reserved_peak = session.memory_stats()["reserved_bytes"]["all"]["peak"]
                    if groups is not None:
                        session.set_nccl_communicators(groups.communicators())
            result._result = session.finish(model, dtype)
            finished = True
        finally:
            if not finished:
                session.finish("python", "f32")


def trace_ranks(step, world_size, ranks=None, **options):
    """{rank: Trace} of `step()` traced as each of `ranks` (every rank of
    `world_size` by default) with trace(world_size=..., rank=..., **options).
    Ranks differ where their code does (the root of a scatter, a pipeline
    stage, the padding of uneven shards); a layout whose ranks all run the
    same code needs rank 0 and the last."""
    return {rank: _traced_rank(step, world_size, rank, options)
            for rank in (range(world_size) if ranks is None else ranks)}


def _traced_rank(step, world_size, rank, options):
    with trace(world_size=world_size, rank=rank, **options) as t:
        step()
    return t


def _device_name(device):
    """"cpu" or "cuda" for a device as torch names it: a string or a
    torch.device, cuda's index 0 or none (a trace is one GPU; a job's ranks
    are world_size's)."""
    try:
        named = torch.device(device)
    except (RuntimeError, TypeError):
        named = None
    if named is None or named.type not in ("cpu", "cuda") or named.index not in (None, 0):
        raise ValueError(f"device must be 'cpu' or 'cuda' (or a torch.device of either), got {device!r}")
    return named.type


def _modules_of(modules):
    """`modules` as a tuple of nn.Modules: one module, or an iterable of
    them. Anything else is a TypeError naming what it is, where it failed
    inside the trace's set-up ('int' object has no attribute 'children')."""
    listed = (modules,) if isinstance(modules, torch.nn.Module) else None
    if listed is None and not isinstance(modules, (str, bytes)):
        try:
            listed = tuple(modules)
        except TypeError:
            pass
    wrong = modules if listed is None else next((m for m in listed if not isinstance(m, torch.nn.Module)), None)
    if listed is None or wrong is not None:
        raise TypeError(f"modules must be torch.nn.Module objects (one, or a list of them), got {type(wrong).__name__}")
    return listed


def achieved_cpu(step, modules=()):
    """Runs `step` for real on CPU (code written for CUDA included) and
    returns the peak bytes it held through the CPU allocator, leaving out
    what torch.compile allocates while it compiles, and counting the
    parameters and buffers of `modules` (built before it) as live, as a
    trace with modules=[...] does."""
    # Garbage of earlier code (compiled graphs keep cycles) freed by a
    # collection during the step would lower its peak: collected first.
    gc.collect()
    states = _state_bytes(_modules_of(modules))
    # Compiling (torch.compile in the step) is not the step, as in a trace.
    with _CudaOnCpu(), CompilingAside(_metamem.UncountedCpu):
        return states + _metamem.achieved_cpu(step)


def _state_bytes(modules):
    """The bytes of the storages behind the modules' parameters and
    buffers, each once. A function of its own: a loop variable left behind
    would keep the last tensor alive through the step (a buffer the model
    replaces in forward)."""
    storages = {}
    for module in modules:
        for tensor in (*module.parameters(), *module.buffers()):
            storages.setdefault(tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())
    return sum(storages.values())


def largest_batch(fits, most=1 << 16):
    """The largest batch size up to `most` for which fits(batch) is true, 0
    when fits(1) is not: doubling, then bisection, each size asked once. A
    size whose trace reads a value it does not know stops the search with
    ValueReadError, naming that size and the largest that fit."""
    if most < 1:
        return 0
    asked = _naming_the_batch(fits)
    return _largest_from(asked, 1, None, most) if asked(1) else 0


def largest_batch_by_line(measure, budget, most=1 << 16, multiple=1):
    """The largest batch size up to `most` whose reserved bytes (measure(batch)
    gives (peak bytes, reserved bytes)) are at most `budget`, 0 when batch
    1's are not, in few traces: a step's buffers either do not depend on the
    batch or grow by the same bytes with each sample, so batches 1 and 2 give
    the line the peak follows, the batch where that line meets the budget is
    traced, and the next one, which must not fit: four traces where the line
    holds. Where it does not (the allocator's segments round the reserved
    bytes), doubling and bisection go on from what was measured. Each size
    is measured once; errors as largest_batch's. With `multiple` (a
    pipeline's microbatches), only its multiples are batches: the line
    runs through `multiple` and twice it."""
    if most < multiple:
        return 0
    measured = {}

    def fits(samples):  # `samples` to each of the `multiple` parts of the batch
        measured[samples] = measure(samples * multiple)
        return measured[samples][1] <= budget

    return multiple * _largest_by_line(_naming_the_batch(fits, multiple), measured, budget, most // multiple)


def _largest_by_line(asked, measured, budget, most):
    """largest_batch_by_line's search, of batches asked(batch) has measured."""
    if not asked(1):
        return 0
    if most == 1 or not asked(2):
        return 1
    slope = measured[2][0] - measured[1][0]
    guess = most if slope <= 0 else min(most, max(2, 2 + (budget - measured[2][1]) // slope))
    if guess == 2:
        return _largest_from(asked, 2, None, most)
    if not asked(guess):
        return _largest_from(asked, 2, guess, most)
    if guess == most or not asked(guess + 1):
        return guess
    return _largest_from(asked, guess + 1, None, most)


def _naming_the_batch(fits, multiple=1):
    """fits(batch), a ValueReadError naming the batch and the largest that fit
    (each `multiple` times the size fits was asked of)."""
    largest = [0]

    def asked(batch):
        try:
            fit = fits(batch)
        except ValueReadError as error:
            raise ValueReadError(f"at batch {batch * multiple} the step reads a value the trace does not know, "
                                 f"batch {largest[0] * multiple} fits: {error.args[0]}") from error
        if fit:
            largest[0] = max(largest[0], batch)
        return fit
    return asked


def _largest_from(asked, best, fails, most):
    """The largest batch that fits, `best` fitting and `fails` (None: none
    known yet) not: doubling from `best` until one fails, then bisection."""
    if fails is None:
        fails = 2 * best
        while fails <= most and asked(fails):
            best, fails = fails, 2 * fails
        fails = min(fails, most + 1)
    while fails - best > 1:
        middle = (best + fails) // 2
        if asked(middle):
            best = middle
        else:
            fails = middle
    return best
