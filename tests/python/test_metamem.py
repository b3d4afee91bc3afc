"""import metamem: eager Python traced on a fake device, checked against real CPU runs."""

import copy
import html
import json
import pickle
import resource
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
import torchvision

import metamem



def trace_and_run(step, modules=()):
    """The traced peak on fake cpu and the achieved peak of a real CPU run."""
    with metamem.trace(device="cpu", modules=modules) as t:
        step()
    return t.peak_bytes, metamem.achieved_cpu(step, modules=modules)


def training_step(make_model, input_shape, optimizer=torch.optim.SGD, classes=None):
    def step():
        torch.manual_seed(0)
        model = make_model()
        opt = optimizer(model.parameters(), lr=0.01)
        x = torch.randn(*input_shape)
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out, torch.zeros(input_shape[0], dtype=torch.long)) if classes else out.sum()
        loss.backward()
        opt.step()
    return step


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "vgg11", "squeezenet1_0"])
def test_eager_torchvision_model_is_exact_on_cpu(name):
    make = lambda: getattr(torchvision.models, name)(num_classes=10)
    traced, achieved = trace_and_run(training_step(make, (2, 3, 64, 64), torch.optim.AdamW, classes=10))
    assert traced == achieved


def test_a_model_the_block_drops_is_freed_as_without_a_trace():
    # The trace named models from their first forward and had kept them
    # alive to its end: each model below held its parameters and gradients.
    def step():
        for width in (512, 1024, 768):
            model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
            model(torch.randn(16, width)).sum().backward()
            del model

    traced, achieved = trace_and_run(step)
    assert traced == achieved
    with metamem.trace(device="cpu") as t:
        step()
        torch.nn.Linear(4, 4).bfloat16()(torch.randn(2, 4, dtype=torch.bfloat16))
    # Named as the block ran them, the dtype the first one's.
    assert (t.json()["model"], t.json()["dtype"]) == ("Sequential+Sequential+Sequential+Linear", "f32")


class Branchy(torch.nn.Module):
    """Control flow on Python values and shapes, hooks, in-place ops."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(4))
        self.layers[1].register_forward_hook(lambda m, i, o: o * 2)

    def forward(self, x):
        depth = 3 if x.shape[0] > 4 else 2  # a branch on the shape
        for i, layer in enumerate(self.layers[:depth]):
            x = layer(x)
            if i % 2 == 0:
                x.relu_()  # in place
            else:
                x = torch.tanh(x)
        x.register_hook(lambda g: g * 0.5)  # a tensor hook on the gradient
        return x


class Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 3 * x * x * grad


class Checkpointed(torch.nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.reentrant = reentrant
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)) for _ in range(3))

    def forward(self, x):
        for block in self.blocks:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=self.reentrant)
        return Cube.apply(x)


@pytest.mark.parametrize("make, shape", [
    (Branchy, (8, 32)),
    (Branchy, (2, 32)),
    (lambda: Checkpointed(reentrant=False), (16, 64)),
    (lambda: Checkpointed(reentrant=True), (16, 64)),
], ids=["branch_on_shape", "other_branch", "checkpoint", "checkpoint_reentrant"])
def test_python_only_model_is_exact_on_cpu(make, shape):
    def step():
        model = make()
        x = torch.randn(*shape, requires_grad=True)
        model(x).sum().backward()
        torch.optim.Adam(model.parameters()).step()
    traced, achieved = trace_and_run(step)
    assert traced == achieved


@pytest.mark.parametrize("onednn", [True, False], ids=["onednn", "native_cells"])
@pytest.mark.parametrize("bidirectional, batch_first, bias, dtype",
                         [(False, False, True, torch.float32), (True, True, False, torch.float32),
                          (False, False, True, torch.bfloat16)], ids=["lstm", "bidirectional_no_bias", "bf16"])
def test_a_cpu_lstm_is_traced_as_the_real_run_takes_it_with_onednn_on_or_off(onednn, bidirectional, batch_first,
                                                                              bias, dtype):
    # With oneDNN on (torch's default), 2.14's CPU LSTM runs oneDNN's RNN
    # layer (in bf16 where the CPU has oneDNN's bf16), whose workspace,
    # reordered weights and scratchpad a trace records from the real layer;
    # with it off, the native cells.
    def step():
        torch.manual_seed(0)
        lstm = torch.nn.LSTM(64, 96, num_layers=2, bidirectional=bidirectional, batch_first=batch_first, bias=bias,
                             dtype=dtype)
        out, _ = lstm(torch.randn(12, 5, 64, dtype=dtype))
        out.float().sum().backward()
    with torch.backends.mkldnn.flags(enabled=onednn):
        with metamem.trace(device="cpu") as t:
            step()
        assert torch.backends.mkldnn.enabled == onednn
        achieved = metamem.achieved_cpu(step)
    if dtype == torch.float32 or torch.ops.mkldnn._is_mkldnn_bf16_supported():
        assert ("mkldnn_rnn_layer" in t.table("nodes")) == onednn
    assert t.peak_bytes == achieved


def test_onednns_lstm_holds_what_the_native_cells_do_not():
    # The check above can fail: the two paths differ by far more than a
    # rounding (oneDNN's workspace and reordered weights).
    def step():
        lstm = torch.nn.LSTM(64, 96, num_layers=2)
        lstm(torch.randn(12, 5, 64))[0].sum().backward()
    peaks = {}
    for onednn in (True, False):
        with torch.backends.mkldnn.flags(enabled=onednn), metamem.trace(device="cpu") as t:
            step()
        peaks[onednn] = t.peak_bytes
    assert peaks[True] > 1.3 * peaks[False]


CONVOLUTIONS = {
    # 20 samples: NNPACK's forward where oneDNN is off and NNPACK on.
    "conv2d": (lambda: torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                           torch.nn.Conv2d(16, 32, 3, stride=2)), (20, 3, 32, 32)),
    "grouped_dilated": (lambda: torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, groups=4, dilation=2),
                                                    torch.nn.Conv2d(32, 32, 3, groups=32)), (4, 16, 24, 24)),
    "conv1d": (lambda: torch.nn.Conv1d(8, 16, 5, padding=2, bias=False), (6, 8, 50)),
    "conv3d": (lambda: torch.nn.Conv3d(4, 8, 3), (2, 4, 8, 12, 12)),
    "transposed": (lambda: torch.nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1, groups=2), (3, 8, 10, 10)),
}


@pytest.mark.parametrize("onednn, nnpack", [(True, True), (False, True), (False, False)],
                         ids=["onednn", "nnpack", "native"])
@pytest.mark.parametrize("variant", ["f32", "channels_last", "bf16_autocast", "no_grad"])
@pytest.mark.parametrize("layers", CONVOLUTIONS)
def test_a_cpu_convolution_is_traced_as_the_real_run_takes_it_under_the_processs_flags(layers, variant, onednn,
                                                                                       nnpack):
    # Torch gives a CPU convolution to oneDNN where it is on (its reorders
    # and scratchpad a trace records from the real kernel), else to NNPACK
    # or XNNPACK where they take it (recorded too), else to its native
    # kernels (modelled).
    make, shape = CONVOLUTIONS[layers]
    if variant == "channels_last" and len(shape) == 3:
        pytest.skip("a 1-d convolution has no channels-last format")

    def step():
        torch.manual_seed(0)
        model, x = make(), torch.randn(*shape)
        if variant == "channels_last":
            layout = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
            model, x = model.to(memory_format=layout), x.to(memory_format=layout)
        if variant == "no_grad":
            with torch.no_grad():
                model(x)
            return
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=variant == "bf16_autocast"):
            y = model(x)
        y.float().sum().backward()
    with torch.backends.mkldnn.flags(enabled=onednn), torch.backends.nnpack.flags(enabled=nnpack):
        traced, achieved = trace_and_run(step)
        assert torch.backends.mkldnn.enabled == onednn and torch._nnpack_available() and \
            torch._C._get_nnpack_enabled() == nnpack
    # Torch gives bf16 to oneDNN only on a CPU with AVX-512 (BW, VL and DQ;
    # mkldnn_bf16_device_check): on an AVX2-only EPYC its native kernels run it.
    native_bf16 = not onednn or not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if layers == "transposed" and variant == "bf16_autocast" and native_bf16:
        assert traced < achieved, "the known gap below is mended: drop this exception"
        pytest.xfail("known gap (docs/accuracy.md): the native grouped transposed backward's bias gradient sums "
                     "each group's bf16 output gradient in float, a temporary the CPU model lacks")
    assert traced == achieved


@pytest.mark.parametrize("onednn", [True, False], ids=["onednn", "native"])
@pytest.mark.parametrize("variant", ["f32", "no_grad"])
def test_a_jit_traced_convolution_is_traced_as_the_real_run_takes_it(variant, onednn):
    # torch.jit.trace records aten::_convolution, which a trace sized by
    # torch's Python meta function alone before: no temporaries, 12,845,056 B
    # against 19,415,040 B real with oneDNN and 70,647,808 B on the native
    # kernels (their columns), forward under no_grad.
    conv = torch.nn.Conv2d(64, 64, 3, padding=1)
    traced = torch.jit.trace(conv, torch.randn(8, 64, 56, 56))

    def step():
        traced.zero_grad(set_to_none=True)
        with torch.jit.optimized_execution(False), torch.set_grad_enabled(variant != "no_grad"):
            y = traced(torch.randn(8, 64, 56, 56))
        if variant != "no_grad":
            y.sum().backward()
    with torch.backends.mkldnn.flags(enabled=onednn):
        traced_peak, achieved = trace_and_run(step)
    assert traced_peak == achieved


def test_a_script_module_loaded_before_or_in_the_block_trains_in_it(tmp_path):
    # A ScriptModule's parameters are plain tensors that require grad: the
    # replacements modules= made for them did not (backward stopped: "element
    # 0 of tensors does not require grad").
    scripted = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16)))
    scripted.save(str(tmp_path / "net.pt"))

    def build():
        module = torch.jit.load(str(tmp_path / "net.pt"))
        return module, torch.optim.AdamW(module.parameters())

    def steps(module, opt):
        for _ in range(2):
            opt.zero_grad()
            with torch.jit.optimized_execution(False):
                module(torch.randn(64, 8)).sum().backward()
            opt.step()

    module, opt = build()
    with metamem.trace(device="cpu", modules=[module]) as t:
        steps(module, opt)
    real = build()
    assert t.peak_bytes == metamem.achieved_cpu(lambda: steps(*real), modules=[real[0]])
    assert all(p.requires_grad and p.grad is None for p in module.parameters()) and len(opt.state) == 0

    # Loaded and moved in the block: torch's loader stopped there ("Attempted
    # to set the storage of a tensor on device meta to a storage on different
    # device cpu"), and a ScriptModule's .cuda() in Module._apply ("param must
    # be a Parameter").
    def loading(device):
        module = torch.jit.load(str(tmp_path / "net.pt")).to(device)
        steps(module, torch.optim.AdamW(module.parameters()))
    with metamem.trace(device="cpu") as t:
        loading("cpu")
    assert t.peak_bytes == metamem.achieved_cpu(lambda: loading("cpu"))
    with metamem.trace(device="cuda") as loaded:
        with torch.device("cuda"):
            loading("cuda")
    module, opt = build()
    with metamem.trace(device="cuda", modules=[module]) as moved, torch.device("cuda"):
        steps(module, torch.optim.AdamW(module.parameters()))
    assert loaded.step_peaks == moved.step_peaks
    addresses = [p.data_ptr() for p in module.parameters()]
    with metamem.trace(device="cuda") as moved_in_the_block:
        steps(module.cuda(), opt)
    assert moved_in_the_block.step_peaks == moved.step_peaks
    assert [p.data_ptr() for p in module.parameters()] == addresses and len(opt.state) == 0
    with torch.jit.optimized_execution(False):
        module(torch.randn(4, 8)).sum().backward()  # on the CPU, as before the block


@pytest.mark.parametrize("onednn", [True, False], ids=["onednn", "native"])
@pytest.mark.parametrize("precision", ["f32", "bf16_autocast", "bf16", "f16"])
def test_cpu_products_and_gelus_are_traced_as_the_real_run_takes_them(precision, onednn):
    # oneDNN's matmul takes bf16 and f16 products where the CPU runs them
    # in oneDNN, and its eltwise kernel float32 and bf16 GELUs: a trace
    # records both from the real kernel.
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)

    def step():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 32)).to(dtype)
        x = torch.randn(4, 16, 64, dtype=dtype, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16_autocast"):
            y = model(x)
            z = torch.bmm(y, y.transpose(1, 2)) + torch.mv(y[0], y[0, 0])[None, :, None]
        z.float().sum().backward()
    with torch.backends.mkldnn.flags(enabled=onednn):
        traced, achieved = trace_and_run(step)
    assert traced == achieved


def test_a_spectrograms_magnitude_is_real_valued():
    # abs of a complex tensor is float32: a trace had kept complex64, and a
    # convolution over a spectrogram's magnitude stopped on its dtype.
    def step():
        audio = torch.randn(4, 16000, requires_grad=True)
        spectrum = torch.stft(audio, 400, 160, window=torch.hann_window(400), return_complex=True)
        magnitude = spectrum.abs()
        assert magnitude.dtype == torch.float32 and spectrum.dtype == torch.complex64
        magnitude.add(1e-6).log().sum().backward()

    traced, achieved = trace_and_run(step)
    assert traced == achieved
    with metamem.trace(device="cuda"):
        with pytest.raises(RuntimeError, match="In-place abs is not supported for complex tensors"):
            torch.randn(4, dtype=torch.complex64, device="cuda").abs_()


def test_onednns_and_nnpacks_convolutions_hold_what_the_native_ones_do_not():
    # The check above can fail: the three paths' peaks differ.
    def traced_peak(layers, onednn, nnpack):
        make, shape = CONVOLUTIONS[layers]
        with torch.backends.mkldnn.flags(enabled=onednn), torch.backends.nnpack.flags(enabled=nnpack), \
                metamem.trace(device="cpu") as t:
            make()(torch.randn(*shape)).sum().backward()
        return t.peak_bytes
    assert traced_peak("conv3d", True, True) < 0.5 * traced_peak("conv3d", False, False)
    assert traced_peak("conv2d", False, True) < 0.8 * traced_peak("conv2d", False, False)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_recomputed_modules_are_the_steps_recomputation_and_every_step_has_its_forward(reentrant):
    # torch.utils.checkpoint stops its (non-reentrant) recomputation with an
    # exception inside the last module it needs: module paths must not keep
    # it, or the next step's forward is not seen as one.
    def step():
        model = Checkpointed(reentrant)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            model(torch.randn(16, 64, requires_grad=True)).sum().backward()
            opt.step()
    with metamem.trace(device="cpu") as t:
        step()
    nodes = t.json(depth=3)["nodes"]
    forward = [n for n in nodes if n["phase"] == "forward"]
    recomputed = [n for n in nodes if n["phase"] == "recompute"]
    assert {n["module"] for n in forward if n["op"] == "aten::addmm"} == {
        f"Checkpointed.blocks.{b}.{layer}" for b in range(3) for layer in (0, 2)}
    # Non-reentrant recomputation stops after the GELU, whose output is the
    # last tensor backward needs; reentrant runs each block whole again.
    products = {n["module"]: n["fwd_flops"] for n in forward if n["op"] == "aten::addmm"}
    again = [n["module"] for n in recomputed if n["op"] == "aten::addmm"]
    assert sorted(again) == sorted(f"Checkpointed.blocks.{b}.{layer}" for b in range(3)
                                   for layer in ((0, 2) if reentrant else (0,)))
    assert t.flops["recompute"] == sum(n["recompute_flops"] for n in nodes)
    assert t.flops["recompute"] > sum(products[module] for module in again)
    assert t.flops["total"] > t.flops["recompute"]


def test_a_module_whose_forward_raises_leaves_the_module_path():
    class Refuses(torch.nn.Module):
        def forward(self, x):
            raise ValueError("no")

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.refuses, self.linear = Refuses(), torch.nn.Linear(8, 8)

        def forward(self, x):
            try:
                self.refuses(x)
            except ValueError:
                pass
            return self.linear(x)

    with metamem.trace(device="cpu") as t:
        Model()(torch.randn(4, 8)).sum().backward()
    assert {n["module"] for n in t.json(depth=3)["nodes"] if n["op"] == "aten::addmm"} == {"Model.linear"}


@pytest.mark.parametrize("peak_of, budget, expected", [
    (lambda k: 1000 - 37 * k, 1000 - 37 * 9, 9),                   # a line: read off it
    (lambda k: 1000 - 37 * k + 1, 1000 - 37 * 9, 10),              # just over with nine
    (lambda k: 1000 - 3 * k * k, 1000 - 3 * 81, 9),                # faster than a line
    (lambda k: 1000 - 37 * min(k, 12), 500, None),                 # no count fits
    (lambda k: 1000 - 37 * k, 2000, 0),                            # fits without recomputing
])
def test_the_fewest_layers_recomputed_are_read_off_the_line_of_all_and_all_but_one(peak_of, budget, expected):
    from metamem._checkpointing import least_recompute

    asked = []

    def measure(plan):
        recomputed = plan.recomputed(16)
        asked.append((recomputed, plan.selective))
        return peak_of(recomputed), 100 * recomputed, 10_000
    found = least_recompute(measure, 16, budget, solver="layers")
    assert len(asked) == len(set(asked))
    if expected is None:
        assert found["plan"] is None and found["lowest_peak"] == peak_of(16)
        return
    assert found["plan"] == metamem.Checkpointing(expected) and found["peak"] == peak_of(expected) <= budget
    assert expected == 0 or peak_of(expected - 1) > budget
    assert found["recompute_flops"] == 100 * expected and found["traces"] == len(asked)
    if peak_of(1) == 1000 - 37:
        assert asked == [(0, False)] if expected == 0 else asked == [(0, False), (16, False), (15, False),
                                                                      (9, False), (8, False)]
    peaks = [point[1] for point in found["pareto"]]
    assert peaks == sorted(peaks) and [p[2] for p in found["pareto"]] == sorted(p[2] for p in found["pareto"])[::-1]


def test_the_plan_that_recomputes_least_wins_and_pareto_traces_every_count():
    from metamem._checkpointing import least_recompute

    # Selective recomputation keeps 60 of every layer's 100 bytes and recomputes a tenth of its FLOPs.
    def measure(plan):
        k = plan.recomputed(8)
        return (2000 - 60 * k, 10 * k, 10_000) if plan.selective else (2000 - 100 * k, 100 * k, 10_000)
    found = least_recompute(measure, 8, 1700, solver="auto")
    assert found["plan"] == metamem.Checkpointing(5, selective=True) and found["recompute_flops"] == 50
    assert least_recompute(measure, 8, 1500, solver="auto")["plan"] == metamem.Checkpointing(5)
    assert least_recompute(measure, 8, 1500, solver="selective")["plan"] is None
    whole = least_recompute(measure, 8, 1700, solver="auto", pareto=True)
    assert whole["traces"] == 1 + 8 + 8 and whole["plan"] == found["plan"]
    assert whole["pareto"][0] == (1200, 1200, 800) and whole["pareto"][-1] == (2000, 2000, 0)
    with pytest.raises(ValueError, match="solver must be one of"):
        least_recompute(measure, 8, 1700, solver="rotor")


@pytest.mark.parametrize("split", [
    lambda y: (y[:3], y[3:]),
    lambda y: torch.hsplit(y, [1, 3]),
    lambda y: torch.vsplit(y, 2),
], ids=["slices", "hsplit", "vsplit"])
def test_gradients_of_parts_are_added_in_place_as_autograd_does(split):
    # Autograd adds the second gradient of y into the first when nothing else
    # holds the first's storage: a trace must count that storage's holders.
    def step():
        x = torch.randn(6, 4, requires_grad=True)
        y = x * 2
        sum(part.exp().sum() for part in split(y)).backward()
    traced, achieved = trace_and_run(step)
    assert traced == achieved


def test_a_traced_tensor_has_a_storage_shared_by_its_views_and_no_data():
    with metamem.trace(device="cuda"):
        x = torch.ones(4, 8, device="cuda")
        storage = x.untyped_storage()
        assert storage.nbytes() == 128 and storage.device == x.device
        assert x[1:].untyped_storage()._cdata == storage._cdata
        assert torch.ones(4, 8, device="cuda").untyped_storage()._cdata != storage._cdata
    with metamem.trace(device="cpu"):
        with pytest.raises(RuntimeError, match="a traced tensor has no data"):
            torch.ones(3).numpy()
        with pytest.raises(RuntimeError, match="a traced tensor has no data"):
            torch.ones(3).data_ptr()


def test_a_traced_tensor_on_fake_cuda_lies_where_the_allocator_put_it():
    # data_ptr() is the block's address in the simulated caching allocator:
    # 512-byte blocks, split from one 2 MiB segment, the freed block reused.
    with metamem.trace(device="cuda"):
        x = torch.ones(4, 8, device="cuda")
        y = torch.ones(100, device="cuda")
        assert y.data_ptr() == x.data_ptr() + 512 and x.data_ptr() % (2 << 20) == 0
        assert x[1:].data_ptr() == x.data_ptr() + 32 == x[1:].untyped_storage().data_ptr() + 32
        first = x.data_ptr()
        del x
        assert torch.ones(8, device="cuda").data_ptr() == first
    assert torch.ones(3).numpy().sum() == 3


def test_a_storage_held_by_python_keeps_its_memory():
    def step():
        kept = torch.ones(1024).untyped_storage()  # its tensor dies here
        torch.ones(1024).exp()
        assert kept.nbytes() == 4096
    traced, achieved = trace_and_run(step)
    assert traced == achieved == 3 * 4096


def test_a_storage_resized_frees_and_remakes_its_buffer_as_fsdp2_does():
    def step():
        weight = torch.ones(1024)
        view = weight[:512]  # a view, as a saved tensor is
        storage = weight.untyped_storage()
        assert storage.data_ptr() != 0 and storage.data_ptr() == view.untyped_storage().data_ptr()
        storage.resize_(0)  # freed after forward
        torch.ones(256).exp()
        storage.resize_(4096)  # gathered again for backward
        torch.ones(256).exp()
        assert view.untyped_storage().nbytes() == 4096
    traced, achieved = trace_and_run(step)
    assert traced == achieved == 4096 + 2 * 1024


def test_copy_deepcopy_of_a_model_is_exact_on_cpu():
    def step():
        model = torch.nn.Linear(64, 64)
        ema = copy.deepcopy(model)  # parameters are copied by clone()
        (model(torch.ones(8, 64)) + ema(torch.ones(8, 64))).sum().backward()
    traced, achieved = trace_and_run(step)
    assert traced == achieved


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_logsumexp_holds_its_shifted_copy_as_the_real_cpu_run(dtype):
    # torch's logsumexp subtracts the maxima from a copy of its input (an
    # integer input cast to float first), then sums its exponentials and
    # gradients flow through its own formula. Before, traced as one op:
    # 12,866,048 B where the real run holds 25,732,096 B (64 x 50,257).
    def step():
        x = torch.randn(64, 5000).to(dtype)
        if dtype.is_floating_point:
            x.requires_grad_()
        out = x.logsumexp(-1) + torch.logsumexp(x, (0, 1), keepdim=True)
        if dtype.is_floating_point:
            out.sum().backward()
    traced, achieved = trace_and_run(step)
    assert traced == achieved


TRANSPOSED_COPIES = {
    "contiguous": lambda x: x.t().contiguous(),
    "copy_": lambda x: torch.empty(x.shape[::-1], dtype=x.dtype).copy_(x.t()),
    "copy_ into another dtype": lambda x: torch.empty(x.shape[::-1], dtype=torch.float64).copy_(x.t()),
    "clone preserving its strides": lambda x: x.t().clone(),
    "reshape": lambda x: x.t().reshape(-1),
    "max": lambda x: x.t().max(),
    "argmin": lambda x: x.t().argmin(),
    "max of a permuted 3-d": lambda x: x.view(10, -1, 100).permute(2, 0, 1).max(),
    "argmax of a slice": lambda x: x[:, :500].argmax(),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8])
@pytest.mark.parametrize("copy", list(TRANSPOSED_COPIES))
def test_a_transposed_matrix_is_copied_through_the_cpus_block_buffer_as_the_real_run(copy, dtype):
    # A contiguous copy of a transposed matrix of its type goes through a
    # 60 x 60 buffer (120 x 120 bytes); a whole tensor's max and min read it
    # contiguous, argmax and argmin flat. Before: 8,000,000 B traced for a
    # 1000 x 1000 f32 transposed and copied, 8,014,400 B real; its max
    # 4,000,004 B against 8,014,404 B.
    def step():
        x = (torch.rand(1000, 1000) * 100).to(dtype)
        TRANSPOSED_COPIES[copy](x)
    traced, achieved = trace_and_run(step)
    assert traced == achieved


@pytest.mark.parametrize("out_bins", [100, 10])
@pytest.mark.parametrize("low, high", [(0, 0), (-3, 3)])
def test_histc_into_out_holds_what_histc_holds_as_the_real_cpu_run(low, high, out_bins):
    # Its bins + 1 edges and a bins-long count per thread, as histc's own
    # (out= was traced holding none: 400,400 B against 401,604 B).
    def step():
        torch.histc(torch.randn(100000), 100, low, high, out=torch.empty(out_bins))
    traced, achieved = trace_and_run(step)
    assert traced == achieved


@pytest.mark.parametrize("dtype, to", [(torch.bool, None), (torch.int32, None), (torch.float32, torch.float64),
                                       (torch.float16, torch.float32), (torch.float32, None)])
def test_a_cumulative_sum_scans_its_input_cast_to_the_results_dtype_as_the_real_cpu_run(dtype, to):
    # cumsum and cumprod scan self.to(the result's dtype): an integer
    # input's int64 copy, or the dtype asked for. Before, traced without
    # it: a running count of 50,000 bools 450,000 B where the real run holds
    # 850,000 B.
    def step():
        x = torch.ones(50000).to(dtype)
        x.cumsum(0, dtype=to)
        x.t().cumprod(0, dtype=to)
        torch.cumsum(x, 0, dtype=to, out=torch.empty(50000, 2, dtype=to or torch.long)[:, 0])
        torch.ones(300, 200).to(dtype).t().cumsum(0, dtype=to)
    traced, achieved = trace_and_run(step)
    assert traced == achieved


INNER_OPS = {
    "one sample": lambda dtype: torch.multinomial(torch.rand(16, 5000, dtype=dtype), 1),
    "eight samples": lambda dtype: torch.multinomial(torch.rand(16, 5000, dtype=dtype), 8),
    "three samples of one row": lambda dtype: torch.multinomial(torch.rand(5000, dtype=dtype), 3),
    "eight samples with replacement": lambda dtype: torch.multinomial(torch.rand(16, 5000, dtype=dtype), 8, True),
    "scattered mean": lambda dtype: torch.zeros(1000, 64, dtype=dtype).scatter_reduce_(
        0, torch.randint(0, 1000, (20000, 64)), torch.randn(20000, 64).to(dtype), "mean"),
    "scattered mean without self": lambda dtype: torch.zeros(1000, 64, dtype=dtype).scatter_reduce(
        0, torch.randint(0, 1000, (20000, 64)), torch.randn(20000, 64).to(dtype), "mean", include_self=False),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("op", list(INNER_OPS))
def test_sampling_and_scattered_means_hold_their_inner_ops_as_the_real_cpu_run(op, dtype):
    # multinomial checks its probabilities (aminmax, sums) and divides them
    # by exponential noise as large as them, or with replacement sums each
    # row into a buffer (float for 16-bit types); scatter_reduce's mean
    # counts through ones like src and a scatter_add_ (its float copy of
    # 16-bit counts). Before, traced without them: a multinomial of one
    # sample from 16 x 50,257 floats 3,216,576 B where the real run holds
    # 6,433,034 B, a scattered mean 15,616,000 B against 21,056,012 B.
    traced, achieved = trace_and_run(lambda: INNER_OPS[op](dtype))
    assert traced == achieved


DISTRIBUTIONS = {
    "Dirichlet rsample and its gradient": lambda dtype: torch.distributions.Dirichlet(
        torch.randn(64, 10, dtype=dtype).exp().requires_grad_()).rsample().sum().backward(),
    "Dirichlet sample of 2 x 100,000": lambda dtype: torch.distributions.Dirichlet(
        torch.randn(2, 100000, dtype=dtype).exp()).sample(),
    "Beta sample (mixup's weights)": lambda dtype: torch.distributions.Beta(
        torch.full((100000,), 0.4, dtype=dtype), torch.full((100000,), 0.4, dtype=dtype)).sample(),
    "Gamma rsample and its gradient": lambda dtype: torch.distributions.Gamma(
        torch.randn(100000, dtype=dtype).exp().requires_grad_(), 1.0).rsample().sum().backward(),
    "Binomial sample": lambda dtype: torch.distributions.Binomial(10, torch.full((100000,), 0.5, dtype=dtype)).sample(),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("distribution", list(DISTRIBUTIONS))
def test_distributions_sample_through_their_own_kernels_as_the_real_cpu_run(distribution, dtype):
    # Dirichlet (Beta is one of two) draws its gammas as doubles beside the
    # result and divides them by their sums over the last dimension. Before,
    # these stopped: no meta kernel for _sample_dirichlet,
    # _standard_gamma_grad, _dirichlet_grad or binomial.
    traced, achieved = trace_and_run(lambda: DISTRIBUTIONS[distribution](dtype))
    assert traced == achieved


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, fused=True),
    lambda ps: torch.optim.Adagrad(ps, fused=True),
    lambda ps: torch.optim.AdamW(ps, fused=True),
    lambda ps: torch.optim.Adam(ps, lr=torch.tensor(1e-3), fused=True),
], ids=["SGD", "Adagrad", "AdamW", "Adam with a learning rate tensor"])
def test_fused_optimizer_steps_are_exact_against_the_real_cpu_run(make):
    # torch.optim's fused=True steps update in place and hold nothing; fused
    # SGD and Adagrad, and a learning rate given as a tensor, stopped before.
    def step():
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
        optimizer = make(model.parameters())
        for _ in range(2):
            model(torch.randn(32, 64)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    traced, achieved = trace_and_run(step)
    assert traced == achieved


def test_a_scattered_mean_of_integers_counts_without_a_cast_as_the_real_cpu_run():
    traced, achieved = trace_and_run(lambda: torch.zeros(1000, 64, dtype=torch.long).scatter_reduce(
        0, torch.randint(0, 1000, (20000, 64)), torch.ones(20000, 64, dtype=torch.long), "mean"))
    assert traced == achieved


def test_copy_deepcopy_of_a_tensor_copies_its_whole_storage_and_known_values():
    # A plain tensor's copy is a copy of its storage, made by torch.UntypedStorage's
    # constructor, which takes c10's default CPU allocator: achieved_cpu cannot count
    # it, so the bytes are checked here on the fake GPU.
    real = torch.arange(4)
    with metamem.trace(device="cuda"):
        weights = torch.ones(1024, device="cuda")
        half = copy.deepcopy(weights[512:])
        assert half.untyped_storage().nbytes() == 4096 and half.storage_offset() == 512
        assert torch.cuda.memory_allocated() == 2 * 4096
        state = copy.deepcopy({"step": torch.tensor(3.0), "positions": torch.arange(4)})
        assert state["step"].item() == 3.0 and state["positions"].tolist() == [0, 1, 2, 3]
        copied = copy.deepcopy(real)  # a real tensor's copy is real, as its ops are
        assert not metamem._metamem.is_traced(copied) and copied.tolist() == [0, 1, 2, 3]


def test_a_model_built_on_the_meta_device_holds_nothing_until_materialized():
    with metamem.trace(device="cuda") as t:
        with torch.device("meta"):
            model = torch.nn.Linear(1024, 1024)
        assert model.weight.is_meta and torch.cuda.memory_allocated() == 0
        model.to_empty(device="cuda")
        assert model.weight.device.type == "cuda"
        assert torch.cuda.memory_allocated() == 1024 * 1024 * 4 + 4096
    assert t.peak_bytes == 1024 * 1024 * 4 + 4096


@pytest.mark.parametrize("dtype, mask, causal, length", [
    (torch.float32, None, False, 40),
    (torch.float32, "bool", False, 40),
    (torch.float32, "float", False, 40),
    (torch.float32, None, True, 200),
    (torch.bfloat16, None, False, 40),
    (torch.float16, None, True, 40),
], ids=["f32", "bool_mask", "float_mask", "causal_long", "bf16", "f16_causal"])
def test_sdpa_on_cpu_is_its_flash_kernel(dtype, mask, causal, length):
    # Backward allocates a row-sum buffer (one block of query rows in the
    # accumulation type) inside each OpenMP worker. metamem takes the
    # workers' buffers live at once, as on an idle machine; on a loaded one
    # the real run may finish one worker before the next starts, and come
    # in under by exactly the buffers that did not overlap. In bf16 and f16
    # with oneDNN on, the kernel's products run through oneDNN, whose
    # temporaries are a known gap (the test after this one): these run with
    # oneDNN off.
    workers = min(torch.get_num_threads(), 2 * 3)
    row_sum = (32 if length < 192 else 64) * 4
    step = sdpa_step(dtype, mask, causal, length)
    with torch.backends.mkldnn.flags(enabled=dtype == torch.float32):
        traced, achieved = trace_and_run(step)
    assert traced - achieved in [k * row_sum for k in range(workers)]


def sdpa_step(dtype, mask, causal, length):
    def step():
        q, k, v = (torch.randn(2, length, 3, 8, dtype=dtype, requires_grad=True) for _ in range(3))
        attn_mask = {None: None,
                     "bool": torch.ones(length, length, dtype=torch.bool).tril(),
                     "float": torch.zeros(2, 1, length, length, dtype=dtype)}[mask]
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=attn_mask, is_causal=causal)
        out.transpose(1, 2).reshape(2, length, 24).pow(2).sum().backward()
    return step


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_sdpa_on_cpu_in_half_precision_with_onednn_on_is_a_known_gap(dtype):
    # The flash backward's products go to oneDNN's gemm where oneDNN runs
    # the dtype, each holding a temporary of oneDNN's sizing inside its
    # worker (docs/accuracy.md); the trace has none. When this fails, the
    # gap is mended: fold these cases into the test above.
    if not {torch.bfloat16: torch.ops.mkldnn._is_mkldnn_bf16_supported,
            torch.float16: torch.ops.mkldnn._is_mkldnn_fp16_supported}[dtype]():
        pytest.skip("oneDNN does not run this dtype on this CPU")
    traced, achieved = trace_and_run(sdpa_step(dtype, None, False, 40))
    assert traced < achieved


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "permuted"])
def test_convolution_gradients_have_the_layout_the_cpu_kernel_gives(layout):
    # Inductor asserts the strides of what an extern kernel returns: a
    # compiled ConvNeXt passes its depthwise convolutions a permuted view.
    def gradients(device):
        torch.manual_seed(0)
        x = torch.randn(2, 2, 32, 2, device=device).permute(0, 2, 1, 3)  # (2, 32, 2, 2), strides (128, 2, 64, 1)
        if layout == "contiguous":
            x = x.contiguous()
        elif layout == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        weight = torch.randn(32, 1, 7, 7, device=device)
        grad_output = torch.randn(2, 32, 2, 2, device=device)
        grads = torch.ops.aten.convolution_backward(grad_output, x, weight, [32], [1, 1], [3, 3], [1, 1], False,
                                                    [0, 0], 32, [True, True, True])
        return [(g.shape, g.stride()) for g in grads]

    real = gradients("cpu")
    with metamem.trace(device="cpu"):
        traced = gradients("cpu")
    assert traced == real


@pytest.mark.parametrize("groups", [1, 4, 64])
@pytest.mark.parametrize("layout", ["permuted", "transposed", "view_with_gaps"])
@pytest.mark.parametrize("leaf", [True, False], ids=["leaf", "inside_the_graph"])
def test_a_convolution_over_a_view_copies_it_into_the_format_it_runs_in(groups, layout, leaf):
    # The native path makes its input contiguous, channels last where the
    # input suggests it, before the groups loop slices it; CoaT convolves
    # the tokens of a transposed sequence, a view with gaps (its class token).
    views = {"permuted": ((2, 14, 14, 64), lambda base: base.permute(0, 3, 1, 2)),
             "transposed": ((2, 64, 14, 14), lambda base: base.transpose(2, 3)),
             "view_with_gaps": ((2, 197, 64), lambda base: base[:, 1:].transpose(1, 2).view(2, 64, 14, 14))}
    shape, view = views[layout]

    def step():
        torch.manual_seed(0)
        conv = torch.nn.Conv2d(64, 64, 3, padding=1, groups=groups)
        base = torch.randn(shape, requires_grad=not leaf)
        x = view(base).detach().requires_grad_() if leaf else view(base)
        conv(x).sum().backward()
    traced, achieved = trace_and_run(step)
    assert traced == achieved


def test_model_built_before_the_block_runs_on_the_fake_device_and_is_restored():
    model = torchvision.models.resnet18(num_classes=10)
    weight = model.conv1.weight
    before = weight.detach().clone()

    def step():
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(2, 3, 32, 32)).sum().backward()
        opt.step()
        model.zero_grad(set_to_none=True)

    with metamem.trace(device="cuda", modules=[model]) as t:
        assert model.conv1.weight.device.type == "cuda"
        step()
    assert model.conv1.weight is weight and torch.equal(weight, before)
    assert model.conv1.weight.grad is None
    traced, achieved = trace_and_run(step, modules=[model])
    assert traced == achieved
    assert t.peak_bytes > 0


def test_tied_weights_of_a_model_built_before_the_block_stay_tied():
    class TiedLM(torch.nn.Module):  # the head's weight is the embedding's, as in GPT-2 and BERT
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(256, 64)
            self.head = torch.nn.Linear(64, 256, bias=False)
            self.head.weight = self.embedding.weight

        def forward(self, ids):
            return self.head(self.embedding(ids))

    model = TiedLM()

    def step():
        opt = torch.optim.AdamW(model.parameters())
        ids = torch.randint(0, 256, (2, 32))
        torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
        opt.step()
        model.zero_grad(set_to_none=True)

    with metamem.trace(device="cpu", modules=[model]):
        assert model.head.weight is model.embedding.weight
    # One weight, one gradient, one pair of AdamW moments: 256 x 64 x 4 B each.
    traced, achieved = trace_and_run(step, modules=[model])
    assert traced == achieved
    assert model.head.weight is model.embedding.weight

    # Moved in the block, where torch moves the shared weight in place once:
    # two new Parameters before (untied), one now, with its hook run once.
    hooked = []
    model.embedding.weight.register_hook(lambda grad: hooked.append(grad.shape))
    with metamem.trace(device="cuda") as moved:
        model.cuda()
        assert model.head.weight is model.embedding.weight
        step()
    assert len(hooked) == 1 and model.head.weight is model.embedding.weight
    with metamem.trace(device="cuda", modules=[model]) as handed:
        step()
    assert moved.step_peaks == handed.step_peaks and len(hooked) == 2


def test_a_module_two_parents_hold_is_replaced_once():
    # CoaT's blocks hold their stage's position encodings, which the model
    # holds too: one module met twice in a walk of the model.
    shared = torch.nn.Conv1d(32, 32, 3, padding=1, groups=32)
    model = torch.nn.Sequential(torch.nn.Sequential(shared, torch.nn.GELU()), torch.nn.Sequential(shared))
    original = shared.weight

    def step():
        model(torch.randn(4, 32, 64)).sum().backward()
        model.zero_grad(set_to_none=True)

    with metamem.trace(device="cpu", modules=[model]) as t:
        assert model[0][0].weight is model[1][0].weight
        assert model[0][0].weight.device.type == "cpu" and model[0][0].weight is not original
        step()
    assert t.json()["model_states"]["param_bytes"] == (32 * 3 + 32) * 4
    traced, achieved = trace_and_run(step, modules=[model])
    assert traced == achieved
    assert shared.weight is original


def test_a_buffer_a_model_built_before_the_block_replaces_is_freed():
    # ConViT replaces a placeholder buffer with its relative positions at
    # its first forward: the placeholder's memory goes then, in the real run
    # and in the trace, where only the module holds its replacement.
    class Positions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("positions", torch.zeros(1, 1, 4096), persistent=False)

        def forward(self, x):
            if self.positions.shape[1] != x.shape[1]:
                self.positions = torch.zeros(1, x.shape[1], 1, device=x.device)
            return x + self.positions

    metamem.achieved_cpu(lambda: None)  # counting from before the model is built, to see its buffer go
    model = torch.nn.Sequential(Positions())
    with metamem.trace(device="cuda", modules=[model]):
        assert torch.cuda.memory_allocated() == 4096 * 4
        with torch.no_grad():
            model(torch.randn(2, 8, 16, device="cuda"))
        # The new positions' 32 B, in a block of 512; the input and output are gone.
        assert torch.cuda.memory_allocated() == 512

    model = torch.nn.Sequential(Positions())

    def step():
        model(torch.randn(2, 8, 16)).sum()

    traced, achieved = trace_and_run(step, modules=[model])
    assert traced == achieved


def test_an_rnn_built_before_the_block_gets_its_own_weights_back():
    # An RNN keeps a list of its weights beside its parameters, which moving
    # it inside the block fills with the block's weights.
    lstm = torch.nn.LSTM(8, 16, num_layers=2)
    weights = list(lstm._flat_weights)
    with metamem.trace(device="cuda", modules=[lstm]):
        lstm.to("cuda")
        lstm(torch.randn(3, 2, 8, device="cuda"))[0].sum().backward()
    assert all(now is before for now, before in zip(lstm._flat_weights, weights))
    assert all(ref() is w for ref, w in zip(lstm._flat_weight_refs, weights))


def test_fake_cuda_looks_like_a_gpu_and_allocates_nothing():
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with metamem.trace(device="cuda") as t:
        x = torch.randn(4, 8, device="cuda")
        assert str(x.device) == "cuda:0" and torch.cuda.is_available()
        big = torch.nn.Linear(16384, 16384).cuda()  # 1 GiB of parameters, never allocated
        big(torch.randn(2, 16384, device="cuda")).sum().backward()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 256 * 1024  # KiB
    assert t.peak_bytes > 2 * 16384 * 16384 * 4  # weights and their gradients
    assert not torch.cuda.is_available()


def test_reports_render_the_cli_report_model(tmp_path):
    with metamem.trace(device="cuda") as t:
        training_step(lambda: torchvision.models.resnet18(num_classes=10), (2, 3, 32, 32), torch.optim.AdamW)()
    assert "predicted peak" in t.report() and "optimizer states" in t.report()
    modules = t.table("modules", depth=2)
    assert "ResNet.layer1" in modules and "ResNet.fc" in modules
    assert t.table("nodes", csv=True).startswith("name,op,module,phase")
    report = t.json()
    assert report["predicted"]["peak_bytes"] == t.peak_bytes
    assert report["optimizer"] == "AdamW" and report["model"] == "ResNet"
    # Adam's two moments; its step counters are host tensors, as on a GPU.
    assert report["model_states"]["optimizer_bytes"] == 2 * report["model_states"]["param_bytes"]
    t.snapshot(tmp_path / "s.pickle")
    assert pickle.loads((tmp_path / "s.pickle").read_bytes())["device_traces"]
    with pytest.raises(ValueError):
        t.table("rows")


def test_the_html_page_is_the_clis_and_renders_in_a_browser(tmp_path):
    with metamem.trace(device="cuda") as t:
        assert t._repr_html_() is None  # a notebook shows nothing before the block ends
        with pytest.raises(RuntimeError, match="after its block ends"):
            t.html(tmp_path / "early.html")
        training_step(lambda: torchvision.models.resnet18(num_classes=10), (2, 3, 32, 32), torch.optim.AdamW)()
    t.html(tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()
    assert "ResNet.layer1" in page and str(t.peak_bytes) in page
    assert "http://" not in page and "https://" not in page  # nothing is fetched
    # In a notebook: the same page, in a frame of its own.
    assert t._repr_html_() == f'<iframe srcdoc="{html.escape(page, quote=True)}" ' \
                              'style="width: 100%; height: 900px; border: 0"></iframe>'
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no Chromium to render the page (scripts/common.sh installs it)")
    dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                          (tmp_path / "report.html").as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert '<svg id="timeline"' in dom and 'data-rendered="true"' in dom and "data-errors=" not in dom


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("make, message", [
    (lambda: F.unfold(torch.randn(2, 3, 8, 8), 3, stride=0), "stride should be greater than zero"),
    (lambda: F.unfold(torch.randn(2, 3, 8, 8), 0), "kernel size should be greater than zero"),
    (lambda: F.fold(torch.randn(2, 27, 36), (8, 8), 3, dilation=0), "dilation should be greater than zero"),
], ids=["unfold_stride_0", "unfold_kernel_0", "fold_dilation_0"])
def test_unfold_arguments_torch_refuses_are_refused_in_its_words(device, make, message):
    # The trace's own im2col divided by the stride before any check: a
    # stride of 0 stopped the process (SIGFPE).
    with pytest.raises(RuntimeError, match=message):
        with metamem.trace(device=device):
            make()


def test_unsupported_ops_raise_named_errors_and_the_block_restores_everything():
    original_backward = torch.autograd.backward
    for code, op in [(lambda: torch.nonzero(torch.randn(10)), "aten::nonzero"),
                     (lambda: bool(torch.randn(3).sum() > 0), "aten::_local_scalar_dense")]:
        with pytest.raises(metamem.UnsupportedOpError) as error:
            with metamem.trace(device="cuda"):
                code()
        assert error.value.op == op and isinstance(error.value, NotImplementedError)
    assert torch.autograd.backward is original_backward and not torch.cuda.is_available()
    x = torch.ones(3, requires_grad=True)
    (x * 2).sum().backward()  # real tensors, real values
    assert x.grad.tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(ZeroDivisionError):
        with metamem.trace(device="cpu"):
            torch.nn.Linear(4, 4)(torch.randn(2, 4))
            1 / 0
    assert torch.randn(2).add(1).shape == (2,)


def test_device_dependent_python_metas_follow_the_fake_device():
    # torch's FFT meta functions lay their output out as MKL does on CPU and
    # as cuFFT does on CUDA; a plain meta tensor reads as CUDA to them.
    device_hint = torch._meta_registrations.device_hint
    real = torch.fft.rfftn(torch.randn(5, 6, 7))
    strides = {}
    for device in ("cpu", "cuda"):
        with metamem.trace(device=device):
            strides[device] = torch.fft.rfftn(torch.randn(5, 6, 7, device=device)).stride()
    assert strides == {"cpu": real.stride(), "cuda": (6, 1, 30)}
    assert torch._meta_registrations.device_hint is device_hint

    def step():  # the gradient of a sum is expanded: MKL copies it
        x = torch.randn(4, 6, 8, requires_grad=True)
        torch.fft.irfft(torch.fft.rfft(x, dim=1), n=6, dim=1).sum().backward()
    traced, achieved = trace_and_run(step)
    assert traced == achieved


def python_meta_functions_run(code):
    """The functions of torch._meta_registrations that `code` calls."""
    called = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename == torch._meta_registrations.__file__:
            called.add(frame.f_code.co_name)
    sys.setprofile(profile)
    try:
        code()
    finally:
        sys.setprofile(None)
    return called


def test_a_trace_runs_cpp_meta_kernels_and_leaves_torchs_python_ones_to_everyone_else():
    def ops(device):
        x = torch.empty(4, 8, device=device)
        z = torch.zeros_like(x)  # a composite C++ kernel below the Python function
        y = torch.mm(x, x.t())  # a C++ meta kernel below it
        ends = torch.zeros(()), torch.ones(())
        return x, z, y, torch.linspace(*ends, 5, device=device)  # a composite that reads start.item()

    with metamem.trace(device="cpu"):
        pass  # the first block puts metamem's kernels above torch's
    dispatch = torch._C._dispatch_dump("aten::zeros_like")
    outside = python_meta_functions_run(lambda: ops("meta"))
    with metamem.trace(device="cpu") as t:
        inside = python_meta_functions_run(lambda: ops("cpu"))
        assert torch._C._dispatch_dump("aten::zeros_like") == dispatch
    assert {"zeros_like", "meta_mm"} <= outside
    assert "zeros_like" not in inside and "meta_mm" not in inside
    assert t.peak_bytes == (32 + 32 + 16 + 1 + 1 + 5) * 4  # x.t() is a view
    assert torch._C._dispatch_dump("aten::zeros_like") == dispatch


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_values_made_from_python_numbers_are_known(device):
    rates = torch.linspace(0, 0.1, 3).tolist()

    def step():
        mask = torch.ones(2, 8, device=device).bool()[:, torch.arange(8, device=device)]
        assert bool(mask.sum() == mask.numel())  # transformers' fast_all(padding_mask)
        assert torch.linspace(0, 0.1, 3, device=device).tolist() == rates  # timm's drop-path rates
        counts = torch.zeros(3, device=device)
        counts.add_(2)
        assert counts.tolist() == [2.0, 2.0, 2.0]
        return mask, counts

    tolist = torch.Tensor.tolist
    with metamem.trace(device=device) as t:
        step()
        partly = torch.ones(4, device=device)
        partly[:2] = torch.randn(2, device=device)  # random values: unknown from here on
        for unknown in (partly, torch.rand(3, device=device)):
            with pytest.raises(metamem.ValueReadError):
                unknown.sum().item()
    assert torch.Tensor.tolist is tolist
    if device == "cpu":  # the values are no memory of the step's
        with metamem.trace(device="cpu") as t:
            step()
        assert t.peak_bytes == metamem.achieved_cpu(step)


def test_trace_is_read_after_its_block():
    with metamem.trace(device="cpu") as t:
        with pytest.raises(RuntimeError):
            t.peak_bytes
        torch.randn(256)
    assert t.peak_bytes == 1024


def test_code_written_for_cuda_runs_on_cpu_traced_and_for_real():
    def step():
        model = torch.nn.Linear(64, 64).cuda()
        model(torch.randn(8, 64, device="cuda")).sum().backward()
    traced, achieved = trace_and_run(step)
    assert traced == achieved


def _searched(search, reserved_of, budget, most=1 << 16):
    """(answer, batches measured) of a largest-batch search over reserved_of."""
    asked = []

    def measure(batch):
        asked.append(batch)
        return reserved_of(batch), reserved_of(batch)

    if search is metamem.largest_batch:
        return search(lambda batch: measure(batch)[1] <= budget, most), asked
    return search(measure, budget, most), asked


@pytest.mark.parametrize("reserved_of, budget", [
    (lambda b: 1000 + 37 * b, 1000 + 37 * 25),                    # a line: read off it
    (lambda b: 1000 + 37 * b + 1, 1000 + 37 * 25),                # just under one more sample
    (lambda b: (1000 + 37 * b + 511) // 512 * 512, 5000),         # rounded to segments
    (lambda b: 1000 + 37 * b + (300 if b > 40 else 0), 2600),     # a step beyond the line's batch
    (lambda b: 1000 + 3 * b * b, 40_000),                         # faster than a line: the guess fails
    (lambda b: 1000 + 37 * b, 500),                               # batch 1 does not fit
    (lambda b: 1000 + 37 * b, 1050),                              # batch 2 does not
    (lambda b: 1000, 2000),                                       # no growth: the cap
])
def test_the_largest_batch_is_read_off_the_line_of_two_batches_and_verified(reserved_of, budget):
    # The same answer as doubling and bisection, each batch measured once;
    # four batches where the reserved bytes follow the line.
    line, asked = _searched(metamem.largest_batch_by_line, reserved_of, budget, most=64)
    assert line == _searched(metamem.largest_batch, reserved_of, budget, most=64)[0]
    assert len(asked) == len(set(asked))
    if reserved_of(1) == 1000 + 37 and budget == 1000 + 37 * 25:
        assert (line, asked) == (25, [1, 2, 25, 26])
    bisection_asked = _searched(metamem.largest_batch, reserved_of, budget, most=64)[1]
    assert len(asked) <= len(bisection_asked) + 2


@pytest.mark.parametrize("search", [metamem.largest_batch, metamem.largest_batch_by_line])
def test_the_largest_batch_is_never_above_most(search):
    # largest_batch gave 1 for most=0, where every batch fit.
    assert [_searched(search, lambda b: 1000, 2000, most=most)[0] for most in (0, 1, 5)] == [0, 1, 5]


def ctc_step(lengths, targets_dtype=torch.long, reduction="mean", zero_infinity=False, device="cpu"):
    """CTC loss of 50 steps, batch 16, 20 classes, targets padded to 30,
    forward and backward; `lengths` "lists" or the dtype of length tensors."""
    def step():
        log_probs = torch.randn(50, 16, 20, device=device).log_softmax(2).detach().requires_grad_()
        targets = torch.randint(1, 20, (16, 30), dtype=targets_dtype, device=device)
        input_lengths, target_lengths = [50] * 16, list(range(15, 31))
        if lengths != "lists":
            input_lengths = torch.tensor(input_lengths, dtype=lengths, device=device)
            target_lengths = torch.tensor(target_lengths, dtype=lengths, device=device)
        loss = F.ctc_loss(log_probs, targets, input_lengths, target_lengths, reduction=reduction,
                          zero_infinity=zero_infinity)
        loss.sum().backward()
    return step


@pytest.mark.parametrize("lengths, targets_dtype, reduction, zero_infinity", [
    ("lists", torch.long, "mean", False),  # the mean's tensor of lengths: libtorch writes it through data_ptr
    ("lists", torch.int32, "none", False),
    (torch.long, torch.long, "mean", False),  # libtorch reads the lengths on the host, through data_ptr
    (torch.int32, torch.long, "mean", False),  # ... after copying them to int64: two copies held by the call
    (torch.int32, torch.int32, "sum", True),
])
def test_ctc_loss_holds_what_the_cpu_run_holds(lengths, targets_dtype, reduction, zero_infinity):
    # Before: every ctc_loss stopped a CPU trace, reading or writing a traced
    # tensor's data. Log-alpha is sized by the longest target (30 here).
    step = ctc_step(lengths, targets_dtype, reduction, zero_infinity)
    with metamem.trace(device="cpu") as t:
        step()
    assert t.peak_bytes == metamem.achieved_cpu(step)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_ctc_loss_with_lengths_the_trace_does_not_know_stops_or_takes_their_bounds(device):
    def step(known):
        log_probs = torch.randn(50, 16, 20, device=device).log_softmax(2).detach().requires_grad_()
        targets = torch.randint(1, 20, (16, 30), device=device)
        input_lengths = torch.full((16,), 50, device=device)
        # Counted from a mask too large for the trace to compute its values.
        target_lengths = (torch.rand(16, 1 << 14, device=device) > 0.5).sum(1).clamp(1, 30)
        if known:
            target_lengths.fill_(30)  # every target as long as the targets are wide
        F.ctc_loss(log_probs, targets, input_lengths, target_lengths).backward()

    with pytest.raises(metamem.ValueReadError, match="ctc_loss sizes its buffers") as error:
        with metamem.trace(device=device):
            step(known=False)
    assert "reads zeros" not in str(error.value)
    with metamem.trace(device=device, values="placeholder") as bounded:
        step(known=False)
    with metamem.trace(device=device) as longest:
        step(known=True)
    assert bounded.peak_bytes == longest.peak_bytes


def packed_rnn_step(module, lengths, batch_first, enforce_sorted=True):
    """An RNN over padded sequences packed by their lengths, its output
    unpacked, forward and backward (libtorch reads the lengths and the
    batch sizes on the host, through data_ptr)."""
    def step():
        torch.manual_seed(0)
        rnn = module(32, 64, num_layers=2, batch_first=batch_first)
        x = torch.randn((4, 10, 32) if batch_first else (10, 4, 32), requires_grad=True)
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor(lengths), batch_first=batch_first,
                                                         enforce_sorted=enforce_sorted)
        padded, _ = torch.nn.utils.rnn.pad_packed_sequence(rnn(packed)[0], batch_first=batch_first)
        padded.sum().backward()
    return step


@pytest.mark.parametrize("module, lengths, batch_first, enforce_sorted", [
    (torch.nn.LSTM, [10, 8, 5, 3], False, True),
    (torch.nn.GRU, [3, 10, 5, 8], True, False),  # sorted, packed, and unsorted again
])
def test_packed_sequences_hold_what_the_cpu_run_holds(module, lengths, batch_first, enforce_sorted):
    traced, achieved = trace_and_run(packed_rnn_step(module, lengths, batch_first, enforce_sorted))
    assert traced == achieved


def test_packing_checks_the_lengths_it_reads_and_stops_where_it_does_not_know_them():
    with pytest.raises(RuntimeError, match="must be sorted in decreasing order"):
        with metamem.trace(device="cpu"):
            packed_rnn_step(torch.nn.LSTM, [3, 10, 5, 8], False)()
    with pytest.raises(metamem.ValueReadError, match="packing sizes the packed data"):
        with metamem.trace(device="cuda"):
            x = torch.randn(10, 4, 8, device="cuda")
            torch.nn.utils.rnn.pack_padded_sequence(x, torch.empty(4, dtype=torch.long))  # values never written


def test_a_custom_op_defined_after_a_trace_is_traced_by_its_fake_implementation():
    # A library that defines an op when one of its modules is first imported
    # (transformers' MoE fallback on GPUs before sm80) may do so after the
    # process's first trace. Its implementation reads values a trace does not
    # have; its fake implementation gives the shape.
    with metamem.trace(device="cpu"):
        torch.ones(2).add_(1)

    @torch.library.custom_op("metamem_test::defined_late", mutates_args=())
    def defined_late(x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(int(x.sum().item()))

    @defined_late.register_fake
    def _(x):
        return x.new_empty(2 * x.shape[0])

    with metamem.trace(device="cpu") as t:
        y = defined_late(torch.ones(16))
        assert y.shape == (32,)
    assert t.peak_bytes == 16 * 4 + 32 * 4
