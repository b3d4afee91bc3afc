"""The child that answers a trace's questions with real torch on the fake GPU.

Run as `python _fake_gpu_server.py RUNTIME GPU`: RUNTIME is the fake CUDA
runtime preloaded into this process (libmetamem_fake_cuda_preload.so), GPU
metamem's table entry of the GPU to be, as JSON. It does not import
metamem: both front ends start it (estimator/FakeGpuRecordings.cpp), the
C++ one with no metamem package loaded.

It serves one request a line: an op and its arguments (tensors as sizes,
strides and dtype), run on the fake GPU with no cuBLAS workspace kept (so
that a first cuBLAS call shows the workspace it makes); it answers the
allocations and frees inside, where it emptied the allocator's cache, and
the addresses of the op's returns, or the error real torch raised (with
cuDNN's benchmark on, the same of the call made again, "repeat", which
runs the engine the first one found); to {"facts": true}, what torch's
CUDA library says of cuDNN. (On a stream of its own, cuDNN's convolutions stop
the fake GPU: SIGSEGV.)
"""

import ctypes
import json
import os
import sys


class _FakeGpu(ctypes.Structure):
    """oracle/FakeCudaRuntime.h's metamem_fake_gpu, field by field."""
    _fields_ = [("name", ctypes.c_char_p), ("total_memory", ctypes.c_size_t), ("major", ctypes.c_int),
                ("minor", ctypes.c_int), ("multi_processor_count", ctypes.c_int), ("L2_cache_size", ctypes.c_int),
                ("max_threads_per_multi_processor", ctypes.c_int), ("shared_memory_per_block_optin", ctypes.c_int),
                ("shared_memory_per_multiprocessor", ctypes.c_int), ("clock_rate", ctypes.c_int),
                ("memory_clock_rate", ctypes.c_int), ("memory_bus_width", ctypes.c_int),
                ("max_active_clusters", ctypes.POINTER(ctypes.c_int)), ("largest_cluster", ctypes.c_int)]


def make_gpu(runtime, gpu):
    """The fake device made the GPU `gpu` (JSON) through the preloaded runtime."""
    gpu = json.loads(gpu)
    clusters = gpu["max_active_clusters"]
    numbers = {name: gpu[name] for name, _ in _FakeGpu._fields_[1:-2]}
    device = _FakeGpu(gpu["name"].encode(), **numbers, max_active_clusters=(ctypes.c_int * len(clusters))(*clusters),
                      largest_cluster=len(clusters))
    ctypes.CDLL(runtime).metamem_fake_cuda_set_device(ctypes.byref(device))


def _facts():
    """What torch's CUDA library says of its cuDNN and CUDA runtime, as
    libtorch's CUDA hooks report them (versions as integers: 92400)."""
    import torch

    major, minor, patch = torch._C._cudnn.getCompileVersion()
    return {"cudnn": major * 10000 + minor * 100 + patch, "cudnn_runtime": torch._C._cudnn.getVersionInt(),
            "cudart": torch._C._cuda_getCompiledVersion()}


def _answer(request):
    import torch

    def made(value):
        if isinstance(value, dict) and "device" in value:
            return torch.device(value["device"])
        if isinstance(value, dict):
            tensor = torch.empty_strided(value["size"], value["stride"], dtype=getattr(torch, value["dtype"]),
                                         device="cpu" if value["on_host"] else "cuda")
            if value["on_host"]:  # zeros, as the fake GPU reads: the host computes on them (index_put's range check)
                tensor.untyped_storage().fill_(0)
            return tensor
        return [made(item) for item in value] if isinstance(value, list) else value

    for flag, value in request["cudnn"].items():
        setattr(torch.backends.cudnn, flag, value)
    algorithms = request["algorithms"]
    torch.use_deterministic_algorithms(algorithms["deterministic"], warn_only=algorithms["warn_only"])
    torch._C._set_deterministic_fill_uninitialized_memory(algorithms["fill_uninitialized_memory"])
    name, _, overload = request["op"].split("::")[1].partition(".")
    op = getattr(getattr(torch.ops.aten, name), overload or "default")
    schema = op._schema.arguments
    arguments = [made(a) for a, s in zip(request["arguments"], schema) if not s.kwarg_only]
    options = {s.name: made(a) for a, s in zip(request["arguments"], schema) if s.kwarg_only}
    first = _recorded(op, arguments, options)
    if "error" in first or not request["cudnn"]["benchmark"]:
        return first
    # The first call searches for the fastest engine and empties the cache;
    # torch keeps the engine it found for the process: a call made again
    # runs it at once.
    first["repeat"] = _recorded(op, arguments, options)
    return first


def _cache_a_segment():
    """A block freed into a segment of its own on a side stream (made again
    where the last call's emptied cache gave it back), which no op's request
    (on the default stream) takes: the allocator gives it back only where
    its cache is emptied."""
    import torch

    global _SIDE
    if _SIDE is None:
        _SIDE = torch.cuda.Stream()
    with torch.cuda.stream(_SIDE):
        torch.empty(1, device="cuda")


_SIDE = None


def _recorded(op, arguments, options):
    """One call: its allocations and frees, where it emptied the cache (a
    segment given back: the allocator gives segments back only then, and
    the side stream's free one is there to be given back the first time),
    the addresses of its returns; or real torch's error."""
    import torch

    torch._C._cuda_clearCublasWorkspaces()
    _cache_a_segment()
    torch.cuda.memory._record_memory_history(max_entries=1 << 16)
    try:
        out = op(*arguments, **options)
    except Exception as error:  # the call's own error, as the traced code meets it
        torch.cuda.memory._record_memory_history(enabled=None)
        return {"error": str(error).strip().splitlines()[0]}
    events = torch.cuda.memory._snapshot()["device_traces"][0]
    torch.cuda.memory._record_memory_history(enabled=None)
    returns = out if isinstance(out, tuple) else (out,)

    def address(r):  # a list of returns (cuDNN's RNN weight gradients): each of its buffers
        if isinstance(r, list):
            return [address(t) for t in r]
        return r.untyped_storage().data_ptr() if isinstance(r, torch.Tensor) and r.numel() else 0

    recorded = []
    for e in events:
        if e["action"] in ("alloc", "free_requested"):
            recorded.append([e["action"], e["addr"], e["size"]])
        elif e["action"] == "segment_free" and recorded[-1:] != [["empty_cache", 0, 0]]:
            recorded.append(["empty_cache", 0, 0])
    tensors = [r if isinstance(r, torch.Tensor) else None for r in returns]
    return {"events": recorded,
            "returns": [address(r) for r in returns],
            "sizes": [list(t.shape) if t is not None else [] for t in tensors],
            "strides": [list(t.stride()) if t is not None else [] for t in tensors]}


def serve():
    for line in sys.stdin:
        request = json.loads(line)
        print("@@" + json.dumps(_facts() if "facts" in request else _answer(request)), flush=True)


if __name__ == "__main__":
    make_gpu(sys.argv[1], sys.argv[2])
    serve()
    # Its parent is done (stdin closed): leave at once, as torch can abort
    # as a process exits after a backward on the GPU (pytorch/pytorch#38228).
    sys.stdout.flush()
    os._exit(0)
