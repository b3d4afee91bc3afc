"""torch.compile inside a trace (docs/compile.md).

What a compiled step holds is what the code Inductor generated allocates
when it runs: its wrapper (a Python module with a `call` function) makes
each buffer with empty_strided_cpu, runs fused kernels into them, calls
extern kernels (matmuls, convolutions, attention) with out=, deletes a
buffer when its last reader is done and reuses it by name; AOTAutograd's
partitioner chose which buffers the forward returns for backward. A trace
therefore compiles as torch does and runs the compiled wrapper itself:

- Compiling (Dynamo, AOTAutograd, Inductor) runs outside the trace: Dynamo
  fakeifies the traced tensors as any others, and what compiling allocates
  is the step's only where it outlives the compile. Module hooks read
  torch.compiler.is_compiling() and are traced as nothing, so the graphs
  are those of a run without metamem.
- Running, the wrapper's allocations go through the dispatcher (its
  empty_strided_* are C++ functions that would make real tensors) and its
  views are views of traced tensors; its extern kernels are aten ops the
  trace records; its generated C++ kernels are given traced tensors and
  compute nothing, and a wrapper loaded for the trace does not build them
  at all (it leaves Inductor's cache with the block). Given real tensors,
  each of them does what it did: the trace's thread alone is changed, and
  only while the block runs.

An optimizer's compiled step: Dynamo runs the optimizer's _init_group for
real while it compiles, making its state (on the GPU in a real run), so
the trace runs it inside the trace; and Dynamo drops the record_function
scope by which torch.optim marks a step, so the trace puts it back around
the step's graph.

Guards on a compiled frame check its tensors' dispatch keys: a traced
tensor never runs code compiled for real ones, nor the reverse, and a graph
compiled before the block is compiled again (from Inductor's caches) for
traced inputs.
"""

import contextlib
import functools
import gc
import re
import sys
import threading
import warnings
import weakref

import torch

from . import _compile_cuda, _compiled_graphs, _metamem
from ._optimizers import OptimizerRefused
from ._cuda import Patches

# The `call` of each wrapper loaded for a trace that has ended, while
# Dynamo's cache keeps it (it keeps the function, and so the module's
# globals, not the module).
_LOADED_FOR_TRACES = weakref.WeakSet()


class _WrapperGlobals:
    """A wrapper module's globals as attributes, patched as the module's are."""

    def __init__(self, namespace):
        self.__dict__ = namespace

# A kernel in the wrapper's source: `cpp_fused_add_0 = async_compile.cpp_pybinding(...)`.
_KERNEL = re.compile(r"^(\w+) = async_compile\.\w+\(", re.M)
_HOOKS_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"


def _traced(args):
    """Whether any of `args` is a traced tensor: compiled code mixes them
    with real ones where the block runs a model from before it (a fake
    cpu's real parameters, with traced gradients and optimizer states)."""
    return any(isinstance(arg, torch.Tensor) and _metamem.is_traced(arg) for arg in args)


def _instead_on_traced(original, instead):
    """`original`, but `instead` where a tensor argument is traced."""
    def chosen(*args, **kwargs):
        return (instead if _traced(args) else original)(*args, **kwargs)
    return chosen


def _nothing(*args, **kwargs):
    return None


def _as_view(tensor, size, stride, offset):
    """reinterpret_tensor of a traced tensor: the same view, made by the
    dispatcher (the C++ one makes a plain TensorImpl over its storage)."""
    return torch.as_strided(tensor, size, stride, tensor.storage_offset() + offset)


class _Unbuilt:
    """A kernel of a wrapper loaded for a trace, not built: its C++ source
    is not compiled (seconds a kernel), since it would compute
    nothing. The module is dropped from Inductor's cache when the block
    ends, so that a real run loads it anew and builds its kernels."""

    def __call__(self, *args, **kwargs):
        if not _traced(args):
            raise RuntimeError("metamem: a kernel loaded for a trace, unbuilt, is called on real tensors "
                               "(another thread's compiled code, during a trace?)")


def _aligned(tensor):
    """copy_if_misaligned of a traced tensor. Its address would be its
    block's, which the caching allocator aligns to 512 bytes (the CPU's to
    64), plus its offset: the offset alone tells whether Inductor's 16-byte
    alignment holds, and a misaligned tensor is copied, as it would be."""
    from torch._inductor.utils import ALIGNMENT, clone_preserve_strides

    if tensor.storage_offset() * tensor.element_size() % ALIGNMENT:
        return clone_preserve_strides(tensor)
    return tensor


def _aligned_inputs(original):
    """Inductor's copy_misaligned_inputs, which reads data pointers, for
    traced inputs: each misaligned one copied (_aligned); the pairs it
    returns are those Inductor copies a mutation back through."""
    def copy(new_inputs, check_inputs_idxs, return_pair_idxs=None):
        if not _traced(new_inputs):
            return original(new_inputs, check_inputs_idxs, return_pair_idxs)
        old_tensors, new_tensors = [], []
        for i in check_inputs_idxs:
            aligned = _aligned(new_inputs[i])
            if aligned is not new_inputs[i]:
                if return_pair_idxs is not None and i in return_pair_idxs:
                    old_tensors.append(new_inputs[i])
                    new_tensors.append(aligned)
                new_inputs[i] = aligned
        return old_tensors, new_tensors
    return copy


def _autotune_afresh(module):
    """A wrapper's Triton kernels loaded for a trace, each with every
    configuration it was loaded with: the first time, they are noted; in a
    later trace that runs the wrapper again (metamem._compiled_graphs),
    given back as a load in a process of its own would give them: the one
    a real run has since written to Inductor's autotune cache, if any
    (torch's own check, as a kernel loaded from its cache does), else every
    one, so that the kernel autotunes at its first call and allocates for
    its benchmarks."""
    from torch._inductor.runtime.triton_heuristics import (CachingAutotuner, check_autotune_cache,
                                                             triton_config_to_hashable)

    for kernel in vars(module).values():
        if not isinstance(kernel, CachingAutotuner):
            continue
        if not hasattr(kernel, "_metamem_launchers"):
            kernel._metamem_launchers = list(kernel.launchers)
            continue
        launchers = kernel._metamem_launchers
        cached, _, _ = check_autotune_cache([launcher.config for launcher in launchers], kernel.filename,
                                            kernel.inductor_meta, kernel._could_rblock_scale)
        best = [launcher for launcher in launchers if len(cached) == 1 and len(launchers) > 1
                and triton_config_to_hashable(launcher.config) == triton_config_to_hashable(cached[0])]
        kernel.launchers = best or list(launchers)
        kernel._cached_launcher = None  # run()'s launcher after its first call


def _dispatched_empty(device, pinned=False):
    """empty_strided_<device>(size, stride, dtype) through the dispatcher:
    a traced tensor inside the trace, a real one elsewhere."""
    def empty(size, stride, dtype):
        return torch.empty_strided(size, stride, dtype=dtype, device=device, pin_memory=pinned)
    return empty


class CompilingAside:
    """While entered: torch.compile's compiling (Dynamo's frame compiles,
    AOTAutograd's lazy backward compile) runs inside `aside()`, as not the
    step. Installed on entry where Dynamo is imported; otherwise by the
    block's first torch.compile (importing Dynamo takes seconds)."""

    def __init__(self, aside):
        self.aside = aside
        self.patches = Patches()
        self.installed = False

    def __enter__(self):
        if "torch._dynamo" in sys.modules:
            self.install()
        else:
            compile_ = torch.compile

            @functools.wraps(compile_)
            def compile_installing(*args, **kwargs):
                self.install()
                return compile_(*args, **kwargs)

            self.patches.set(torch, "compile", compile_installing)
        return self

    def __exit__(self, *exc):
        self.patches.restore()

    def install(self):
        if not self.installed:
            self.installed = True
            self._patch()

    def _patch(self):
        import torch._dynamo.convert_frame as convert_frame
        from torch._functorch._aot_autograd import runtime_wrappers

        self.patches.set(convert_frame, "_compile", self.compiling_frames(convert_frame._compile))
        backward = runtime_wrappers._AutogradBackwardCompiler
        get_or_compile = backward.get_or_compile
        compile_aside = self.compiling(get_or_compile)

        def compiling_once(compiler, *args, **kwargs):
            # Every backward of a compiled region asks; only the first compiles.
            # Setting the others aside collected garbage each time (0.3 s a
            # call: 24 of an 8B rank's 46 s).
            if compiler.compiled_bw is not None:
                return get_or_compile(compiler, *args, **kwargs)
            return compile_aside(compiler, *args, **kwargs)

        self.patches.set(backward, "get_or_compile", compiling_once)

    def compiling(self, compile_):
        @functools.wraps(compile_)
        def aside(*args, **kwargs):
            # Compiling leaves cycles: collected when it ends, aside, rather
            # than freed in the step whenever a collection runs.
            with self.aside(), _collecting_what_it_leaves():
                try:
                    return compile_(*args, **kwargs)
                except Exception as error:
                    refused = self.refused(error)
                    if refused is not None:
                        raise refused from None
                    raise
        return aside

    def compiling_frames(self, compile_frame):
        """Dynamo's frame compile (convert_frame._compile(code, ...)), aside."""
        return self.compiling(compile_frame)

    def refused(self, error):
        """The UnsupportedCompileError that compiling's `error` is, if any."""
        return None


@contextlib.contextmanager
def _collecting_what_it_leaves():
    """Collects, when the block ends, the cyclic garbage among the objects
    it made. The process's older objects are frozen meanwhile (gc.freeze),
    so that collection examines the block's alone: a full one, over the
    objects of a compiled 405B rank's Trainer, took 0.45 s, seven times a
    trace. Garbage older than the block is left to the next collection,
    as it is in a run without metamem. In a process that froze objects
    itself (gc.get_freeze_count()), nothing is frozen here: unfreezing
    would thaw its objects too."""
    freezes = gc.get_freeze_count() == 0
    if freezes:
        gc.freeze()
    try:
        yield
    finally:
        try:
            gc.collect()
        finally:
            if freezes:
                gc.unfreeze()


@contextlib.contextmanager
def _outside_the_trace():
    """Compiling in a trace: its ops run outside it and what it allocates on
    the CPU is not the step's."""
    with _metamem.OutsideTrace(), _metamem.UncountedCpu():
        yield


class CompiledCode(CompilingAside):
    """While entered: torch.compile'd code on this thread's traced tensors
    compiles outside the trace and runs its wrapper in it, each graph's run
    in a scope that names it ("GPT.[compiled 0 forward]"). On fake cuda
    (`cuda`, the trace's metamem._cuda.FakeCudaRuntime), Inductor compiles
    for the traced GPU (metamem._compile_cuda)."""

    def __init__(self, session, scopes, optimizers, traces, cuda=None, ranks=False):
        super().__init__(_outside_the_trace)
        self.session = session
        self.scopes = scopes
        self.optimizers = optimizers  # the block's _optimizers.OptimizersFollow
        self.traces = traces  # the block's _compiled_graphs.Traces: which graphs it runs and keeps
        self.cuda = cuda
        # A trace of one rank (`ranks`) takes nothing from AOTAutograd's
        # cache: its key names the rank's process groups but not the rank,
        # whose mesh coordinates a graph may hold (an uneven shard's size).
        self.ranks = ranks
        self.wrappers = set()  # id() of the globals of the wrapper modules made traceable
        self.loaded = []  # the wrapper modules loaded during the block
        self.owner = threading.get_ident()
        self.optimizer = None  # the optimizer whose step the frame compiling now traces
        self.steps_an_optimizer = False  # whether the frame compiling now does
        # id() of each graph that is an optimizer's step: (the graph, kept
        # for the block so that its id stays its own; the optimizer's class)
        self.optimizer_steps = {}

    def __enter__(self):
        warnings.filterwarnings("ignore", message=_HOOKS_WARNING)
        self.warning_filter = warnings.filters[0]
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        if self.installed and self.cuda is not None:
            _compile_cuda.uninstall()
            if self.cuda.graph_trees.containers:
                self.traces.keep = False  # its trees, which its graphs call, end with it
        self._drop_loaded()
        if self.warning_filter in warnings.filters:
            warnings.filters.remove(self.warning_filter)
            warnings._filters_mutated()

    def _patch(self):
        super()._patch()
        from torch._inductor.codecache import PyCodeCache, triton_key
        from torch._inductor.output_code import CompiledFxGraph

        if self.cuda is not None:
            # Inductor's cache keys on a GPU hash Triton's library, once per
            # process at its first compile: torch's prefetch hashes it beside
            # the block from here, where reading and hashing leave the
            # interpreter to the block (torch's own files, also hashed once,
            # are thousands of small ones: the interpreter's work).
            triton_key.prefetch()

        load = PyCodeCache.load_by_key_path.__func__

        def load_traceable(cls, *args, **kwargs):
            known = len(cls.modules)  # a module loaded anew is appended
            module = load(cls, *args, **kwargs)
            if len(cls.modules) > known:
                self.loaded.append(module)
            self._make_traceable(module)
            return module

        self.patches.set(PyCodeCache, "load_by_key_path", classmethod(load_traceable))
        from torch._inductor import utils

        self.patches.set(utils, "copy_misaligned_inputs", _aligned_inputs(utils.copy_misaligned_inputs))
        from torch._inductor.async_compile import AsyncCompile

        for method in ("cpp", "cpp_pybinding"):
            self.patches.set(AsyncCompile, method, self._unbuilt(getattr(AsyncCompile, method)))
        if self.cuda is not None:
            _compile_cuda.install(self.patches, self.cuda, self.owner, self._benchmarked)
        for module in PyCodeCache.modules:
            self._make_traceable(module)
        for call in list(_LOADED_FOR_TRACES):
            self._make_traceable(_WrapperGlobals(call.__globals__), unbuilt=True)

        run = CompiledFxGraph.__call__

        def run_scoped(graph, inputs):
            if graph.fx_kwargs.get("is_backward", False):
                return run(graph, inputs)
            if threading.get_ident() == self.owner:
                # A real parameter (a fake cpu's model from before the
                # block) reaches the kernels through reinterpret_tensor, an
                # alias autograd does not know: its .grad, which backward
                # will set to a traced one, is kept here to be put back.
                for tensor in inputs:
                    if isinstance(tensor, torch.Tensor) and tensor.requires_grad and not _metamem.is_traced(tensor):
                        _metamem.keep_grad_of_leaf(tensor)
            if not _traced(inputs):
                return run(graph, inputs)
            optimizer = self.optimizer_steps.get(id(graph), (None, None))[1]
            self.session.push_scope(self._scope(graph, f"{optimizer}.step" if optimizer else "forward"))
            try:
                if optimizer is None:
                    return run(graph, inputs)
                # Dynamo drops the record_function scope by which torch.optim
                # marks a step and a trace tells steps apart: it is put back.
                with torch.autograd.profiler.record_function(f"Optimizer.step#{optimizer}.step"):
                    return run(graph, inputs)
            finally:
                self.session.pop_scope()

        self.patches.set(CompiledFxGraph, "__call__", run_scoped)
        post_compile = CompiledFxGraph.post_compile

        def noting_optimizer_steps(graph, *args, **kwargs):
            if self.optimizer is not None and threading.get_ident() == self.owner:
                self.optimizer_steps[id(graph)] = (graph, self.optimizer)
                self.optimizer = None
            return post_compile(graph, *args, **kwargs)

        self.patches.set(CompiledFxGraph, "post_compile", noting_optimizer_steps)
        from torch._dynamo.variables.optimizer import OptimizerVariable

        self.patches.set(OptimizerVariable, "call_method", self._initializing(OptimizerVariable.call_method))
        from torch._dynamo import convert_frame

        self.patches.set(convert_frame, "CheckFunctionManager", self._guarding(convert_frame.CheckFunctionManager))
        self.patches.set(convert_frame, "compute_cache_size",
                         _compiled_graphs.counting_live_entries(convert_frame.compute_cache_size))
        if self.ranks:
            from torch._functorch import config as functorch

            self.patches.set(functorch, "enable_autograd_cache", False, restore=functorch.enable_autograd_cache)

    def compiling(self, compile_):
        aside = super().compiling(compile_)

        @functools.wraps(compile_)
        def afresh(*args, **kwargs):
            self.optimizer = None
            self.steps_an_optimizer = False
            if threading.get_ident() == self.owner:
                self.optimizers.before_compiling()
            return aside(*args, **kwargs)
        return afresh

    def compiling_frames(self, compile_frame):
        compile_ = self.compiling(compile_frame)

        @functools.wraps(compile_frame)
        def noted(code, *args, **kwargs):
            if threading.get_ident() == self.owner:
                self.traces.compiling(code)
            return compile_(code, *args, **kwargs)
        return noted

    def _initializing(self, call_method):
        """Dynamo's OptimizerVariable.call_method. Dynamo runs an optimizer's
        _init_group for real while it compiles its step: the state it makes
        (and the step counters it moves to the GPU) are the trace's, as a
        real run makes them on the device. The graph compiled is that
        optimizer's step."""
        def call(variable, tx, name, *args, **kwargs):
            if name != "_init_group" or threading.get_ident() != self.owner:
                return call_method(variable, tx, name, *args, **kwargs)
            self.optimizer = type(variable.value).__name__
            self.steps_an_optimizer = True
            # Its state is the block's, where it is from before the block
            # (a fake cpu's model, whose parameters stay real).
            self.optimizers.take(variable.value)
            with _metamem.InsideTrace():
                return call_method(variable, tx, name, *args, **kwargs)
        return call

    def _guarding(self, check_function_manager):
        """Dynamo's guard builder, on the trace's thread with the trace's
        dispatch keys. A tensor guard keeps the tensor's dispatch keys as
        the thread's keys change them (included added, excluded taken
        away) when it is built, and compares them with those at each call.
        The trace includes PrivateUse1 and excludes BackendSelect; compiling
        aside does not. Guards built aside failed at every later call in the
        trace: each call recompiled, until Dynamo's recompile limit (a
        torchtitan model's blocks compiled fullgraph reach it in step 2)."""
        def built(*args, **kwargs):
            if threading.get_ident() != self.owner:
                return check_function_manager(*args, **kwargs)
            with _metamem.InsideTrace():
                guards = check_function_manager(*args, **kwargs)
            # An optimizer's step compiled made its state, which the next
            # trace's optimizer must make again.
            self.traces.guarded(args[0] if args else kwargs["f_code"], guards, keepable=not self.steps_an_optimizer)
            return guards
        return built

    def _benchmarked(self):
        # What a compile's benchmarks allocated is the step's in a process
        # that compiles; a trace that ran its graphs without compiling them
        # would not hold it.
        self.traces.keep = False

    def refused(self, error):
        # Dynamo rewraps what making an optimizer's state raised as it
        # compiled ("raise InternalTorchDynamoError(...) from None").
        if isinstance(error.__context__, OptimizerRefused):
            return error.__context__
        return _compile_cuda.refused(error) if self.cuda is not None else None

    def _unbuilt(self, build):
        """AsyncCompile's kernel builders, on the trace's thread: kernels
        that are not built (what a real run needs alone)."""
        def unbuilt(async_compile, *args, **kwargs):
            if threading.get_ident() != self.owner:
                return build(async_compile, *args, **kwargs)
            return _Unbuilt()
        return unbuilt

    def _drop_loaded(self):
        """The wrappers loaded during the block (their kernels unbuilt) leave
        Inductor's in-memory cache: a real run loads and builds them anew.
        Dynamo's cache keeps the graphs that call them, which a later trace
        runs again (a function compiled anew in each trace compiles once:
        Dynamo caches by code): that trace makes them traceable too."""
        from torch._inductor.codecache import PyCodeCache

        for module in self.loaded:
            if callable(getattr(module, "call", None)):  # a wrapper, not a kernel's module
                _LOADED_FOR_TRACES.add(module.call)
            if module in PyCodeCache.modules:
                PyCodeCache.modules.remove(module)
            for cache in (PyCodeCache.modules_no_attr, sys.modules):
                for key in [key for key, value in cache.items() if value is module]:
                    del cache[key]
        self.loaded.clear()

    def _scope(self, graph, what):
        """A forward graph runs in the module that called it; its backward
        is one autograd node, whose memory the tables give its forward."""
        name = f"[compiled {graph.fx_kwargs.get('graph_id')} {what}]"
        parent = self.scopes.current()
        return f"{parent}.{name}" if parent else name

    def _make_traceable(self, module, unbuilt=False):
        """A wrapper module's kernels idle on traced tensors, its buffers and
        views traced (put back when the block ends). `unbuilt`: a wrapper
        loaded for an earlier trace, whose kernels were never built (and
        whose source may be gone with a temporary Inductor cache)."""
        if id(vars(module)) in self.wrappers or not callable(getattr(module, "call", None)):
            return
        self.wrappers.add(id(vars(module)))
        if unbuilt or any(loaded is module for loaded in self.loaded):
            _autotune_afresh(module)
        kernels = []
        if not unbuilt:
            with open(module.__file__) as source:
                kernels = _KERNEL.findall(source.read())
        for name in kernels:
            kernel = getattr(module, name)
            if not isinstance(kernel, _Unbuilt) and not _compile_cuda.unbuilt(kernel):
                # built before the block: idle on traced tensors
                self.patches.set(module, name, _instead_on_traced(kernel, _nothing))
        replacements = {
            "empty_strided_cpu": _dispatched_empty("cpu"),
            "empty_strided_cpu_pinned": _dispatched_empty("cpu", pinned=True),
            "empty_strided_cuda": _dispatched_empty("cuda"),
            "reinterpret_tensor": _instead_on_traced(getattr(module, "reinterpret_tensor", None), _as_view),
            # They read a data pointer, which a traced tensor does not have.
            "assert_alignment": _instead_on_traced(getattr(module, "assert_alignment", None), _nothing),
            "copy_if_misaligned": _instead_on_traced(getattr(module, "copy_if_misaligned", None), _aligned),
        }
        for name, value in replacements.items():
            if name in module.__dict__:
                self.patches.set(module, name, value)
