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

A request that also names a temporary of the call ("workspace": its number
among the blocks the call frees, from 0) and the workspaces an allocator
refused it ("refused", bytes, in the order asked) is answered with the
bytes that temporary has where the fake GPU refuses those: cuDNN's next
engine's workspace, as torch's convolutions try engines in turn when the
caching allocator runs out ({"bytes": null} where none is known).
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
    global _RUNTIME
    _RUNTIME = ctypes.CDLL(runtime)
    _RUNTIME.metamem_fake_cuda_set_device(ctypes.byref(device))
    _RUNTIME.metamem_fake_cuda_refuse_mallocs.argtypes = [ctypes.c_size_t, ctypes.c_size_t]


_RUNTIME = None


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
    if "workspace" in request:
        return {"bytes": _fallback(op, arguments, options, request["workspace"], request["refused"])}
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


def _history(op, arguments, options, refusing=None):
    """What the caching allocator's history holds of one call, and its
    returns; or real torch's error, as the traced code meets it. With
    `refusing` (calls, bytes), cudaMalloc refuses segments of at least that
    many bytes from that many calls into the call on, until it grants one."""
    import torch

    torch._C._cuda_clearCublasWorkspaces()
    _cache_a_segment()
    torch.cuda.memory._record_memory_history(max_entries=1 << 16)
    if refusing:
        _RUNTIME.metamem_fake_cuda_refuse_mallocs(*refusing)
    try:
        out = op(*arguments, **options)
    except Exception as error:
        return None, {"error": str(error).strip().splitlines()[0]}
    finally:
        if refusing:
            _RUNTIME.metamem_fake_cuda_refuse_mallocs(0, 0)
        events = torch.cuda.memory._snapshot()["device_traces"][0]
        torch.cuda.memory._record_memory_history(enabled=None)
    return events, out


def _recorded(op, arguments, options):
    """One call: its allocations and frees, where it emptied the cache (a
    segment given back: the allocator gives segments back only then, and
    the side stream's free one is there to be given back the first time),
    the addresses of its returns; or real torch's error."""
    import torch

    events, out = _history(op, arguments, options)
    if events is None:
        return out
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


def _segment(requested):
    """The segment c10's caching allocator (default settings) asks cudaMalloc
    for to hold a request of `requested` bytes; 0 for a small-pool one."""
    rounded = max(512, -(-requested // 512) * 512)
    if rounded <= 1 << 20:
        return 0
    return 20 << 20 if rounded < 10 << 20 else -(-rounded // (2 << 20)) * (2 << 20)


def _temporaries(events):
    """The blocks a call makes and frees, in order, as (index in `events`,
    bytes): the pieces of its plan (meta/KernelRecording.cpp's plan_of)."""
    freed, found = set(), []
    for i in reversed(range(len(events))):
        if events[i]["action"] == "free_requested":
            freed.add(events[i]["addr"])
        elif events[i]["action"] == "alloc" and events[i]["addr"] in freed:
            freed.discard(events[i]["addr"])
            found.append((i, events[i]["size"]))
    return found[::-1]


def _fallback(op, arguments, options, workspace, refused):
    """The bytes of the call's temporary `workspace` where cudaMalloc refuses
    every segment as large as the last of `refused` needs from that
    temporary's request on (its first engine's, and each next one's, until
    one is granted): the workspace of the first engine cuDNN's heuristics
    list whose segment is smaller; None where none is known (a small-pool
    request, one the allocator took from its cache, an error, or a call in
    which the refusal also moved other blocks).

    Both runs are made on a thread of their own, from an empty cache:
    torch keeps the engine a convolution ran per thread (Conv_v8.cpp's
    thread_local benchmark_cache), so a thread's first call asks cuDNN's
    heuristics afresh, and the engine it falls back on is not kept for the
    server's later calls. Each thread is waited for until it is gone: join()
    returns before a thread's C++ thread_locals are destroyed, where torch
    gives the thread's cuDNN handle back to its pool, and a next thread that
    started before then made a handle of its own, whose cudaMalloc (outside
    the caching allocator) moved the refusal onto the wrong call: under load
    2 in 300 answers were None, and a trace kept a workspace the GPU cannot
    hold."""
    import threading
    import time
    import torch

    at_least = _segment(refused[-1])
    if at_least == 0:
        return None

    def on_a_thread(run):
        result = []
        thread = threading.Thread(target=lambda: result.append(run()))
        thread.start()
        thread.join()
        # Gone in microseconds; a task of that id still there after a
        # second is a later thread that the kernel gave the id again.
        gone_by = time.monotonic() + 1
        while os.path.exists(f"/proc/self/task/{thread.native_id}") and time.monotonic() < gone_by:
            time.sleep(1e-4)
        return result[0]

    def history(refusing=None):
        torch.cuda.empty_cache()
        return _history(op, arguments, options, refusing)[0]

    plain = on_a_thread(history)
    temporaries = _temporaries(plain or [])
    if workspace >= len(temporaries):
        return None
    at = temporaries[workspace][0]
    if at == 0 or plain[at - 1]["action"] != "segment_alloc":  # taken from the cache: no cudaMalloc to refuse
        return None
    mallocs_before = sum(e["action"] == "segment_alloc" for e in plain[:at - 1])
    moved = on_a_thread(lambda: history((mallocs_before, at_least)))
    if moved is None:
        return None
    # The refusal may only change that temporary: every other block the
    # same, in the same order.
    now = _temporaries(moved)
    if len(now) == len(temporaries):
        bytes_ = now[workspace][1]
        same = _blocks(plain, temporaries[workspace][0]) == _blocks(moved, now[workspace][0])
    else:  # an engine with no workspace
        bytes_ = 0
        same = _blocks(plain, temporaries[workspace][0], keep=False) == _blocks(moved, None)
    return bytes_ if same and _segment(bytes_) < at_least else None


def _blocks(events, temporary, keep=True):
    """The allocations and frees of `events` as (action, bytes), the block
    allocated at index `temporary` and its free as (action, "temporary")
    (left out with `keep` false)."""
    blocks, address = [], None
    for i, e in enumerate(events):
        if e["action"] not in ("alloc", "free_requested"):
            continue
        if i == temporary:
            address = e["addr"]
        elif not (address == e["addr"] and e["action"] == "free_requested"):
            blocks.append((e["action"], e["size"]))
            continue
        else:
            address = None
        if keep:
            blocks.append((e["action"], "temporary"))
    return blocks


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
