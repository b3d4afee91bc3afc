"""Which ops refuse tensors on two devices on a GPU, as torch's
native_functions.yaml (shipped in the wheel's torchgen) declares it: a
trace that keeps host tensors on the host (host_tensors="host") refuses a
step that mixes a host tensor into such an op, as a GPU run stops there.

An entry without `device_check: NoCheck` gets torchgen's check in its CUDA
kernel: every positional and out tensor on one device (an op without a
CUDA kernel, a composite, leaves it to the ops it calls). One marked
`NoCheck   # TensorIterator` checks in TensorIterator, which takes a 0-dim
host tensor as a scalar; of those, only pointwise ops are checked here
(index, for one, takes host indices for device tensors), and index_put,
which takes host indices but checks its values. Other `NoCheck` ops
(copies, foreach ops, CTC losses) take tensors on both."""

import functools
import importlib.util
import os
import re

import torch

from . import _metamem

# Composites a trace runs whole (its own kernel) whose decomposition checks
# on a GPU: embedding's index_select.
_CHECKED_COMPOSITES = ["aten::embedding"]

# `NoCheck` ops whose CUDA kernels check their values' device against self's
# (host indices allowed): index_put and what `x[i] = v` reaches.
_VALUES_CHECKED = ["aten::index_put", "aten::index_put_", "aten::_index_put_impl_", "aten::_unsafe_index_put"]


@functools.lru_cache(maxsize=None)
def install():
    """Tells the trace's kernels the checks, once: they stay for the
    process. Without torchgen's file, nothing is checked."""
    torchgen = importlib.util.find_spec("torchgen")
    if torchgen is None or not torchgen.submodule_search_locations:
        return
    path = os.path.join(torchgen.submodule_search_locations[0], "packaged", "ATen", "native",
                        "native_functions.yaml")
    if not os.path.exists(path):
        return
    with open(path) as declarations:
        entries = re.split(r"^- func: ", declarations.read(), flags=re.M)[1:]
    same_device, pointwise = list(_CHECKED_COMPOSITES), []
    for entry in entries:
        name = "aten::" + entry[:entry.index("(")]
        check = re.search(r"^\s+device_check:\s*NoCheck(.*)$", entry, flags=re.M)
        if check is None:
            if torch._C._dispatch_has_kernel_for_dispatch_key(name, "CUDA"):
                same_device.append(name)
        elif "TensorIterator" in check.group(1) and re.search(r"^\s+tags:.*\bpointwise\b", entry, flags=re.M):
            pointwise.append(name)
    _metamem.set_device_checks(same_device, pointwise, _VALUES_CHECKED)
