"""A trace is a transaction on the process.

The traced block runs the user's own code beside their program, and that
code may change any of torch's global settings: the default device or
dtype, grad mode, deterministic algorithms, backend flags, anomaly mode.
Whatever it changed, and whatever the trace itself changed, is as before
once the block is left, by an exception, KeyboardInterrupt or SystemExit
too. SETTINGS names every global a block can leave changed, each with how
to read it and how to write it back; ProcessState reads them all as the
block begins and writes back those that differ as it ends.
"""

import copy
import gc
import sys
from typing import Any, Callable, NamedTuple

import torch
import torch.utils._device

from . import _metamem


class Setting(NamedTuple):
    name: str
    get: Callable[[], Any]
    set: Callable[[Any], None]


def _attribute(owner, name, label):
    return Setting(label, lambda: getattr(owner, name), lambda value: setattr(owner, name, value))


def _default_device():
    """torch.set_default_device's state: its DeviceContext (a torch function
    mode, on the stack restored before it) and torch.utils._device's current
    device. Written back as they were: set_default_device would pop and push
    modes, and refuses a stack where the block left a DeviceContext of its
    own (`with torch.device(...)` entered and not exited)."""
    return getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None), torch.utils._device.CURRENT_DEVICE


def _set_default_device(value):
    torch._GLOBAL_DEVICE_CONTEXT.device_context, torch.utils._device.CURRENT_DEVICE = value


def _set_stack(length, pop, push):
    """A mode stack as it was: what the block entered and did not exit is
    popped, what it exited is pushed back, in order."""

    def set_modes(modes):
        while length():
            pop()
        for mode in modes:
            push(mode)

    return set_modes


def _function_modes():
    return tuple(torch.overrides._get_current_function_mode_stack())


def _dispatch_modes():
    return tuple(torch.utils._python_dispatch._get_current_dispatch_mode_stack())


_PRECISION_KEYS = [(backend, op) for backend in ("cuda", "mkldnn") for op in ("all", "matmul", "conv", "rnn")]
_PRECISION_KEYS.insert(0, ("generic", "all"))


def _float32_precision():
    C = torch._C
    return (torch.get_float32_matmul_precision(), C._get_cublas_allow_tf32(), C._get_cudnn_allow_tf32(),
            tuple(C._get_fp32_precision_getter(*key) for key in _PRECISION_KEYS))


def _set_float32_precision(value):
    """TF32 and matmul precision have two APIs over one state, and torch
    refuses to read it after a mix: the legacy setters first, then every
    backend's precision over them, leaves both as they were."""
    matmul, cublas_tf32, cudnn_tf32, precisions = value
    C = torch._C
    torch.set_float32_matmul_precision(matmul)
    C._set_cublas_allow_tf32(cublas_tf32)
    C._set_cudnn_allow_tf32(cudnn_tf32)
    for key, precision in zip(_PRECISION_KEYS, precisions):
        C._set_fp32_precision_setter(*key, precision)


def _autocast(device):
    return Setting(f"autocast on {device}",
                   lambda: (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)),
                   lambda value: (torch.set_autocast_enabled(device, value[0]),
                                  torch.set_autocast_dtype(device, value[1])))


def _sdp(name):
    backends = torch.backends.cuda
    return Setting(f"SDPA {name} backend", getattr(backends, f"{name}_sdp_enabled"),
                   getattr(backends, f"enable_{name}_sdp"))


def _process_group():
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized()


def _set_process_group(initialized):
    """A group the block made and left is destroyed; one it destroyed stays so."""
    if not initialized and _process_group():
        torch.distributed.destroy_process_group()


def _compiler_config(module_name):
    """A torch config module's settings (Inductor's, Dynamo's, ...) as the
    values set over their defaults, read from each entry's override and not
    through the module, which would warn of deprecated names and copy
    defaults in. A module not yet imported has none set: one the block
    imports and changes goes back to its defaults. Lists and dicts are copied,
    as code changes them in place (config.foo.append)."""
    from torch.utils._config_module import _UNSET_SENTINEL

    def overrides():
        module = sys.modules.get(module_name)
        if module is None:
            return {}
        set_ = ((name, entry.user_override.get()) for name, entry in module._config.items() if entry.alias is None)
        return {name: copy.copy(value) for name, value in set_ if value is not _UNSET_SENTINEL}

    def set_overrides(saved):
        module = sys.modules[module_name]
        for name, entry in module._config.items():
            value = saved.get(name, _UNSET_SENTINEL)
            if entry.alias is None and not _same(entry.user_override.get(), value):
                entry.user_override.set(value)
                module._mark_get_dict_dirty(name)
        module._hash_dirty_var.set(True)

    return Setting(f"{module_name} settings", overrides, set_overrides)


def _triton_min_max():
    """Inductor's Triton code for minimum and maximum, which torchao's
    convert_to_float8_training replaces for the process (tl.where rather
    than tl.minimum(..., PropagateNan.ALL): torchao.float8._inductor_patch),
    and the flag by which torchao does it once. Another model compiled
    after the block would otherwise get other kernel sources than in a
    process of its own (and miss their autotune cache's entries). Where
    Inductor's code generator is imported in the block, there is nothing
    from before it to put back: importing it at every block would cost
    seconds."""
    codegen = sys.modules.get("torch._inductor.codegen.triton")
    patch = sys.modules.get("torchao.float8._inductor_patch")
    overrides = None if codegen is None else {name: codegen.TritonOverrides.__dict__[name]
                                              for name in ("minimum", "maximum")}
    return overrides, getattr(patch, "_PATCHED", False)


def _set_triton_min_max(saved):
    overrides, patched = saved
    if overrides is not None:
        for name, value in overrides.items():
            setattr(sys.modules["torch._inductor.codegen.triton"].TritonOverrides, name, value)
    if "torchao.float8._inductor_patch" in sys.modules:
        sys.modules["torchao.float8._inductor_patch"]._PATCHED = patched


def _garbage_collector(enabled):
    if enabled:
        gc.enable()
    else:
        gc.disable()


def _print_options():
    return dict(vars(torch._tensor_str.PRINT_OPTS))


def _set_print_options(options):
    vars(torch._tensor_str.PRINT_OPTS).update(options)


# Restored in this order where they differ: the mode stacks before the
# default device (its DeviceContext is one of the torch function modes), the
# thread's dispatch keys and autograd modes last (autocast, inference mode
# and the trace's own keys live there).
SETTINGS = [
    Setting("torch function modes", _function_modes,
            _set_stack(torch._C._len_torch_function_stack, torch._C._pop_torch_function_stack,
                       torch._C._push_on_torch_function_stack)),
    Setting("default device", _default_device, _set_default_device),
    Setting("torch dispatch modes", _dispatch_modes,
            _set_stack(torch._C._len_torch_dispatch_stack, torch._C._pop_torch_dispatch_stack,
                       torch._C._push_on_torch_dispatch_stack)),
    Setting("default dtype", torch.get_default_dtype, torch.set_default_dtype),
    Setting("deterministic algorithms",
            lambda: (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled()),
            lambda value: torch.use_deterministic_algorithms(value[0], warn_only=value[1])),
    Setting("deterministic fill of uninitialized memory", torch._C._get_deterministic_fill_uninitialized_memory,
            torch._C._set_deterministic_fill_uninitialized_memory),
    Setting("intra-op threads", torch.get_num_threads, torch.set_num_threads),
    Setting("float32 matmul precision and TF32", _float32_precision, _set_float32_precision),
    _attribute(torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction",
               "cuBLAS fp16 reduced-precision reduction"),
    _attribute(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction",
               "cuBLAS bf16 reduced-precision reduction"),
    _attribute(torch.backends.cuda.matmul, "allow_fp16_accumulation", "cuBLAS fp16 accumulation"),
    Setting("preferred linear algebra library", torch.backends.cuda.preferred_linalg_library,
            torch.backends.cuda.preferred_linalg_library),
    Setting("preferred BLAS library", torch.backends.cuda.preferred_blas_library,
            torch.backends.cuda.preferred_blas_library),
    _attribute(torch.backends.cudnn, "enabled", "cuDNN enabled"),
    _attribute(torch.backends.cudnn, "benchmark", "cuDNN benchmark"),
    _attribute(torch.backends.cudnn, "benchmark_limit", "cuDNN benchmark limit"),
    _attribute(torch.backends.cudnn, "deterministic", "cuDNN deterministic"),
    _attribute(torch.backends.mkldnn, "enabled", "oneDNN enabled"),
    _attribute(torch.backends.opt_einsum, "enabled", "opt_einsum enabled"),
    _attribute(torch.backends.opt_einsum, "strategy", "opt_einsum strategy"),
    _sdp("flash"),
    _sdp("mem_efficient"),
    _sdp("math"),
    _sdp("cudnn"),
    Setting("SDPA math fp16/bf16 reduction", torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed,
            torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp),
    Setting("anomaly mode", lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
            lambda value: torch.set_anomaly_enabled(*value)),
    _autocast("cpu"),
    _autocast("cuda"),
    Setting("autocast cache", torch.is_autocast_cache_enabled, torch.set_autocast_cache_enabled),
    Setting("warn always", torch.is_warn_always_enabled, torch.set_warn_always),
    Setting("print options", _print_options, _set_print_options),
    Setting("CPU random number generator", torch.random.get_rng_state, torch.random.set_rng_state),
    # torch.manual_seed in a fake-cpu block queues CUDA's seeding for the first real CUDA call.
    Setting("torch.cuda's queued lazy calls", lambda: list(torch.cuda._queued_calls),
            lambda calls: torch.cuda._queued_calls.__setitem__(slice(None), calls)),
    Setting("default process group", _process_group, _set_process_group),
    # torch.compile's settings: torchtitan's Trainer and float8 converter,
    # for instance, set Inductor's and Dynamo's for the process.
    _compiler_config("torch._dynamo.config"),
    _compiler_config("torch._inductor.config"),
    _compiler_config("torch._functorch.config"),
    _compiler_config("torch.fx.experimental._config"),
    Setting("Inductor's Triton minimum and maximum", _triton_min_max, _set_triton_min_max),
    Setting("garbage collector", gc.isenabled, _garbage_collector),
    _attribute(sys, "excepthook", "sys.excepthook"),
    Setting("dispatch keys and autograd modes (grad, inference, forward AD)", _metamem.ThreadState,
            lambda state: state.restore()),
]


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(x is y or _same(x, y) for x, y in zip(a, b))
    return a == b


class ProcessState:
    """Every global of SETTINGS, read on entry and written back on exit
    where it differs."""

    def __enter__(self):
        self.saved = [(setting, setting.get()) for setting in SETTINGS]
        return self

    def __exit__(self, *exc):
        failed = []
        for setting, value in self.saved:
            try:
                if not _same(setting.get(), value):
                    setting.set(value)
            except Exception as error:  # one setting that cannot be written back stops no other
                failed.append(f"{setting.name}: {error}")
        if failed and exc[0] is None:
            raise RuntimeError("metamem: the trace could not restore " + "; ".join(failed))
