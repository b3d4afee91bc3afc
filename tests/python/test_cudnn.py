"""cuDNN on the fake GPU (issue 47): the wheel's cuDNN 9 runs against
metamem's fake runtime and driver, its own heuristics choosing its engines
and its own execution plans sizing their workspaces. Where a real H200 ran
the same call (real_gpu_h200_events.json: torch 2.11, cuDNN 9.19), real
torch on the fake H200 (torch 2.14.1, cuDNN 9.24) allocates what it did, in
its order."""

import json
import os

import pytest

from ci_subset import full, one_gpu_each

ORACLE = os.environ.get("METAMEM_ORACLE", "")

needs_fake_gpu = pytest.mark.skipif(not os.path.exists(os.path.join(ORACLE, "libmetamem_fake_cuda_preload.so")),
                                    reason=f"METAMEM_ORACLE={ORACLE!r} holds no fake GPU to run real torch on")


@needs_fake_gpu
@pytest.mark.parametrize("case", [
    "sdpa bf16 causal CUDNN_ATTENTION",  # cuDNN's runtime-compiled engines: NVRTC, then the fake driver loads them
    "sdpa bf16 causal (default)",  # torch picks cuDNN attention on sm90
    "sdpa bf16 causal, forward only",
    "sdpa bf16 grouped heads 16/4 (default)",
    "sdpa bf16 head_dim 64 (default)",
    "sdpa bf16 float mask (default)",
    "batch norm 64 channels 56², f32",  # cuDNN's batch norm and its reserve
    "batch norm 64 channels 56², bf16",
    "LSTM 2 layers width 512, 128 x 16, f32",  # cuDNN's RNN: its workspaces and reserve space
    # Convolutions: the forward's, the data gradient's and the weight
    # gradient's workspaces, each sized by the engine cuDNN's heuristics
    # chose (no formula of the shape). Some sm90 engines size theirs by how
    # many clusters the GPU fits (cuOccupancyMaxActiveClusters): with the
    # fake driver answering 1, this weight gradient took 13,287,635 B, not
    # the H200's 15,057,575. The 7x7 and the 256-channel 3x3 differ in a
    # data gradient's engine between cuDNN 9.19 and 9.24, and equal the
    # H200 under its own versions (docs/cuda-paths.md).
    "conv 3x3, 64 channels, 56², f32",
    "conv 3x3, 64 channels, 56², bf16",
    "conv 1x1, 256 channels, 56², f32",
])
def test_the_fake_gpu_runs_cudnn_as_the_h200_did(case):
    import metamem._metamem as native
    import real_gpu

    fake = real_gpu.on_fake_gpu(ORACLE, native.gpu("H200"), case)
    assert "error" not in fake, fake["error"]
    recorded = real_gpu.h200_recording(case)
    assert fake["steps"] == recorded["steps"]
    assert fake["events"] == recorded["events"]  # allocation by allocation, cuDNN's workspaces among them


@needs_fake_gpu
def test_a_trace_takes_cudnns_lstm_as_the_h200_ran_it():
    # Traced with the fake GPU's recordings, the H200's measured step: max
    # allocated and max reserved to the byte. On torch's cells (without the
    # recordings) the trace was 73,807,880 B over (225,918,984 B).
    import metamem
    import real_gpu

    case = "LSTM 2 layers width 512, 128 x 16, f32"
    with metamem.trace(device="cuda", gpu="H200", fake_gpu=ORACLE) as t:
        real_gpu.CASES[case](lambda: None)
    allocated = json.loads(t.to_json())["predicted"]["allocator_allocated_peak_bytes"]
    assert [allocated, t.reserved_peak_bytes] == real_gpu.h200_recording(case)["steps"][0]


def test_a_fake_gpu_must_be_a_folder_of_its_libraries():
    import metamem

    with pytest.raises(ValueError, match="holds no fake GPU"):
        with metamem.trace(device="cuda", fake_gpu="/nonexistent"):
            pass


@needs_fake_gpu
@pytest.mark.parametrize("gpu, case", one_gpu_each(["H100-80GB", "T4"], [
    "conv 3x3, 64 channels, 56², f32", "conv 3x3, 64 channels, 56², bf16", "conv 1x1, 256 channels, 56², f32",
    "resnet18 f32 cuDNN on", "resnet18 bf16 autocast cuDNN on", "mobilenet_v2 f32 cuDNN on",
    "resnet18 bf16 autocast channels-last cuDNN on"]))
def test_a_trace_with_the_fake_gpu_takes_cudnns_convolutions_as_real_torch(gpu, case):
    # Without it a trace takes torch's own convolution kernels (their
    # columns), where real torch with cuDNN on takes cuDNN's engines and
    # their workspaces: resnet18 f32 is 6,255,104 B under real torch's max
    # allocated on the H100 (13,627,392 B on the T4), one 3x3 convolution
    # 61,046,272 B over. With it, each distinct convolution is asked of real
    # torch on the fake GPU once, and the trace follows its recording.
    import metamem
    import metamem._metamem as native
    import real_gpu

    real = real_gpu.measured_run(real_gpu.on_fake_gpu(ORACLE, native.gpu(gpu), case))
    assert "error" not in real, real["error"]
    with metamem.trace(device="cuda", gpu=gpu, fake_gpu=ORACLE) as t:
        real_gpu.CASES[case](lambda: None)
    allocated = json.loads(t.to_json())["predicted"]["allocator_allocated_peak_bytes"]
    assert (allocated, t.reserved_peak_bytes) == (real["allocated"], real["reserved"])


@needs_fake_gpu
def test_a_convolution_real_torch_refuses_on_the_gpu_stops_the_trace_with_its_error():
    # cuDNN has no bf16 engine for a T4's depthwise convolution: real torch
    # raises, and so does the trace, at that call.
    import metamem
    import torch

    with pytest.raises(RuntimeError, match="unable to find an engine"):
        with metamem.trace(device="cuda", gpu="T4", fake_gpu=ORACLE):
            x = torch.randn(32, 40, 16, 16, device="cuda", dtype=torch.bfloat16)
            conv = torch.nn.Conv2d(40, 40, 7, padding=3, groups=40).cuda().to(torch.bfloat16)
            conv(x.to(memory_format=torch.channels_last))


@needs_fake_gpu
def test_metamem_fake_gpu_gives_every_trace_the_recordings(monkeypatch):
    import metamem
    import torch

    def peak(**fake_gpu):
        with metamem.trace(device="cuda", gpu="H100-80GB", **fake_gpu) as t:
            torch.nn.Conv2d(64, 64, 3, padding=1).cuda()(torch.randn(8, 64, 56, 56, device="cuda")).sum().backward()
        return t.reserved_peak_bytes, json.loads(t.to_json())["predicted"]["allocator_allocated_peak_bytes"]

    recorded, own_kernels = peak(fake_gpu=ORACLE), peak(fake_gpu="")
    monkeypatch.setenv("METAMEM_FAKE_GPU", ORACLE)
    assert peak() == recorded != own_kernels
    assert peak(fake_gpu="") == own_kernels  # an empty folder turns it off


@needs_fake_gpu
def test_a_jit_traced_convolution_runs_under_the_cudnn_flags_its_graph_carries():
    # torch.jit.trace records aten::_convolution with the process's cuDNN
    # flags of that moment; real torch runs the graph's forward under them
    # and its backward under the process's. A trace does the same.
    import metamem
    import torch

    def peak(step):
        with metamem.trace(device="cuda", gpu="H100-80GB", fake_gpu=ORACLE) as t:
            step()
        return t.reserved_peak_bytes, json.loads(t.to_json())["predicted"]["allocator_allocated_peak_bytes"]

    conv, example = torch.nn.Conv2d(64, 64, 3, padding=1), torch.randn(8, 64, 56, 56)
    with torch.backends.cudnn.flags(enabled=False):
        traced_off = torch.jit.trace(conv, example)
    traced_on = torch.jit.trace(conv, example)

    def train(module, cudnn):
        def step():
            module.zero_grad(set_to_none=True)  # the traced modules share conv's parameters
            with torch.backends.cudnn.flags(enabled=cudnn):
                module.cuda()(torch.randn(8, 64, 56, 56, device="cuda")).sum().backward()
        return step

    def forward(module, cudnn):
        def step():
            with torch.no_grad(), torch.backends.cudnn.flags(enabled=cudnn):
                module.cuda()(torch.randn(8, 64, 56, 56, device="cuda"))
        return step

    assert peak(train(traced_on, True)) == peak(train(conv, True)) != peak(train(conv, False))
    assert peak(train(traced_off, False)) == peak(train(conv, False))
    assert peak(forward(traced_off, True)) == peak(forward(conv, False)) != peak(forward(conv, True))
    assert peak(forward(traced_on, False)) == peak(forward(conv, True))
    assert torch.backends.cudnn.enabled


# cuDNN's RNNs make a cuBLASLt handle of their own (the wheel's cuBLASLt,
# which opens the fake driver itself and finds its functions by name) and
# ask its heuristics for the input products.
RNN_ON_THE_FAKE_GPU = """
import torch
rnn = getattr(torch.nn, sys.argv[3])(64, 128, num_layers=2).cuda().to(getattr(torch, sys.argv[4]))
x = torch.randn(10, 4, 64, device="cuda", dtype=rnn.weight_ih_l0.dtype, requires_grad=True)
y = rnn(x)[0]
y.sum().backward()
print(json.dumps({"backward": y.grad_fn.name(), "input gradient": list(x.grad.shape),
                  "max allocated": torch.cuda.max_memory_allocated()}))
"""

CUBLASLT_HEURISTIC = """
import ctypes
import torch
torch.zeros(1, device="cuda")
lt = ctypes.CDLL("libcublasLt.so.13")
handle, description, preference = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
created = lt.cublasLtCreate(ctypes.byref(handle))
lt.cublasLtMatmulDescCreate(ctypes.byref(description), 68, 0)  # CUBLAS_COMPUTE_32F, CUDA_R_32F
layouts = [ctypes.c_void_p() for _ in range(3)]
for layout, (rows, cols) in zip(layouts, ((512, 64), (64, 40), (512, 40))):
    lt.cublasLtMatrixLayoutCreate(ctypes.byref(layout), 0, ctypes.c_uint64(rows), ctypes.c_uint64(cols),
                                  ctypes.c_int64(rows))
lt.cublasLtMatmulPreferenceCreate(ctypes.byref(preference))
results, found = (ctypes.c_char * (96 * 8))(), ctypes.c_int()
status = lt.cublasLtMatmulAlgoGetHeuristic(handle, description, layouts[0], layouts[1], layouts[2], layouts[2],
                                           preference, 8, results, ctypes.byref(found))
print(json.dumps([created, status, found.value]))
"""


@needs_fake_gpu
@pytest.mark.parametrize("gpu", ["H100-80GB", "A100-80GB", "T4"])
def test_cublaslt_finds_algorithms_on_the_fake_gpu(gpu):
    # Before: its heuristics found none (CUBLAS_STATUS_NOT_SUPPORTED), as the
    # fake driver's tools table did not give it the thread's context.
    import metamem._metamem as native
    from real_torch_on_fake_gpu import PROLOGUE, measure

    created, status, found = measure(ORACLE, native.gpu(gpu), PROLOGUE + CUBLASLT_HEURISTIC)
    assert (created, status) == (0, 0) and found >= 1


@needs_fake_gpu
@pytest.mark.parametrize("gpu, module, dtype", one_gpu_each(["H100-80GB", "T4"], [
    ("LSTM", "float32"), ("GRU", "float16"), ("RNN", "float32")]))
def test_the_fake_gpu_runs_cudnns_rnns(gpu, module, dtype):
    # Before: cudnnGetRNNTempSpaceSizes failed
    # (CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED) where cuBLASLt
    # could not start on the fake driver.
    import metamem._metamem as native
    from real_torch_on_fake_gpu import PROLOGUE, measure

    ran = measure(ORACLE, native.gpu(gpu), PROLOGUE + RNN_ON_THE_FAKE_GPU, module, dtype)
    assert ran["backward"] == "CudnnRnnBackward0" and ran["input gradient"] == [10, 4, 64]
    assert ran["max allocated"] > 0


def peaks_traced_and_real(gpu, step):
    """[max allocated, max reserved] of the code `step` (torch imported)
    traced with the fake GPU's recordings, and run by real torch on it."""
    import metamem
    import metamem._metamem as native
    import torch
    from real_torch_on_fake_gpu import PROLOGUE, measure

    real = measure(ORACLE, native.gpu(gpu), PROLOGUE + "import torch\n" + step +
                   "print(json.dumps([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()]))")
    with metamem.trace(device="cuda", gpu=gpu, fake_gpu=ORACLE) as t:
        exec(step, {"torch": torch})
    return [json.loads(t.to_json())["predicted"]["allocator_allocated_peak_bytes"], t.reserved_peak_bytes], real


# RegNet-Y 128GF's last 1x1 convolution (7,392 channels, batch 16 at 64 px):
# on a T4 its data gradient's first cuDNN engine asks a 7,495,606,272-byte
# workspace, the next one 2,304 B. The GPU is filled to leave FREE GiB, in
# the first step; with ROOM, the filler is freed (and cached) after it.
# `steps`: each step's max allocated and max reserved.
FALLBACK_STEP = """
total = torch.cuda.get_device_properties(0).total_memory
filler = torch.empty(total - (FREE << 30), dtype=torch.uint8, device="cuda")
conv = torch.nn.Conv2d(7392, 7392, 1, bias=False).cuda()
x = torch.randn(16, 7392, 2, 2, device="cuda", requires_grad=True)
steps = []
for _ in range(2):
    torch.cuda.reset_peak_memory_stats()
    conv(x).sum().backward()
    steps.append([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()])
    if ROOM:
        filler = None
"""


@needs_fake_gpu
@pytest.mark.parametrize("free_gib, room", [(2, False), (2, True), pytest.param(10, False, marks=full)])
def test_a_workspace_the_gpu_cannot_hold_falls_back_on_cudnns_next_engine(free_gib, room):
    # Real torch catches the allocator's out-of-memory error and runs the
    # next engine cuDNN's heuristics list; the allocator gave its cached
    # segments back first. Before, a trace always took the first engine:
    # with 2 GiB free it held the 7.5 GB workspace the GPU cannot. torch
    # keeps the engine it ran (per thread) and tries it first at the next
    # call: with room again, step 2 still runs the second engine. With 10
    # GiB free, step 1 runs the first; in step 2 the weight's gradient lies
    # in that workspace's cached segment, and a second one does not fit.
    import metamem._metamem as native

    import metamem
    import torch
    from real_torch_on_fake_gpu import PROLOGUE, measure

    step = FALLBACK_STEP.replace("FREE", str(free_gib)).replace("ROOM", str(room))
    real = measure(ORACLE, native.gpu("T4"), PROLOGUE + "import torch\n" + step + "print(json.dumps(steps))")
    ran = {"torch": torch}
    with metamem.trace(device="cuda", gpu="T4", fake_gpu=ORACLE):
        exec(step, ran)
    assert ran["steps"] == real
    filler = native.gpu("T4")["total_memory"] - (free_gib << 30)
    beside = [filler, 0 if room else filler]
    first_engine = [allocated - held >= 7_495_606_272 for (allocated, _), held in zip(real, beside)]
    assert first_engine == [free_gib == 10, False]


# timm's CoaT-Tiny head: a 1x1 convolution of its three stages' class
# tokens, which cuDNN runs as a product and asks cuBLASLt's heuristics for.
COAT_HEAD_STEP = """
head = torch.nn.Conv1d(3, 1, 1).cuda()
x = torch.randn(16, 3, 152, device="cuda", requires_grad=True)
head(x).sum().backward()
"""


@needs_fake_gpu
@pytest.mark.parametrize("gpu", ["H100-80GB", pytest.param("T4", marks=full)])
def test_a_convolution_cudnn_hands_to_cublaslt_runs_on_the_fake_gpu(gpu):
    # Before: cuBLASLt's occupancy divided by the registers the fake driver
    # gave a kernel, 0: a floating-point exception stopped real torch and
    # the trace's recordings alike.
    traced, real = peaks_traced_and_real(gpu, COAT_HEAD_STEP)
    assert traced == real


@needs_fake_gpu
def test_a_process_that_ran_cublaslt_on_the_fake_gpu_exits_as_a_process_does():
    # cuBLASLt's exit handler deletes its per-context values through the
    # driver; the fake driver's map of them had been destroyed already, and
    # the process spun or aborted on a corrupted heap as it ended. No
    # backward: torch's own exit race (real_torch_on_fake_gpu.LEAVE) needs
    # autograd's device thread.
    import metamem._metamem as native
    from real_torch_on_fake_gpu import PROLOGUE, measure

    program = PROLOGUE + "import torch\nwith torch.no_grad():\n" \
                         "    torch.nn.Conv1d(3, 1, 1).cuda()(torch.randn(16, 3, 152, device='cuda'))\n" \
                         "print(json.dumps('ran'))\n"
    assert measure(ORACLE, native.gpu("H100-80GB"), program, leave=False) == "ran"


# An RNN built on the host, moved to the GPU (where it flattens its weights
# for cuDNN), and a forward and backward: the same code traced and run.
RNN_STEP = """
torch.manual_seed(0)
rnn = getattr(torch.nn, MODULE)(64, 128, num_layers=2, **OPTIONS).cuda().to(DTYPE)
x = torch.randn(10, 4, 64, device="cuda", dtype=DTYPE, requires_grad=True)
with torch.autocast("cuda", AUTOCAST or torch.bfloat16, enabled=AUTOCAST is not None):
    y = rnn(x)[0]
y.float().sum().backward()
"""


@needs_fake_gpu
@pytest.mark.parametrize("gpu, module, dtype, options, autocast", one_gpu_each(["H100-80GB", "T4"], [
    ("LSTM", "float32", {}, None), ("GRU", "float16", {}, None),
    ("RNN", "float32", {"bias": False}, None),  # cuDNN's weights keep room for biases; their gradients are copied out
    ("LSTM", "float32", {"bidirectional": True, "batch_first": True}, None),
    ("LSTM", "float32", {"proj_size": 32}, None),
    ("LSTM", "float32", {"dropout": 0.2}, None),  # cuDNN's dropout state, made at the first such call
    # Autocast runs cuDNN's RNNs in f16 whatever its dtype, the weights cast into a buffer of their own.
    ("LSTM", "float32", {}, "bfloat16"), ("GRU", "float32", {"bias": False}, "float16"),
]))
def test_a_trace_with_the_fake_gpu_takes_cudnns_rnns_as_real_torch(gpu, module, dtype, options, autocast):
    # Without the fake GPU a trace runs RNNs on torch's own cells (cuDNN
    # off); with it, as _cudnn_rnn with the weights flattened as on a GPU,
    # the workspaces and reserve space recorded. timm's Sequencer2D-S on the
    # H100: the trace was 1,017,369,600 B over real torch with cuDNN on in
    # f32, and 1,017,928,704 B in bf16 autocast.
    step = f"MODULE, DTYPE, OPTIONS, AUTOCAST = {module!r}, torch.{dtype}, {options!r}, " \
           f"{f'torch.{autocast}' if autocast else None}\n" + RNN_STEP
    traced, real = peaks_traced_and_real(gpu, step)
    assert traced == real


@needs_fake_gpu
@pytest.mark.parametrize("gpu", ["H100-80GB", pytest.param("T4", marks=full)])
def test_cudnns_rnn_backward_makes_the_inputs_gradients_none_asked_for(gpu):
    # An RNN on the data itself, whose initial states are zeros: no
    # gradient of its inputs is asked for, and cuDNN's backward makes them
    # all the same (it writes the reserve space). The trace had left them
    # out: 57,344 B under on the H100 and the T4.
    step = "MODULE, DTYPE, OPTIONS, AUTOCAST = 'LSTM', torch.float32, {}, None\n" + RNN_STEP
    traced, real = peaks_traced_and_real(gpu, step.replace("requires_grad=True", "requires_grad=False"))
    assert traced == real


@needs_fake_gpu
@pytest.mark.parametrize("gpu,built", [("T4", 'device="cuda"'), ("H100-80GB", "default device")])
def test_an_rnn_built_on_the_gpu_flattens_as_it_is_built(gpu, built):
    # Built on the GPU (device="cuda", or under torch.device("cuda")), an
    # RNN flattens its weights at the end of its __init__; the trace had
    # left that to a move that never comes, and _cudnn_rnn then copied the
    # weights at each call: 925,696 B over on the T4.
    build = ("rnn = torch.nn.LSTM(64, 128, num_layers=2, device='cuda')\n" if built == 'device="cuda"' else
             "with torch.device('cuda'):\n    rnn = torch.nn.LSTM(64, 128, num_layers=2)\n")
    step = ("torch.manual_seed(0)\n" + build + "x = torch.randn(10, 4, 64, device='cuda', requires_grad=True)\n"
            "rnn(x)[0].sum().backward()\n")
    traced, real = peaks_traced_and_real(gpu, step)
    assert traced == real


PACKED_RNN_STEP = """
torch.manual_seed(0)
rnn = torch.nn.LSTM(64, 128, num_layers=2, batch_first=True).cuda()
x = torch.randn(4, 10, 64, device="cuda", requires_grad=True)
with torch.backends.cudnn.flags(enabled=CUDNN):
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor([10, 8, 5, 3]), batch_first=True)
    padded, _ = torch.nn.utils.rnn.pad_packed_sequence(rnn(packed)[0], batch_first=True)
    padded.sum().backward()
"""


@needs_fake_gpu
@pytest.mark.parametrize("gpu, cudnn", one_gpu_each(["H100-80GB", "T4"], [True, False]))
def test_a_packed_sequence_runs_as_real_torch_runs_it(gpu, cudnn):
    # Packing and unpacking read the lengths and batch sizes on the host;
    # cuDNN then takes the packed data whole, torch's cells step by step.
    traced, real = peaks_traced_and_real(gpu, f"CUDNN = {cudnn}\n" + PACKED_RNN_STEP)
    assert traced == real


def test_cudnns_rnn_kernel_stops_a_trace_without_the_fake_gpus_recording():
    import metamem
    import torch

    with pytest.raises(metamem.UnsupportedOpError, match="learns from the fake GPU"):
        with metamem.trace(device="cuda", gpu="H100-80GB", fake_gpu=""):
            rnn = torch.nn.LSTM(8, 16).cuda()
            x, h = torch.randn(3, 2, 8, device="cuda"), torch.zeros(1, 2, 16, device="cuda")
            torch._cudnn_rnn(x, rnn._flat_weights, 4, None, h, h, 2, 16, 0, 1, False, 0.0, True, False, [], None)


@needs_fake_gpu
def test_a_handed_rnn_flattens_in_each_trace_as_in_its_first():
    # A trace that hands the model in but never moves it leaves nothing
    # behind for the next trace's move of it.
    import metamem
    import torch

    def peaks(lstm, move):
        with metamem.trace(device="cuda", gpu="H100-80GB", fake_gpu=ORACLE, modules=[lstm]) as t:
            if move:
                lstm.cuda()
                lstm(torch.randn(5, 2, 8, device="cuda"))[0].sum().backward()
        return t.peak_bytes, t.reserved_peak_bytes

    lstm = torch.nn.LSTM(8, 16, num_layers=2)
    first = peaks(lstm, move=True)
    peaks(lstm, move=False)
    assert peaks(lstm, move=True) == first


# The C++ front end (TorchScript files, the zoo) with METAMEM_FAKE_GPU set:
# the same recordings, and libtorch's composites as a CUDA build with cuDNN
# takes them (cuDNN's batch norm, RNNs through cuDNN's kernel).
class _ScriptedLstm(__import__("torch").nn.Module):
    def __init__(self):
        import torch
        super().__init__()
        self.lstm, self.head = torch.nn.LSTM(32, 64, num_layers=2), torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.lstm(x)[0][-1])


# The CLI's steps of a TorchScript file, by real torch: the model loaded on
# the GPU, the inputs, then two steps (no optimizer; gradients set to
# None), the second measured; where a sixth argument is given, as many
# bytes held beside them from the start.
SCRIPT_STEP = """
import torch
torch._C._set_graph_executor_optimize(False)
beside = torch.empty(int(sys.argv[6]) if len(sys.argv) > 6 else 0, dtype=torch.uint8, device="cuda")
model = torch.jit.load(sys.argv[3], map_location="cuda")
model.train()
shape = [int(n) for n in sys.argv[4].split("x")]
x = torch.randn(*shape, device="cuda")
classes = int(sys.argv[5])
targets = torch.zeros(shape[0], dtype=torch.long, device="cuda") if classes else None
loss = (lambda out: torch.nn.functional.cross_entropy(out, targets)) if classes else (lambda out: out.sum())
for step in range(2):
    if step == 1:  # the CLI reports the last step's peaks
        torch.cuda.reset_peak_memory_stats()
    loss(model(x)).backward()  # the output is the loss's alone: freed in backward, as the CLI's step frees it
    for p in model.parameters():
        p.grad = None
print(json.dumps([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()]))
"""


@needs_fake_gpu
@pytest.mark.skipif(not os.environ.get("METAMEM_BIN"), reason="the C++ command (METAMEM_BIN) is not built")
@pytest.mark.parametrize("gpu, model", one_gpu_each(["H100-80GB", "T4"], ["resnet18", "resnet18 traced", "lstm"]))
def test_the_cpp_front_end_follows_the_fake_gpu_as_real_torch_runs(gpu, model, tmp_path):
    # Without the fake GPU it traces torch's own convolutions and RNN
    # cells: a scripted ResNet-18 at 8x3x64x64 is 16,859,136 B under real
    # torch with cuDNN on on the T4 (3,244,032 B on the H100), the LSTM
    # 18,465,280 B under on both; and before, a scripted LSTM could not be
    # traced at all (its flat weights stayed on the loader's meta device).
    import torch
    import torchvision
    import metamem._metamem as native
    import zoo_fake_gpu_sweep as sweep
    from real_torch_on_fake_gpu import PROLOGUE, measure

    path = str(tmp_path / "model.pt")
    module, shape, classes = ((_ScriptedLstm(), "20x8x32", 0) if model == "lstm"
                              else (torchvision.models.resnet18(), "8x3x64x64", 1000))
    # A traced graph calls aten::_convolution with the cuDNN flags of its
    # tracing, and holds a tensor constant for each BatchNorm's count.
    traced = model.endswith("traced")
    torch.jit.save(torch.jit.trace(module, torch.randn(8, 3, 64, 64)) if traced else torch.jit.script(module), path)
    real = measure(ORACLE, native.gpu(gpu), PROLOGUE + SCRIPT_STEP, path, shape, str(classes))
    predicted = sweep.traced(os.environ["METAMEM_BIN"], ORACLE,
                             ["--model", path, "--input", shape, "--loss",
                              f"cross_entropy:{classes}" if classes else "sum", "--device", "cuda", "--gpu", gpu])
    assert list(predicted) == real


@needs_fake_gpu
@pytest.mark.skipif(not os.environ.get("METAMEM_BIN"), reason="the C++ command (METAMEM_BIN) is not built")
def test_the_cpp_front_end_falls_back_on_cudnns_next_engine_where_the_gpu_is_full(tmp_path):
    # FALLBACK_STEP's convolution, scripted, on a T4 that leaves the
    # allocator 2 GiB: --cuda-context says the rest is taken, and real torch
    # holds as much beside the model. Both take cuDNN's second engine.
    import torch
    import metamem._metamem as native
    import zoo_fake_gpu_sweep as sweep
    from real_torch_on_fake_gpu import PROLOGUE, measure

    path = str(tmp_path / "conv.pt")
    torch.jit.save(torch.jit.script(torch.nn.Conv2d(7392, 7392, 1, bias=False)), path)
    beside = native.gpu("T4")["total_memory"] - (2 << 30)
    real = measure(ORACLE, native.gpu("T4"), PROLOGUE + SCRIPT_STEP, path, "16x7392x2x2", "0", str(beside))
    predicted = sweep.traced(os.environ["METAMEM_BIN"], ORACLE,
                             ["--model", path, "--input", "16x7392x2x2", "--loss", "sum", "--device", "cuda",
                              "--gpu", "T4", "--cuda-context", f"{beside}B"])
    assert [bytes_ + beside for bytes_ in predicted] == real
    assert predicted[0] < 2 << 30


# The zoo's steps in CI, one GPU each: cuDNN's convolutions under autocast,
# a pipeline's last stage, a tensor-parallel rank, FSDP's shards, fp32 main
# gradients, checkpointed blocks; every case on every GPU in the full run.
ZOO_CI_CASES = ("resnet18 amp bf16 adamw", "llama pp 2, stage 1", "gpt2 tp 2, sequence parallel", "mlp fsdp 4",
                "llama bf16 fp32 main grads", "resnet50 checkpointed")


def _zoo_parameters():
    import zoo_fake_gpu_sweep as sweep

    gpus = sweep.GPUS
    return [pytest.param(gpu, name, marks=() if name in ZOO_CI_CASES and g == ZOO_CI_CASES.index(name) % len(gpus)
                         else full)
            for name in sweep.cases() for g, gpu in enumerate(gpus)]


@needs_fake_gpu
@pytest.mark.skipif(not os.environ.get("METAMEM_BIN"), reason="the C++ command (METAMEM_BIN) is not built")
@pytest.mark.parametrize("gpu, case", _zoo_parameters())
def test_the_zoo_traced_on_fake_cuda_is_real_torch_on_the_fake_gpu(gpu, case):
    # The zoo as C++ runs it: built on the CPU, moved with Module::to, then
    # the CLI's steps; the measured step's max allocated and max reserved.
    import zoo_fake_gpu_sweep as sweep

    traced, real = sweep.measured(os.environ["METAMEM_BIN"], ORACLE, sweep.cases()[case], gpu)
    assert traced == real


@needs_fake_gpu
def test_the_zoos_real_run_writes_what_it_asked_the_allocator(tmp_path):
    # Real torch's own allocations and frees (its allocator's recorded
    # history), which the simulator replays as torch's allocator does.
    import subprocess
    import zoo_fake_gpu_sweep as sweep

    events = str(tmp_path / "events.txt")
    run = sweep.real_run(ORACLE, "--model", "resnet18", "--batch", "2", "--image", "32", "--optimizer", "adamw",
                         "--device", "cuda", "--gpu", "A100-80GB", "--allocator-events", events)
    assert run.returncode == 0, run.stderr
    lines = open(events).read().splitlines()
    assert lines[0] == "metamem allocator events 1"
    assert sum(line.startswith("alloc ") for line in lines) > 500  # parameters, states, two steps' activations
    replay = subprocess.run([os.path.join(ORACLE, "metamem-allocator-oracle"), "--gpu", "A100-80GB", events],
                            capture_output=True, text=True, timeout=300)
    assert replay.returncode == 0, replay.stdout + replay.stderr


@needs_fake_gpu
def test_the_zoos_real_run_names_what_it_cannot_run(tmp_path):
    import torch
    from zoo_fake_gpu_sweep import real_run

    path = str(tmp_path / "linear.pt")
    torch.jit.save(torch.jit.script(torch.nn.Linear(4, 4)), path)
    scripted = real_run(ORACLE, "--model", path, "--input", "2x4")
    assert scripted.returncode == 2 and "moves its model with Module::to: not a C++ module" in scripted.stderr
    on_cpu = real_run(ORACLE, "--model", "mlp", "--device", "cpu")
    assert on_cpu.returncode == 2 and "the fake GPU runs --device cuda" in on_cpu.stderr
    unknown = real_run(ORACLE, "--model", "mlp", "--device", "cuda", "--gpu", "H900")
    assert unknown.returncode == 2 and "H900" in unknown.stderr


@pytest.mark.skipif(not os.environ.get("METAMEM_BIN"), reason="the C++ command (METAMEM_BIN) is not built")
def test_the_cpp_front_end_names_a_fake_gpu_it_cannot_use():
    import subprocess

    run = subprocess.run([os.environ["METAMEM_BIN"], "profile", "--model", "mlp", "--batch", "2"],
                         env=dict(os.environ, METAMEM_FAKE_GPU="/nonexistent"), capture_output=True, text=True)
    assert run.returncode == 2 and "METAMEM_FAKE_GPU: the folder '/nonexistent' holds no fake GPU" in run.stderr
    # On fake cpu there is no GPU to follow.
    cpu = subprocess.run([os.environ["METAMEM_BIN"], "profile", "--model", "mlp", "--batch", "2", "--device", "cpu"],
                         env=dict(os.environ, METAMEM_FAKE_GPU="/nonexistent"), capture_output=True, text=True)
    assert cpu.returncode == 0, cpu.stderr
