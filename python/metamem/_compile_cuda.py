"""torch.compile for the traced GPU (docs/compile.md, "Fake cuda").

A process without a GPU has no CUDA for Inductor to ask. While a fake-cuda
trace compiles, each question Inductor and Triton ask of CUDA is answered
for the traced GPU, and no kernel is built:

- Triton's active driver is one whose target and properties are the traced
  GPU's (Triton's own CudaDriver builds a module that loads libcuda).
- FakeTensorMode, which Dynamo, AOTAutograd and Inductor's pattern matcher
  compile under, avoids device initialization as on a machine without a
  GPU: its torch.tensor(..., device="cuda") stays fake rather than asking
  the CUDA runtime.
- Inductor's constant folding computes values it then reads (a uniform
  tensor's value, to replace it by a scalar), make_fx keeps a real copy of
  each small constant it traces, and a graph read back from AOTAutograd's
  cache is traced again from its code, which runs each op of constants
  (FlexAttention's and_masks starts from a `full([], True)` on the GPU):
  on a GPU they are made there; in a trace they are made on the CPU, where
  the values are the same.
- What a compile runs on the GPU in a real run runs in the trace: Inductor
  benchmarks a matmul whose shapes are misaligned (GPT-2's vocabulary of
  50,257) against a padded one on GPU tensors it makes, and max-autotune
  benchmarks each matmul's and FlexAttention's choices and weighs fused
  kernels against their parts; a real run counts those tensors. Every
  benchmark times 1 ms, on the fake GPU as in the trace, so nothing is
  padded and the first choice is taken. No decision is written to
  Inductor's caches; pad_mm's are kept for the trace's later compiles.
- Triton kernels (the wrapper's, and max-autotune's templates) are loaded
  from their source but not compiled to cubins: each configuration gets a
  launcher that launches nothing. A kernel with several configurations
  autotunes at its first call, as on a GPU, and its benchmarking allocates
  as there (the benchmarker's L2-clearing buffer, clones of the arguments
  the kernel mutates). The trace's choice is not written to Inductor's
  autotune cache: it is nobody's best.

Every name is put back when the block ends; Dynamo's table of special
functions, which keys torch.cuda's functions as they were when it was
built, is built afresh on entry and on exit.
"""

import contextlib
import sys
import threading
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import _metamem


class UnsupportedCompileError(NotImplementedError):
    """torch.compile'd code a trace cannot follow (docs/compile.md)."""

    __module__ = "metamem"


def _traced_gpu_driver(gpu):
    """Triton's CUDA driver for the traced GPU, made without its C module."""
    from triton.backends.driver import GPUDriver
    from triton.backends.nvidia.driver import CudaDriver, CudaLauncher

    class TracedGpuDriver(CudaDriver):
        def __init__(self):
            self.utils = _TracedGpuUtils(gpu)
            self.launcher_cls = CudaLauncher
            GPUDriver.__init__(self)  # torch.cuda's device and capability: the trace's
            self.get_current_stream = torch._C._cuda_getCurrentRawStream

    return TracedGpuDriver()


class _TracedGpuUtils:
    """What Inductor reads of Triton's driver utilities: the device's
    properties, as the fake GPU's driver answers them."""

    def __init__(self, gpu):
        self.gpu = gpu

    def get_device_properties(self, device):
        return {"max_shared_mem": self.gpu["shared_memory_per_block_optin"], "max_num_regs": 65536,
                "multiprocessor_count": self.gpu["multi_processor_count"], "warpSize": 32,
                "sm_clock_rate": 0, "mem_clock_rate": 0, "mem_bus_width": 0}


class _ValuesOnCpu(TorchDispatchMode):
    """While active: what would be made on the GPU is made on the CPU."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = torch.device("cpu")
        # prims.device_put(a, device) takes it positionally
        args = [torch.device("cpu") if isinstance(arg, torch.device) and arg.type == "cuda" else arg for arg in args]
        return func(*args, **kwargs)


def _values_on_cpu(owner):
    """On `owner`'s thread, _ValuesOnCpu; on another, nothing changes."""
    return _ValuesOnCpu() if threading.get_ident() == owner else contextlib.nullcontext()


def _on_cpu(run, owner):
    def run_on_cpu(*args, **kwargs):
        with _values_on_cpu(owner):
            return run(*args, **kwargs)
    return run_on_cpu


@contextlib.contextmanager
def _both(first, second):
    with first, second:
        yield


def refused(error):
    """The UnsupportedCompileError that an error of compiling for fake cuda
    is: metamem's own, which Dynamo wraps; or, where compiling reached the
    CUDA runtime this process lacks, one naming where. None otherwise."""
    seen = []
    while error is not None and error not in seen:
        seen.append(error)
        if isinstance(error, UnsupportedCompileError):
            return error
        if isinstance(error, torch.AcceleratorError) and "cudaErrorInsufficientDriver" in str(error):
            frames = traceback.extract_tb(error.__traceback__)
            where = next((f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno} ({frame.name})"
                          for frame in reversed(frames) if "/torch/" in frame.filename), "torch")
            return UnsupportedCompileError(
                f"metamem: compiling for fake cuda reached the CUDA runtime, which this process does not have, "
                f"at {where}; a trace cannot follow this compiled code yet (docs/compile.md)")
        error = getattr(error, "inner_exception", None) or error.__cause__ or error.__context__
    return None


def _instead_on(owner, original, instead):
    """`original`, but `instead` on `owner`'s thread (the trace's): other
    threads compile as they would without the trace."""
    def chosen(*args, **kwargs):
        return (instead if threading.get_ident() == owner else original)(*args, **kwargs)
    return chosen


def _nothing(*args, **kwargs):
    return None


def _in_the_trace(function, owner, benchmarked):
    """`function`, run inside the trace on `owner`'s thread: what it
    allocates on the GPU in a real compile, the trace records. Each run
    calls `benchmarked()` first."""
    def traced(*args, **kwargs):
        benchmarked()
        with _metamem.InsideTrace():
            return function(*args, **kwargs)
    return _instead_on(owner, function, traced)


def cannot_follow(what):
    """The error for `what`, compiled code that a trace cannot follow yet."""
    return UnsupportedCompileError(f"metamem: {what} cannot be traced on fake cuda yet (docs/compile.md)")


class _UnbuiltConfig:
    """A configuration's compile result, not compiled: its launcher
    launches nothing. As a kernel built for the fake GPU, it uses no
    registers, so Inductor does not halve its reduction blocks."""

    n_regs = n_spills = shared = 0

    def __init__(self, config):
        self.config = config

    @property
    def kernel(self):  # the compiled binary, whose registers Inductor reads
        return self

    def make_launcher(self):
        return _IdleLauncher(self.config)


class _IdleLauncher:
    """A configuration's launcher, not built: it launches nothing. As a
    built one on the fake GPU, it reports no registers, spills or shared
    memory."""

    n_regs = n_spills = shared = 0
    cache_hash = None
    store_cubin = False

    def __init__(self, config):
        self.config = config

    def __call__(self, *args, stream=None, **kwargs):
        return None


def unbuilt(kernel):
    """Whether `kernel` is a Triton kernel loaded for a trace."""
    launchers = getattr(kernel, "launchers", None)
    return bool(launchers) and all(isinstance(launcher, _IdleLauncher) for launcher in launchers)


def install(patches, cuda, owner, benchmarked):
    """Patches (metamem._cuda.Patches) that let `owner`'s thread compile for
    the GPU of `cuda`, a trace's metamem._cuda.FakeCudaRuntime. A compile
    that benchmarks on the GPU, and so allocates in the trace, calls
    `benchmarked()`."""
    from torch._dynamo import device_interface
    from torch._dynamo.variables.torch import TorchInGraphFunctionVariable
    from torch._inductor import compile_fx, select_algorithm
    from torch._inductor.async_compile import AsyncCompile
    from torch._inductor.codecache import PersistentCache, _load_triton_kernel_from_source
    from torch._inductor.codegen import triton as triton_codegen
    from torch._inductor.constant_folding import ConstantFolder
    from torch._inductor.fx_passes import pad_mm
    from torch._inductor.runtime.autotune_cache import AutotuneCache
    from torch._inductor.runtime.benchmarking import benchmarker
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    from torch._inductor.scheduler import Scheduler
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx import graph_module
    from torch.fx.experimental import proxy_tensor

    gpu = cuda.gpu
    TorchInGraphFunctionVariable._get_handlers.cache_clear()
    _forget_what_was_asked_of_the_gpu()
    patches.set(FakeTensorMode, "avoid_device_init", property(lambda mode: True))
    # Dynamo's interface to torch.cuda holds what torch.cuda had when Dynamo
    # was imported (before the trace, or in it): the trace's for the block,
    # torch's after it.
    interface = device_interface.CudaInterface
    for name, module, attribute, wrap in (
            ("Event", torch.cuda, "Event", lambda value: value),
            ("Stream", torch.cuda, "Stream", lambda value: value),
            ("exchange_device", torch.cuda, "_exchange_device", staticmethod),
            ("maybe_exchange_device", torch.cuda, "_maybe_exchange_device", staticmethod),
            ("get_raw_stream", torch._C, "_cuda_getCurrentRawStream", staticmethod)):
        patches.set(interface, name, wrap(getattr(module, attribute)),
                    restore=wrap(cuda.patches.original(module, attribute)))
    # Its workers' properties, cached for the process: the traced GPU's now.
    device_interface.caching_worker_device_properties.pop("cuda", None)
    patches.set(sys.modules["triton.runtime.driver"].driver, "_active", _traced_gpu_driver(gpu))
    patches.set(ConstantFolder, "run", _on_cpu(ConstantFolder.run, owner))
    # make_fx keeps a real value beside each small constant it traces (the
    # scalar that _foreach_lerp's decomposition moves to the GPU, for .item()
    # and constant propagation): on the CPU, as above.
    unset_fake = proxy_tensor.unset_fake_temporarily
    patches.set(proxy_tensor, "unset_fake_temporarily", lambda: _both(unset_fake(), _values_on_cpu(owner)))
    patches.set(graph_module, "_deserialize_graph_module", _on_cpu(graph_module._deserialize_graph_module, owner))
    cuda.graph_trees.use(patches)
    patches.set(pad_mm, "_should_pad", _in_the_trace(pad_mm._should_pad, owner, benchmarked))
    # pad_mm's decisions are the trace's, kept for its later compiles as a
    # real run keeps them in Inductor's cache and reads them back (an
    # evaluation's graph does not benchmark its matmuls again), and not
    # written there.
    decided = {}
    for get, set_ in (("get_cached_should_pad", "set_cached_should_pad"),
                      ("get_cached_base_mm_benchmark_time", "set_cached_base_mm_benchmark_time")):
        cached = getattr(pad_mm, get)
        patches.set(pad_mm, get, lambda key, cached=cached: decided[key] if key in decided else cached(key))
        patches.set(pad_mm, set_, decided.__setitem__)
    # A cached size would be the last GPU's.
    patches.set(benchmarker, "L2_cache_size", gpu["L2_cache_size"])
    # Every Triton kernel, the wrapper's and max-autotune's templates: each
    # configuration is loaded from its source, not compiled.
    precompile_config = CachingAutotuner._precompile_config

    def unbuilt_config(autotuner, config, **kwargs):
        if autotuner.device_props.type != "cuda":
            return precompile_config(autotuner, config, **kwargs)
        return _UnbuiltConfig(config)

    patches.set(CachingAutotuner, "_precompile_config", _instead_on(owner, precompile_config, unbuilt_config))

    def loaded_unbuilt(async_compile, kernel_name, source_code, device_str="cuda"):
        kernel = _load_triton_kernel_from_source(kernel_name, source_code)
        if not kernel.launchers:  # not loaded before, for a benchmark
            kernel.precompile()
        return kernel

    patches.set(AsyncCompile, "triton", _instead_on(owner, AsyncCompile.triton, loaded_unbuilt))
    # Nothing is compiled, so nothing is handed to a pool of compiling
    # processes: the kernels are loaded at once.
    use_process_pool = AsyncCompile.use_process_pool.__func__
    patches.set(AsyncCompile, "use_process_pool", classmethod(_instead_on(owner, use_process_pool, lambda cls: False)))
    # The trace's timings are nobody's: neither a kernel's configuration nor
    # max-autotune's choice is written to Inductor's caches. Choices a real
    # run wrote there are read, as a real run reads them.
    patches.set(AutotuneCache, "save", _instead_on(owner, AutotuneCache.save, _nothing))
    patches.set(PersistentCache, "update_local_cache", _instead_on(owner, PersistentCache.update_local_cache, _nothing))
    # max-autotune benchmarks each choice on example tensors it makes on the
    # GPU while it compiles, and a real run counts them: in the trace, on
    # the traced GPU. Its templates are loaded where they are benchmarked,
    # on the trace's thread, rather than compiled beforehand on worker
    # threads.
    selector = select_algorithm.AlgorithmSelectorCache
    benchmark = selector.__dict__["benchmark_in_current_process"].__func__
    patches.set(selector, "benchmark_in_current_process", classmethod(_in_the_trace(benchmark, owner, benchmarked)))
    patches.set(select_algorithm, "get_num_workers", _instead_on(owner, select_algorithm.get_num_workers, lambda: 0))
    # Nor does it print its tables of timings: every choice's 1 ms is the
    # fake GPU's, no measurement.
    patches.set(selector, "log_results", staticmethod(_instead_on(owner, selector.log_results, _nothing)))
    patches.set(select_algorithm, "_log_autotune_choices_stats",
                _instead_on(owner, select_algorithm._log_autotune_choices_stats, _nothing))
    # So does the scheduler, weighing a fused kernel against its parts
    # (max-autotune's epilogue fusion). It writes their timings beside each
    # kernel's source (.kernel_perf): not the trace's.
    for name in ("benchmark_fused_nodes", "benchmark_codegened_module", "benchmark_combo_kernel"):
        patches.set(Scheduler, name, _in_the_trace(getattr(Scheduler, name), owner, benchmarked))
    patches.set(triton_codegen, "write_atomic", _instead_on(owner, triton_codegen.write_atomic, _nothing))


def uninstall():
    """What install leaves that Patches does not put back: caches of what
    the traced GPU answered."""
    from torch._dynamo import device_interface
    from torch._dynamo.variables.torch import TorchInGraphFunctionVariable

    TorchInGraphFunctionVariable._get_handlers.cache_clear()
    device_interface.caching_worker_device_properties.pop("cuda", None)
    _forget_what_was_asked_of_the_gpu()


def _forget_what_was_asked_of_the_gpu():
    """Empties the caches of Triton's and Inductor's questions about the
    GPU (has_triton, Triton's backend and its target, is_big_gpu, the SM
    count, ...): answered before a trace (a process without a GPU has no
    Triton), or for another traced GPU, they would be wrong in it; answered
    in a trace, they would be wrong after it."""
    from torch._inductor import utils as inductor_utils
    from torch.utils import _triton

    for module in (_triton, inductor_utils):
        for value in vars(module).values():
            if callable(getattr(value, "cache_clear", None)) and getattr(value, "__module__", None) == module.__name__:
                value.cache_clear()
