"""Real torch on metamem's fake GPU, asked from a trace.

The fake GPU (oracle/: a CUDA runtime, cuBLAS and driver preloaded into a
child Python) runs the wheel's own torch, cuDNN among its libraries, with
kernels that return at once: torch's caching allocator sees what real torch
allocates, cuDNN's own heuristics choose its engines and size their
workspaces for the GPU named. A trace given the fake GPU's folder
(trace(fake_gpu=...)) asks it, once per distinct call, what a kernel whose
temporaries metamem does not model allocates inside (convolutions and
RNNs, whose cuDNN engines, workspaces and reserve spaces only cuDNN knows)
and follows that recording.

The child (_fake_gpu_server.py) and the recordings are C++'s
(estimator/FakeGpuRecordings.cpp), which the C++ CLI uses too. PROLOGUE,
environment() and command() start such a child for the tests' measurements
of real torch on the fake GPU.
"""

import json
import os
import sys

from . import _metamem

# The child's program (started by estimator/FakeGpuRecordings.cpp for a
# trace's recordings).
SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_fake_gpu_server.py")

# The first lines of a program run by command(): the fake device made the
# GPU `sys.argv[2]` names (metamem's table, as JSON), through the preloaded
# runtime at `sys.argv[1]`; json and sys imported.
PROLOGUE = f"import ctypes, json, runpy, sys\nrunpy.run_path({SERVER!r})['make_gpu'](sys.argv[1], sys.argv[2])\n"

RUNTIME = "libmetamem_fake_cuda_preload.so"


def environment(folder, torch_site=None):
    """The environment of a child Python whose CUDA is the fake GPU of
    `folder` (with the torch of the folder `torch_site` first, if given)."""
    env = dict(variable.split("=", 1) for variable in _metamem.fake_gpu_environment(folder))
    if torch_site:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (torch_site, env.get("PYTHONPATH"))))
    return env


def command(folder, gpu, program, *args):
    """argv of a child Python running `program` on the fake GPU `gpu`."""
    return [sys.executable, "-c", program, os.path.join(folder, RUNTIME), json.dumps(gpu), *args]


def recordings(folder, gpu):
    """The fake GPU `folder`'s recordings made the GPU `gpu` (a key of
    metamem's table): a trace inside `with` follows them. ValueError if
    `folder` holds no fake GPU."""
    return _metamem.FakeGpuRecordings(folder, gpu, sys.executable, SERVER)
