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
import threading
import weakref

import torch

from . import _cuda_graph_trees, _metamem

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
    kernels draw nothing from it, so the offset stays where it was set.
    Its state read in a CUDA graph's capture makes the graph's seed and
    offset on the device, as the capture's first draw would."""

    device = torch.device("cuda", 0)

    def __init__(self):
        self._seed = torch.initial_seed()
        self._offset = 0
        self._new_rnn_state = True

    def manual_seed(self, seed):
        self._seed = int(seed) & (2**64 - 1)
        self._offset = 0
        self._new_rnn_state = True
        return self

    def reset_rnn_state(self):
        """Whether cuDNN's RNN dropout state is to be made anew, as CUDA's
        generator answers: at the first ask, and once after each new seed
        or state."""
        new, self._new_rnn_state = self._new_rnn_state, False
        return new

    def seed(self):
        self.manual_seed(int.from_bytes(os.urandom(8), "little"))
        return self._seed

    def initial_seed(self):
        return self._seed

    def get_state(self):
        _metamem.read_generator_state_in_capture()
        state = self._seed.to_bytes(8, "little") + self._offset.to_bytes(8, "little")
        return torch.tensor(list(state), dtype=torch.uint8)  # Python data: a real CPU tensor

    def set_state(self, state):
        data = bytes(state.tolist())
        if len(data) != 16:
            raise RuntimeError(f"RNG state must be 16 bytes (a CUDA generator's), got {len(data)}")
        self._seed = int.from_bytes(data[:8], "little")
        self._offset = int.from_bytes(data[8:], "little")
        self._new_rnn_state = True
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
    synchronizations complete at once (the device guard's); a wait on a
    capturing stream's work joins the capture (_Captures)."""

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

    def record_event(self, event=None):
        event = super().record_event(event)
        _captures.recorded(event, self.stream_id)
        return event

    def wait_event(self, event):
        _captures.waits(self.stream_id, event)
        super().wait_event(event)

    def wait_stream(self, stream):
        _captures.waits_on_stream(self.stream_id, stream.stream_id)
        super().wait_stream(stream)


class Event(torch.Event):
    """torch.cuda.Event on the fake device: recorded and complete at once.
    A trace runs no kernels; every timed interval takes the same 1 ms, as
    on the fake GPU (Inductor's autotuners then keep their first choice,
    docs/compile.md)."""

    def __new__(cls, enable_timing=False, blocking=False, interprocess=False, external=False):
        return super().__new__(cls, device="cuda", enable_timing=enable_timing)

    def record(self, stream=None):
        stream = torch.cuda.current_stream() if stream is None else stream
        super().record(stream)
        _captures.recorded(self, stream.stream_id)

    def wait(self, stream=None):
        (torch.cuda.current_stream() if stream is None else stream).wait_event(self)

    def elapsed_time(self, end_event):
        return 1.0


class _Captures:
    """CUDA graphs in a trace. A capture routes its stream's requests to the
    graph's private pool, as c10's allocator does, so that what it allocates
    (its static outputs, its temporaries, a cuBLAS workspace for its
    stream) takes segments of the pool's own, which nothing else reuses. A
    stream that waits on an event recorded on a captured stream during the
    capture is captured too, as CUDA follows a capture's dependencies (FSDP2's
    all-gather stream waits on the compute stream), and c10 routes its
    requests to the pool as well. A replay runs nothing and asks nothing of
    the allocator, as on a GPU."""

    def __init__(self, session, current_stream):
        self.session = session
        self.current_stream = current_stream  # () -> the current stream's number
        self.numbers = {}  # pool handle -> the trace's pool number
        self.pool = None  # the pool of the capture underway
        self.captured = set()  # the streams it captures
        self.events = {}  # id -> an event recorded on one of them (held: ids stay unique)

    def pool_handle(self):
        """torch.cuda.graph_pool_handle(): a new pool's id."""
        handle = (0, len(self.numbers) + 1)
        self.number(handle)
        return handle

    def number(self, handle):
        return self.numbers.setdefault(tuple(handle), len(self.numbers) + 1)

    def is_capturing(self):
        return self.current_stream() in self.captured

    def recorded(self, event, stream):
        if stream in self.captured:
            self.events[id(event)] = event

    def waits(self, stream, event):
        if id(event) in self.events:
            self.join(stream)

    def waits_on_stream(self, stream, other):
        if other in self.captured:
            self.join(stream)

    def join(self, stream):
        if stream not in self.captured:
            self.session.join_pool(self.number(self.pool), stream)
            self.captured.add(stream)

    def begin(self, pool):
        if self.pool is not None:
            raise RuntimeError("metamem: a CUDA graph capture is underway already; one at a time")
        stream = self.current_stream()
        self.session.begin_pool(self.number(pool), stream)
        self.pool, self.captured = pool, {stream}

    def end(self):
        self.session.end_pool(self.number(self.pool))
        self.pool, self.captured, self.events = None, set(), {}

    def begin_thread_routing(self, device, handle):
        """torch.cuda.use_mem_pool's routing: this thread's requests."""
        _check_device(device)
        self.session.begin_pool(self.number(handle), None)

    def end_routing(self, device, handle):
        _check_device(device)
        self.session.end_pool(self.number(handle))

    def mem_pool_class(self):
        captures = self

        class MemPool:
            """torch.cuda.MemPool in a trace: a private pool that
            torch.cuda.use_mem_pool routes the thread's requests to (and a
            CUDA graph's capture, given as its pool)."""

            def __init__(self, allocator=None, use_on_oom=False, no_split=False):
                if allocator is not None or use_on_oom or no_split:
                    raise NotImplementedError(
                        "metamem: a MemPool with its own allocator, use_on_oom or no_split is not traced; "
                        "a plain torch.cuda.MemPool() is")
                self._id = (len(captures.numbers) + 1, 0)  # torch counts users' pools in the first field
                captures.number(self._id)

            @property
            def id(self):
                return self._id

            def use_count(self):
                return 1

        return MemPool

    def graph_class(self):
        captures = self

        class CUDAGraph:
            """torch.cuda.CUDAGraph in a trace (metamem._cuda._Captures)."""

            def __init__(self, keep_graph=False):
                self._pool = None
                self._kept = []

            def capture_begin(self, pool=None, capture_error_mode="global", check_input_liveness=False):
                self._pool = tuple(pool) if pool is not None else captures.pool_handle()
                captures.begin(self._pool)
                _metamem.begin_graph_capture()

            def capture_end(self):
                captures.end()
                # CUDA's generator keeps a seed and offset for the graph, where it drew.
                self._kept = _metamem.end_graph_capture()

            def instantiate(self):
                pass

            def replay(self):
                pass

            def reset(self):
                self._kept = []  # its pool's release: the trace's pools are kept to its end (docs/compile.md)

            def pool(self):
                return torch.cuda._POOL_HANDLE(self._pool)

            def pools(self):
                return [self.pool()]

            def enable_debug_mode(self):
                pass

            def debug_dump(self, debug_path, *, verbose=True):
                raise RuntimeError("metamem: a traced CUDA graph captured no kernels; there is nothing to dump")

        return CUDAGraph


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
_captures = None  # the trace's _Captures


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
        # torch.compile's CUDA graph trees, the trace's own.
        self.graph_trees = _cuda_graph_trees.TracedTrees()

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
            # CUDA graphs: captures route to private pools, replays run nothing.
            captures = _Captures(session, lambda: current[0])
            set_(sys.modules[__name__], "_captures", captures)
            graph = captures.graph_class()
            set_(cuda, "CUDAGraph", graph)
            set_(torch.cuda.graphs, "CUDAGraph", graph)
            set_(torch.cuda.graphs, "_graph_pool_handle", captures.pool_handle)
            set_(torch.cuda.graphs, "_cuda_isCurrentStreamCapturing", captures.is_capturing)
            # torch.cuda.graph keeps the capture stream it first makes: the trace's is not the GPU's.
            set_(torch.cuda.graphs.graph, "default_capture_stream", None)
            set_(C, "_cuda_isCurrentStreamCapturing", captures.is_capturing)
            mem_pool = captures.mem_pool_class()
            set_(cuda, "MemPool", mem_pool)
            set_(torch.cuda.memory, "MemPool", mem_pool)
            # A pool's routing of the thread's requests: use_mem_pool's (torch.cuda.memory
            # imported the names) and CUDA graph trees' warm-ups (through torch._C).
            for module in (torch.cuda.memory, C):
                set_(module, "_cuda_beginAllocateCurrentThreadToPool", captures.begin_thread_routing)
                set_(module, "_cuda_endAllocateToPool", captures.end_routing)
                set_(module, "_cuda_releasePool", lambda device, handle: _check_device(device))
            self.graph_trees.install(set_, session, captures)
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
            # RNN modules run as a build without cuDNN runs them
            # (docs/cuda-paths.md), unless the trace has the fake GPU's
            # recordings of cuDNN (_Rnns): they do not flatten their weights
            # for cuDNN (which reads their addresses), and their layers take
            # the native kernels the trace follows.
            acceptable = torch.backends.cudnn.is_acceptable
            set_(torch.backends.cudnn, "is_acceptable",
                 lambda tensor: not _metamem.is_traced(tensor) and acceptable(tensor))
            self.rnns = _Rnns(torch.nn.modules.rnn._VF)
            set_(torch.nn.modules.rnn, "_VF", self.rnns)
            self.kernels_for.__enter__()
        except BaseException:
            self.patches.restore()
            raise
        return self

    def __exit__(self, *exc):
        self.kernels_for.__exit__(*exc)
        _metamem.end_graph_capture()  # a capture the block left underway
        try:
            self.graph_trees.shut_down()
        finally:
            self.patches.restore()


class _Rnns:
    """torch._VF as nn.RNN, nn.LSTM and nn.GRU call it in a fake-cuda trace.
    A whole RNN (`lstm`, `gru`, `rnn_tanh`, `rnn_relu`) runs

    - as torch runs it with cuDNN on, where the trace has the fake GPU's
      recordings of cuDNN (follow_cudnn(): `_cudnn_rnn`, whose workspace
      and reserve space the recordings give) and torch takes cuDNN: cuDNN
      on, an f32, f16 or f64 input;
    - otherwise with cuDNN off, layer by layer and step by step on torch's
      own CUDA cells (whose C++ would otherwise pick cuDNN, guard the real
      device and read the weights' addresses).

    The rest as torch._VF has it."""

    def __init__(self, functions):
        self._functions = functions
        self.cudnn_recorded = False
        self._building = threading.local()  # how many RNN modules this thread is building
        self._moved = weakref.WeakSet()  # RNN modules flattened as the trace's modules=[...] made their weights

    def follow_cudnn(self, patches):
        """From now on RNNs take cuDNN where torch does, and modules
        flatten their weights for it as they do on a GPU."""
        patches.set(self, "cudnn_recorded", True)
        rnn = torch.nn.modules.rnn.RNNBase
        flatten, init = rnn.flatten_parameters, rnn.__init__

        # A trace builds a module's weights on its device where the code
        # builds them on the host, to move them later: the weights are
        # flattened as they move, not as they are built. A module the code
        # builds on the GPU flattens as it is built, as on a GPU.
        def built(module, *args, **kwargs):
            device = kwargs.get("device")
            if torch.device(device if device is not None else torch.get_default_device()).type == "cuda":
                return init(module, *args, **kwargs)
            self._building.depth = getattr(self._building, "depth", 0) + 1
            try:
                init(module, *args, **kwargs)
            finally:
                self._building.depth -= 1

        def flattened(module):
            if getattr(self._building, "depth", 0):
                return
            if module in self._moved:  # the move the trace's modules=[...] stood for
                self._moved.discard(module)
                return
            _flatten_for_cudnn(module) or flatten(module)

        patches.set(rnn, "__init__", built)
        patches.set(rnn, "flatten_parameters", flattened)

    def moved(self, module):
        """`module`'s weights were just made on the GPU as module.to() makes
        them (a trace's modules=[...]): an RNN flattens them, as that move
        does, and the trace's own move of it, which stands for the same,
        does not again."""
        if self.cudnn_recorded and isinstance(module, torch.nn.RNNBase):
            module._flat_weights = [getattr(module, name, None) for name in module._flat_weights_names]
            if _flatten_for_cudnn(module):
                self._moved.add(module)
            module._flat_weight_refs = [weakref.ref(w) if w is not None else None for w in module._flat_weights]

    def __getattr__(self, name):
        function = getattr(self._functions, name)
        if name not in _CUDNN_MODES:
            return function

        def run(*args, **kwargs):
            if self.cudnn_recorded and not kwargs and _takes_cudnn(args):
                if isinstance(args[3], (list, tuple)):  # packed: its batch sizes second, after the data
                    data, batch_sizes, *rest = args
                    return _cudnn_rnn(name, data, *rest, False, batch_sizes=batch_sizes.tolist())
                return _cudnn_rnn(name, *args, batch_sizes=[])
            enabled = torch._C._get_cudnn_enabled()
            torch._C._set_cudnn_enabled(False)
            try:
                return function(*args, **kwargs)
            finally:
                torch._C._set_cudnn_enabled(enabled)
        return run


_CUDNN_MODES = {"rnn_relu": 0, "rnn_tanh": 1, "lstm": 2, "gru": 3}  # cudnnRNNMode_t, by torch._VF's name
_CUDNN_DTYPES = (torch.float32, torch.float16, torch.float64)  # at::cudnn_is_acceptable's


def _takes_cudnn(args):
    # (input, hx, weights, has_biases, num_layers, dropout, train,
    # bidirectional, batch_first), or for a packed sequence (data,
    # batch_sizes, hx, weights, has_biases, num_layers, dropout, train,
    # bidirectional).
    if len(args) != 9:
        return False
    input = args[0]
    return (torch._C._get_cudnn_enabled() and _metamem.is_traced(input) and input.dtype in _CUDNN_DTYPES
            and input.numel() > 0)


def _cudnn_rnn(name, input, hx, weights, has_biases, num_layers, dropout, train, bidirectional, batch_first,
               batch_sizes):
    # at::native's _cudnn_impl, as the C++ front end runs it too
    # (meta/CudnnRnnCall.cpp); cuDNN's dropout state is made anew after a
    # new seed or generator state (Generator.reset_rnn_state).
    hx, cx = (hx[0], hx[1]) if name == "lstm" else (hx, None)
    output, hy, cy = _metamem.cudnn_rnn(_CUDNN_MODES[name], input, hx, cx, list(weights), has_biases, num_layers,
                                        dropout, train, bidirectional, batch_first, batch_sizes,
                                        torch.cuda.default_generators[input.device.index or 0].reset_rnn_state)
    return (output, hy, cy) if name == "lstm" else (output, hy)


def _flatten_for_cudnn(module):
    """What flatten_parameters does on a GPU with cuDNN (which the trace
    cannot ask where the weights are): one buffer of cuDNN's weight space,
    each weight copied in and made a view of it, its own buffer freed.
    True where done; None to leave it to torch's (which does nothing for
    traced weights)."""
    weights = module._flat_weights
    if (len(weights) != len(module._flat_weights_names) or not weights
            or not all(isinstance(w, torch.Tensor) and _metamem.is_traced(w) for w in weights)
            or len({w.dtype for w in weights}) != 1 or weights[0].dtype not in _CUDNN_DTYPES
            or not torch._C._get_cudnn_enabled()):
        return None
    if len({w.data_ptr() for w in weights}) != len(weights):
        return True  # aliased weights stay as they are, as torch leaves them (flattened ones are flattened again)
    with torch.no_grad():
        flat = torch.zeros(_metamem.cudnn_rnn_weight_space(weights, _CUDNN_MODES[module.mode.lower()],
                                                           module.hidden_size, module.num_layers,
                                                           module.bidirectional, module.bias),
                           dtype=weights[0].dtype, device=weights[0].device)
        offset = 0
        for w in weights:
            view = flat[offset:offset + w.numel()].view_as(w)
            view.copy_(w)
            w.data = view
            offset += w.numel()
    return True

