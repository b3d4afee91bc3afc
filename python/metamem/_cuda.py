"""What torch.cuda answers while a trace runs on fake cuda.

A training script asks torch.cuda about its device, seeds its generator,
synchronizes, times with events, reads memory statistics and checkpoints
with its RNG state. Without a GPU, torch.cuda's Python functions reach the
CUDA runtime, which has no device; inside a fake-cuda trace they answer for
one GPU of the chosen kind: its properties from metamem's GPU table, memory
statistics from the simulated caching allocator at that moment of the
trace, streams and events that complete at once, a generator that keeps a
seed and an offset as CUDA's does. Everything patched is put back when the
trace ends.
"""

import os
import sys

import torch

from . import _metamem

_MISSING = object()


class Patches:
    """Attributes set for a while and put back in reverse order."""

    def __init__(self):
        self.saved = []

    def set(self, owner, name, value, restore=_MISSING):
        """owner.name = value until restore(); then what it was, or
        `restore` where given."""
        self.saved.append((owner, name, owner.__dict__.get(name, _MISSING) if restore is _MISSING else restore))
        setattr(owner, name, value)

    def original(self, owner, name):
        """owner.name as it was before these patches."""
        for patched, patched_name, value in self.saved:
            if patched is owner and patched_name == name and value is not _MISSING:
                return value
        return getattr(owner, name)

    def restore(self):
        for owner, name, value in reversed(self.saved):
            if value is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
        self.saved.clear()


class DeviceProperties:
    """torch.cuda.get_device_properties() of the traced GPU (torch's own
    class cannot be made from Python)."""

    warp_size = 32
    max_threads_per_block = 1024
    shared_memory_per_block = 48 * 1024
    clock_rate = memory_clock_rate = memory_bus_width = 0  # as the fake GPU answers: nothing here is timed
    is_integrated = 0
    is_multi_gpu_board = 0
    regs_per_multiprocessor = 65536
    gcnArchName = "NA"
    pci_bus_id = pci_device_id = pci_domain_id = 0

    def __init__(self, gpu):
        self.name = gpu["name"]
        self.major = gpu["major"]
        self.minor = gpu["minor"]
        self.total_memory = gpu["total_memory"]
        self.multi_processor_count = gpu["multi_processor_count"]
        self.L2_cache_size = gpu["L2_cache_size"]
        self.max_threads_per_multi_processor = gpu["max_threads_per_multi_processor"]
        self.shared_memory_per_block_optin = gpu["shared_memory_per_block_optin"]
        self.shared_memory_per_multiprocessor = gpu["shared_memory_per_multiprocessor"]
        self.uuid = "00000000-0000-0000-0000-000000000000"

    def __repr__(self):
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // (1024 * 1024)}MB, "
                f"multi_processor_count={self.multi_processor_count}, uuid={self.uuid}, "
                f"L2_cache_size={self.L2_cache_size // (1024 * 1024)}MB)")


class Generator:
    """The fake device's default generator: a seed and a Philox offset, as
    CUDA's generator keeps them; its state is the same 16 bytes. Meta
    kernels draw nothing from it, so the offset stays where it was set."""

    device = torch.device("cuda", 0)

    def __init__(self):
        self._seed = torch.initial_seed()
        self._offset = 0

    def manual_seed(self, seed):
        self._seed = int(seed) & (2**64 - 1)
        self._offset = 0
        return self

    def seed(self):
        self.manual_seed(int.from_bytes(os.urandom(8), "little"))
        return self._seed

    def initial_seed(self):
        return self._seed

    def get_state(self):
        state = self._seed.to_bytes(8, "little") + self._offset.to_bytes(8, "little")
        return torch.tensor(list(state), dtype=torch.uint8)  # Python data: a real CPU tensor

    def set_state(self, state):
        data = bytes(state.tolist())
        if len(data) != 16:
            raise RuntimeError(f"RNG state must be 16 bytes (a CUDA generator's), got {len(data)}")
        self._seed = int.from_bytes(data[:8], "little")
        self._offset = int.from_bytes(data[8:], "little")
        return self

    def get_offset(self):
        return self._offset

    def set_offset(self, offset):
        self._offset = int(offset)


class Stream(torch.Stream):
    """torch.cuda.Stream on the fake device. A new one is the next of 31
    side streams, numbered 1 to 31 (0 is the default), taken in turn as
    torch takes its stream pool's; memory allocated while it is current is
    its own in the simulated caching allocator. Waits, queries and
    synchronizations complete at once (the device guard's)."""

    _made = 0  # side streams handed out

    def __new__(cls, device=None, priority=0, stream_id=None, device_index=None, device_type=None, **kwargs):
        _check_device(device if device_index is None else device_index)
        if stream_id is None:
            stream_id = 1 + Stream._made % 31
            Stream._made += 1
        return super().__new__(cls, stream_id=stream_id, device_index=0, device_type=1, priority=priority)

    @property
    def cuda_stream(self):
        return self.stream_id


class Event(torch.Event):
    """torch.cuda.Event on the fake device: recorded and complete at once.
    A trace runs no kernels; every timed interval takes the same 1 ms, as
    on the fake GPU (Inductor's autotuners then keep their first choice,
    docs/compile.md)."""

    def __new__(cls, enable_timing=False, blocking=False, interprocess=False, external=False):
        return super().__new__(cls, device="cuda", enable_timing=enable_timing)

    def elapsed_time(self, end_event):
        return 1.0


class _CudaRuntime:
    """torch.cuda.cudart(): what mem_get_info asks of the runtime."""

    def __init__(self, runtime):
        self.runtime = runtime

    def cudaMemGetInfo(self, device):
        _check_device(device)
        return self.runtime.free_bytes(), self.runtime.gpu["total_memory"]

    def cudaProfilerStart(self):
        return 0

    def cudaProfilerStop(self):
        return 0


_devices = 1  # the indices the trace answers for: cuda:0, or a distributed trace's node


def _check_device(device):
    """A fake-cuda trace has one GPU, cuda:0. A distributed trace's node has
    a GPU for each of its local ranks (torchrun's scripts set_device their
    LOCAL_RANK): every index names the traced rank's GPU."""
    if device is None:
        return 0
    index = device if isinstance(device, int) else torch.device(device).index
    if index not in (None, -1) and not 0 <= index < _devices:
        raise RuntimeError(f"CUDA error: invalid device ordinal (a fake-cuda trace has {_devices} "
                           f"device{'s' if _devices > 1 else ''}; asked for {index})")
    return 0


class FakeCudaRuntime:
    """Patches torch.cuda for the length of a fake-cuda trace of `session`
    for the GPU `gpu` (a dict of metamem's GPU table)."""

    def __init__(self, session, gpu, devices=1):
        self.session = session
        self.gpu = gpu
        self.devices = devices
        self.properties = DeviceProperties(gpu)
        self.patches = Patches()
        # Kernel choices (SDPA's backend) follow the GPU's compute capability.
        self.kernels_for = _metamem.TracedGpu(gpu["key"])

    def free_bytes(self):
        """cudaMemGetInfo's free: the GPU's memory less the CUDA context
        (metamem's estimate, docs/gpu-memory.md) and what the allocator
        holds, and never below zero: a trace without a memory fraction
        may hold more than the GPU has."""
        reserved = self.session.memory_stats()["reserved_bytes"]["all"]["current"]
        return max(self.gpu["total_memory"] - self.gpu["cuda_context_bytes"] - reserved, 0)

    def __enter__(self):
        cuda, C, set_ = torch.cuda, torch._C, self.patches.set
        session = self.session

        def properties(device=None):
            _check_device(device)
            return self.properties

        def memory_stats(device=None):
            _check_device(device)
            return session.memory_stats()

        try:
            # The devices, initialized (torch.cuda's lazy init asks the driver):
            # is_available() and device_count() answer from these two.
            set_(cuda, "_initialized", True)
            set_(sys.modules[__name__], "_devices", self.devices)
            set_(cuda, "_cached_device_count", self.devices)
            set_(C, "_cuda_getDeviceCount", lambda: self.devices)
            set_(C, "_cuda_getDevice", lambda: 0)
            set_(C, "_cuda_setDevice", _check_device)
            # Two functions: Dynamo keys its handlers by function, one each.
            set_(cuda, "_exchange_device", lambda device: _check_device(device))
            set_(cuda, "_maybe_exchange_device", lambda device: _check_device(device))
            set_(cuda, "_get_device_properties", properties)
            set_(C, "_cuda_synchronize", lambda: None)
            set_(C, "_cuda_ipc_collect", lambda: None)
            # Streams and events.
            set_(cuda, "Stream", Stream)
            set_(Stream, "_made", 0)  # each trace hands out streams 1, 2, ... afresh
            set_(cuda, "Event", Event)
            # The current stream is the tracer's: what is allocated is on it.
            current = [0]

            def set_stream(stream_id=0, device_index=0, device_type=1):
                _check_device(device_index)
                session.set_stream(stream_id)
                current[0] = stream_id

            set_(C, "_cuda_getCurrentStream", lambda device=0: (current[0], 0, 1))
            set_(C, "_cuda_getDefaultStream", lambda device=0: (0, 0, 1))
            set_(C, "_cuda_setStream", set_stream)
            # The raw stream handle Inductor's code gives its kernels.
            set_(C, "_cuda_getCurrentRawStream", lambda device=0: current[0])
            # Nothing captures a CUDA graph.
            set_(torch.cuda.graphs, "_cuda_isCurrentStreamCapturing", lambda: False)
            # The default generator, one for every index (torch.manual_seed seeds them;
            # checkpoint saves its state).
            set_(cuda, "default_generators", (Generator(),) * self.devices)
            # Memory, from the simulated caching allocator now.
            set_(C, "_cuda_memoryStats", memory_stats)
            set_(C, "_cuda_resetPeakMemoryStats", lambda device=0: session.reset_peak_memory_stats())
            set_(C, "_cuda_resetAccumulatedMemoryStats",
                 lambda device=0: session.reset_accumulated_memory_stats())
            set_(C, "_cuda_emptyCache", session.empty_cache)
            # torch.accelerator's memory functions, the same figures.
            set_(C, "_accelerator_isAllocatorInitialized", lambda: True)
            set_(C, "_accelerator_getDeviceStats", memory_stats)
            set_(C, "_accelerator_resetPeakStats", lambda device=0: session.reset_peak_memory_stats())
            set_(C, "_accelerator_resetAccumulatedStats", lambda device=0: session.reset_accumulated_memory_stats())
            set_(C, "_accelerator_emptyCache", session.empty_cache)
            set_(C, "_accelerator_getMemoryInfo", lambda device=0: _CudaRuntime(self).cudaMemGetInfo(device))
            set_(C, "_cuda_memorySnapshot", lambda *args: {"segments": session.memory_segments(),
                                                            "device_traces": [[]], "allocator_settings": {}})
            set_(cuda, "cudart", lambda: _CudaRuntime(self))
            # GradScaler checks for inf and NaN gradients by reading a value:
            # in a trace it finds none and steps, as a healthy step does.
            scaler = torch.amp.grad_scaler.GradScaler
            set_(scaler, "_maybe_opt_step", _placeholder_reads(scaler._maybe_opt_step))
            self.kernels_for.__enter__()
        except BaseException:
            self.patches.restore()
            raise
        return self

    def __exit__(self, *exc):
        self.kernels_for.__exit__(*exc)
        self.patches.restore()


def _placeholder_reads(method):
    def reading_zeros(*args, **kwargs):
        with _metamem.PlaceholderValues():
            return method(*args, **kwargs)
    return reading_zeros
