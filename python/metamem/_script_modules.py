"""Loaded ScriptModules (torch.jit.load) in a trace's block, as the block's
own nn.Modules: loaded and moved there, their tensors traced."""

import torch

from . import _metamem


def patch_script_modules(patches, replacements, on_host):
    """torch.jit.load and a ScriptModule's .to(), .cuda() in a block.

    torch's loader sets each tensor's storage to the one it read from the
    file, a real one, which a traced tensor cannot take: the file is read
    outside the trace onto the CPU (not the step's memory), and each of the
    module's tensors is then made in the trace, of its shape, where the load
    would have put it: `map_location`, else where a factory naming no device
    stands (`on_host`: the host on a fake cpu and with
    host_tensors="host", the traced GPU otherwise; a file saved on a GPU
    loads there unless its run keeps host tensors on the host, where
    `.cuda()` moves it as usual). The graphs' tensor constants stay on the
    host.

    Module._apply moves a parameter it cannot move in place (a traced tensor
    is not a real one's kind) by making a new Parameter, and asserts that the
    old one was: a ScriptModule's are plain tensors. A ScriptModule moves
    each of its tensors into its slot, requiring grad as it did; those of a
    module loaded before the block are put back as it ends (`replacements`)."""
    load = torch.jit.load

    def traced_load(f, map_location=None, _extra_files=None, **kwargs):
        with _metamem.OutsideTrace(), _metamem.UncountedCpu():
            module = load(f, map_location="cpu", _extra_files=_extra_files, **kwargs)
        if isinstance(map_location, (str, torch.device)):
            device = torch.device(map_location)
        else:
            device = torch.device("cpu" if on_host else "cuda")
        def made(tensor):
            return torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device=device)
        return _moved(module, made, put=lambda store, name, tensor: store.__setitem__(name, tensor))

    def apply(self, fn, recurse=True):
        return _moved(self, fn, recurse, put=replacements.put)

    patches.set(torch.jit, "load", traced_load)
    patches.set(torch.jit.RecursiveScriptModule, "_apply", apply)


def _moved(module, fn, recurse=True, *, put):
    """The ScriptModule with each parameter and buffer (its submodules' too)
    replaced by fn(tensor), each made once, requiring grad as it did:
    put(store, name, replacement) for each that fn does not return as it
    is (a real tensor that stays on the CPU, a traced one on its device)."""
    made = {}
    for sub in (module.modules() if recurse else [module]):
        for store in (sub._parameters, sub._buffers):
            for name, tensor in list(store.items()):
                if tensor is None:
                    continue
                if id(tensor) not in made:
                    with torch.no_grad():
                        made[id(tensor)] = (tensor, fn(tensor).requires_grad_(tensor.requires_grad))
                if made[id(tensor)][1] is not tensor:
                    put(store, name, made[id(tensor)][1])
    return module
