"""Real torch on metamem's fake GPU, asked from a trace.

The fake GPU (oracle/: a CUDA runtime, cuBLAS and driver preloaded into a
child Python) runs the wheel's own torch, cuDNN among its libraries, with
kernels that return at once: torch's caching allocator sees what real torch
allocates, cuDNN's own heuristics choose its engines and size their
workspaces for the GPU named. A trace given the fake GPU's folder
(trace(fake_gpu=...)) asks it, once per distinct call, what a kernel whose
temporaries metamem does not model allocates inside (RECORDED_OPS:
convolutions and RNNs, whose cuDNN engines, workspaces and reserve spaces
only cuDNN knows) and follows that recording.

PROLOGUE and environment() start such a child; the tests' measurements of
real torch on the fake GPU use them too.
"""

import atexit
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading

import torch

# The child's first lines: the fake device made the GPU `sys.argv[2]`
# names (metamem's table, as JSON), through the preloaded runtime at
# `sys.argv[1]`.
PROLOGUE = textwrap.dedent("""
    import ctypes, json, sys
    gpu = json.loads(sys.argv[2])
    ctypes.CDLL(sys.argv[1]).metamem_fake_cuda_set_device(
        gpu["name"].encode(), ctypes.c_size_t(gpu["total_memory"]), gpu["major"], gpu["minor"],
        gpu["multi_processor_count"], gpu["L2_cache_size"], gpu["max_threads_per_multi_processor"],
        gpu["shared_memory_per_block_optin"], gpu["shared_memory_per_multiprocessor"])
""")

RUNTIME = "libmetamem_fake_cuda_preload.so"

# The ops a trace with a fake GPU takes from its recordings.
RECORDED_OPS = ("aten::convolution", "aten::convolution_backward", "aten::_cudnn_rnn", "aten::_cudnn_rnn_backward",
                "aten::_cudnn_init_dropout_state")

# cuDNN's flags that choose its engines.
_CUDNN_FLAGS = ("enabled", "benchmark", "deterministic", "allow_tf32")


def is_fake_gpu(folder):
    return os.path.exists(os.path.join(folder, RUNTIME))


def environment(folder, torch_site=None):
    """The environment of a child Python whose CUDA is the fake GPU of
    `folder` (with the torch of the folder `torch_site` first, if given)."""
    env = dict(os.environ)
    if torch_site:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (torch_site, env.get("PYTHONPATH"))))
    env["LD_PRELOAD"] = " ".join(os.path.join(folder, lib) for lib in (RUNTIME, "libmetamem_fake_cublas.so"))
    env["LD_LIBRARY_PATH"] = os.path.join(folder, "driver") + ":" + env.get("LD_LIBRARY_PATH", "")
    return env


def command(folder, gpu, program, *args):
    """argv of a child Python running `program` on the fake GPU `gpu`."""
    return [sys.executable, "-c", program, os.path.join(folder, RUNTIME), json.dumps(gpu), *args]


# Serves one request a line: an op and its arguments (tensors as sizes,
# strides and dtype), run on the fake GPU with no cuBLAS workspace kept (so
# that a first cuBLAS call shows the workspace it makes); answers the
# allocations and frees inside and the addresses of the op's returns, or
# the error real torch raised. (On a stream of its own, cuDNN's
# convolutions stop the fake GPU: SIGSEGV.)
_SERVER = PROLOGUE + textwrap.dedent("""
    import torch

    def made(value):
        if isinstance(value, dict) and "device" in value:
            return torch.device(value["device"])
        if isinstance(value, dict):
            return torch.empty_strided(value["size"], value["stride"], dtype=getattr(torch, value["dtype"]),
                                       device="cuda")
        return [made(item) for item in value] if isinstance(value, list) else value

    for line in sys.stdin:
        request = json.loads(line)
        for flag, value in request["cudnn"].items():
            setattr(torch.backends.cudnn, flag, value)
        name, _, overload = request["op"].split("::")[1].partition(".")
        op = getattr(getattr(torch.ops.aten, name), overload or "default")
        schema = op._schema.arguments
        arguments = [made(a) for a, s in zip(request["arguments"], schema) if not s.kwarg_only]
        options = {s.name: made(a) for a, s in zip(request["arguments"], schema) if s.kwarg_only}
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.memory._record_memory_history(max_entries=1 << 16)
        try:
            out = op(*arguments, **options)
        except Exception as error:  # the call's own error, as the traced code meets it
            torch.cuda.memory._record_memory_history(enabled=None)
            print("@@" + json.dumps({"error": str(error).strip().splitlines()[0]}), flush=True)
            continue
        events = torch.cuda.memory._snapshot()["device_traces"][0]
        torch.cuda.memory._record_memory_history(enabled=None)
        returns = out if isinstance(out, tuple) else (out,)

        def address(r):  # a list of returns (cuDNN's RNN weight gradients): each of its buffers
            if isinstance(r, list):
                return [address(t) for t in r]
            return r.untyped_storage().data_ptr() if isinstance(r, torch.Tensor) and r.numel() else 0

        tensors = [r if isinstance(r, torch.Tensor) else None for r in returns]
        answer = {"events": [[e["action"], e["addr"], e["size"]] for e in events
                             if e["action"] in ("alloc", "free_requested")],
                  "returns": [address(r) for r in returns],
                  "sizes": [list(t.shape) if t is not None else [] for t in tensors],
                  "strides": [list(t.stride()) if t is not None else [] for t in tensors]}
        del out, returns, arguments, options
        print("@@" + json.dumps(answer), flush=True)
""")


def _described(value):
    if isinstance(value, torch.Tensor):
        return {"size": list(value.shape), "stride": list(value.stride()), "dtype": str(value.dtype).split(".")[1]}
    if isinstance(value, (list, tuple)):
        return [_described(item) for item in value]
    if isinstance(value, torch.device):  # a factory's (cuDNN's dropout state): the child's one GPU
        return {"device": "cuda"}
    return value


def plan_of(recording):
    """The recording as a plan: its steps, ("output", r) where return r is
    made, ("make", bytes) for each temporary, ("free", piece) as it is
    freed, and ("cublas", 0) where a workspace was made and kept that no
    return holds: cuBLAS's, at the kernel's first call of it on a stream;
    and each return's sizes and strides."""
    if "error" in recording:  # real torch's, raised where the traced code calls it
        raise RuntimeError(recording["error"])
    events = recording["events"]
    returns = {}  # a list's buffers are made as one step, where its first is
    for r, addresses in enumerate(recording["returns"]):
        for address in addresses if isinstance(addresses, list) else [addresses]:
            if address:
                returns[address] = r
    freed = set()
    kept = [False] * len(events)
    for i in reversed(range(len(events))):
        action, address, _ = events[i]
        if action == "alloc":
            kept[i] = address not in freed
            freed.discard(address)
        else:
            freed.add(address)
    steps, pieces, made, placed = [], {}, 0, set()
    for i, (action, address, size) in enumerate(events):
        if action != "alloc":
            steps.append(("free", pieces.pop(address)))
        elif kept[i] and address in returns:
            r = returns.pop(address)
            if r not in placed:
                placed.add(r)
                steps.append(("output", r))
        elif kept[i]:
            steps.append(("cublas", 0))
        else:
            pieces[address], made = made, made + 1
            steps.append(("make", size))
    if sum(step[0] == "cublas" for step in steps) > 1:
        raise RuntimeError(f"metamem: the fake GPU's recording keeps more than a cuBLAS workspace: {recording}")
    return steps, recording["sizes"], recording["strides"]


class KernelRecordings:
    """The fake GPU of `folder` made the GPU `gpu` (metamem's table entry),
    in a child kept while this process lives, and its recordings by call."""

    def __init__(self, folder, gpu):
        self.folder, self.gpu = os.path.abspath(folder), gpu  # the child's paths, wherever the step changes to
        self._recordings = {}
        self._child = None
        self._lock = threading.Lock()  # one request at a time (backward asks from autograd's thread)

    def plan(self, op, arguments):
        request = {"op": op, "arguments": _described(arguments),
                   "cudnn": {flag: getattr(torch.backends.cudnn, flag) for flag in _CUDNN_FLAGS}}
        key = json.dumps(request, sort_keys=True)
        with self._lock:
            if key not in self._recordings:
                self._recordings[key] = self._ask(key)
        return plan_of(self._recordings[key])

    def _ask(self, line):
        if self._child is None or self._child.poll() is not None:
            self._errors = tempfile.TemporaryFile(mode="w+")
            self._child = subprocess.Popen(command(self.folder, self.gpu, _SERVER), env=environment(self.folder),
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._errors,
                                           text=True)
            atexit.register(self._child.kill)
        self._child.stdin.write(line + "\n")
        self._child.stdin.flush()
        for answer in self._child.stdout:
            if answer.startswith("@@"):
                return json.loads(answer[2:])
        self._errors.seek(0)
        raise RuntimeError(f"metamem: the fake GPU of {self.folder} stopped on {line}:\n{self._errors.read()[-3000:]}")


_RECORDINGS = {}


def recordings(folder, gpu):
    """The KernelRecordings of the fake GPU `folder` made `gpu`, one per
    process and GPU."""
    if not is_fake_gpu(folder):
        raise ValueError(f"fake_gpu={folder!r} holds no fake GPU ({RUNTIME}; built in build/oracle)")
    key = (os.path.abspath(folder), json.dumps(gpu, sort_keys=True))
    if key not in _RECORDINGS:
        _RECORDINGS[key] = KernelRecordings(folder, gpu)
    return _RECORDINGS[key]
