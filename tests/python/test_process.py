"""A trace never breaks the user's process: printing, globals, threads,
traced objects after the block, a caught OOM, the first distributed trace,
and the command line's errors (issue 45)."""

import copy
import gc
import json
import os
import re
import subprocess
import sys
import threading

import pytest
import torch
import torch._dynamo.config
import torch._inductor.config

import metamem
from metamem import _process


# --- printing ---------------------------------------------------------------

def test_traced_tensors_print_as_meta_tensors_print():
    with metamem.trace(device="cuda"):
        x = torch.randn(8, 64, device="cuda")
        w = torch.randn(64, 4, device="cuda", requires_grad=True)
        loss = (x @ w).pow(2).mean()
        assert repr(x) == "tensor(..., size=(8, 64), device='cuda:0')"
        assert str(loss) == "tensor(..., size=(), device='cuda:0', grad_fn=<MeanBackward0>)"
        assert f"{loss:.3f}" == str(loss)  # no value to format: the tensor as it prints
        # Values the trace knows print as they are.
        assert repr(torch.arange(3, device="cuda")) == "tensor([0, 1, 2], device='cuda:0')"
        assert f"{torch.tensor(2.5, device='cuda') * 2:.2f}" == "5.00"
    with metamem.trace(device="cpu"):
        assert repr(torch.ones(2, 3) + torch.randn(2, 3)) == "tensor(..., size=(2, 3))"


def test_placeholder_values_print_zeros():
    with metamem.trace(device="cuda", values="placeholder"):
        loss = torch.randn(4, 4, device="cuda", requires_grad=True).sum()
        assert f"{loss.item():.3f} {loss:.3f}" == "0.000 0.000"
        assert repr(loss) == "tensor(0., device='cuda:0', grad_fn=<SumBackward0>)"
        assert torch.empty(4, dtype=torch.long, device="cuda").tolist() == [0, 0, 0, 0]


# --- globals ----------------------------------------------------------------

# What code in a block may change, each with how the test reads it: read
# here, not through metamem._process, so that a global metamem forgets fails.
CHANGES = {
    "default device": (lambda: torch.set_default_device("cuda"), lambda: str(torch.get_default_device())),
    "default dtype": (lambda: torch.set_default_dtype(torch.float64), torch.get_default_dtype),
    "grad mode": (lambda: torch.set_grad_enabled(False), torch.is_grad_enabled),
    "inference mode": (lambda: torch.inference_mode().__enter__(), torch.is_inference_mode_enabled),
    "deterministic algorithms": (lambda: torch.use_deterministic_algorithms(True, warn_only=True),
                                 lambda: (torch.are_deterministic_algorithms_enabled(),
                                          torch.is_deterministic_algorithms_warn_only_enabled())),
    "threads": (lambda: torch.set_num_threads(1), torch.get_num_threads),
    "tf32": (lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", True),
             lambda: torch.backends.cuda.matmul.fp32_precision),
    "matmul precision": (lambda: torch.set_float32_matmul_precision("medium"), torch.get_float32_matmul_precision),
    "cudnn": (lambda: (setattr(torch.backends.cudnn, "benchmark", True),
                       setattr(torch.backends.cudnn, "enabled", False)),
              lambda: (torch.backends.cudnn.benchmark, torch.backends.cudnn.enabled)),
    "sdpa": (lambda: torch.backends.cuda.enable_flash_sdp(False), torch.backends.cuda.flash_sdp_enabled),
    "anomaly mode": (lambda: torch.autograd.set_detect_anomaly(True), torch.is_anomaly_enabled),
    "autocast": (lambda: torch.set_autocast_enabled("cuda", True), lambda: torch.is_autocast_enabled("cuda")),
    "print options": (lambda: torch.set_printoptions(precision=1), lambda: torch._tensor_str.PRINT_OPTS.precision),
    "function modes": (lambda: torch.device("cpu").__enter__(), torch._C._len_torch_function_stack),
    "cpu rng": (lambda: torch.manual_seed(1234), lambda: torch.random.get_rng_state().tolist()),
    "excepthook": (lambda: setattr(sys, "excepthook", print), lambda: sys.excepthook),
    "inductor config": (lambda: setattr(torch._inductor.config, "emulate_precision_casts", True),
                        lambda: torch._inductor.config.emulate_precision_casts),
    "dynamo config": (lambda: setattr(torch._dynamo.config, "recompile_limit", 1),
                      lambda: torch._dynamo.config.recompile_limit),
    "a config list changed in place": (lambda: torch._dynamo.config.reorderable_logging_functions.add(print),
                                       lambda: set(torch._dynamo.config.reorderable_logging_functions)),
    "garbage collector": (gc.disable, gc.isenabled),
}


def test_every_setting_reads_and_writes_back_what_it_read():
    for setting in _process.SETTINGS:
        setting.set(setting.get())  # raises where a setting cannot take its own value


def test_compile_settings_first_imported_in_a_block_go_back_to_their_defaults():
    script = """
import sys, warnings
import metamem, torch
assert "torch._inductor.config" not in sys.modules
warnings.simplefilter("error")  # restoring reads no deprecated setting
with metamem.trace(device="cuda"):
    import torch._inductor.config as inductor
    inductor.emulate_precision_casts = True
    inductor.triton.cudagraphs = True
assert inductor._is_default("emulate_precision_casts") and inductor._is_default("triton.cudagraphs")
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_an_error_inside_an_op_leaves_no_dispatch_keys_behind():
    with pytest.raises(metamem.ValueReadError):
        with metamem.trace(device="cuda"):
            torch.randn(3, device="cuda").sum().item()
    assert torch.ones(3).sum().item() == 3.0  # real factories and values, as before
    with metamem.trace(device="cuda") as t:  # and a trace after it
        torch.empty(1024, device="cuda")
    assert t.peak_bytes == 4096


# --- threads ----------------------------------------------------------------

def real_gradients(seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(16, 4)
    model(torch.randn(8, 16)).pow(2).sum().backward()
    return model.weight.grad.clone()


def test_another_threads_autograd_is_its_own():
    expected = real_gradients(7)
    results, errors = [], []

    def work():
        try:
            for _ in range(20):
                results.append(real_gradients(7))
        except Exception as error:  # pragma: no cover - what the test fails on
            errors.append(error)

    def step():
        model = torch.nn.Linear(64, 64).cuda()
        for _ in range(10):
            model(torch.randn(32, 64, device="cuda")).sum().backward()

    with metamem.trace(device="cuda") as alone:
        step()
    worker = threading.Thread(target=work)
    with metamem.trace(device="cuda") as beside:
        worker.start()
        step()
        worker.join()
    assert errors == []
    assert len(results) == 20 and all(torch.equal(g, expected) for g in results)
    assert beside.peak_bytes == alone.peak_bytes


# --- after the block --------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_traced_tensor_raises_when_used_after_its_block(device):
    with metamem.trace(device=device):
        kept = torch.randn(4, 4, device=device)
        model = torch.nn.Linear(4, 4).to(device)
        loss = model(kept).sum()
    with pytest.raises(metamem.TraceEndedError, match="aten::add on a tensor of a trace that has ended"):
        kept + 1
    # Autograd asks a tensor's device for its stream before any kernel runs:
    # the real CUDA runtime, without a GPU, aborted the interpreter there.
    assert kept.device.type == model.weight.device.type == "meta"
    with pytest.raises(metamem.TraceEndedError, match="aten::t on a tensor"):
        model(torch.randn(2, 4))
    with pytest.raises(metamem.TraceEndedError):
        loss.backward()


def small_batch_norm_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 4))


def test_a_model_trained_on_a_fake_cpu_without_modules_is_as_it_was_after_the_block():
    # Its real parameters take traced gradients in backward, and the ops on
    # its real tensors alone run for real: BatchNorm counts its batches,
    # AdamW decays the weights, and makes its state. Before, the next real
    # backward stopped accumulating into the traced .grad (TraceEndedError).
    model = small_batch_norm_net()
    opt = torch.optim.AdamW(model.parameters(), weight_decay=0.5)
    before = {name: t.clone() for name, t in model.state_dict().items()}

    def step():
        model(torch.randn(16, 32)).sum().backward()
        opt.step()

    with metamem.trace(device="cpu") as t:
        step()
        step()
    assert t.peak_bytes > 0
    assert all(torch.equal(t, before[name]) for name, t in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and len(opt.state) == 0
    step()  # trains for real, from where it was
    assert model[1].num_batches_tracked.item() == 1 and opt.state[model[0].weight]["step"].item() == 1


def test_a_move_of_a_model_with_a_sparse_buffer_from_before_the_block():
    # Telling whether a move set a tensor's data in place read its data_ptr(),
    # which a sparse tensor does not have.
    model = torch.nn.Linear(4, 4)
    model.register_buffer("mask", torch.eye(4).to_sparse())
    with metamem.trace(device="cpu") as t:
        model.to(torch.float32)
        model(torch.randn(2, 4)).sum().backward()
    assert t.peak_bytes > 0 and model.mask.is_sparse and torch.equal(model.mask.to_dense(), torch.eye(4))


def test_host_tensors_from_before_a_fake_cuda_block_are_as_they_were_after_it():
    # An average of the weights kept on the CPU (timm's ModelEmaV2 with
    # device="cpu") and a step count: their ops on real tensors alone run
    # for real, and on fake cuda nothing put back what they wrote. After
    # the block the average had decayed twice and the count was 2.
    model = small_batch_norm_net()
    average = copy.deepcopy(model)
    count = torch.zeros((), dtype=torch.int64)
    before = {name: t.clone() for name, t in average.state_dict().items()}
    with metamem.trace(device="cuda") as t:
        model.cuda()
        opt = torch.optim.AdamW(model.parameters())
        for _ in range(2):
            model(torch.randn(16, 32, device="cuda")).sum().backward()
            opt.step()
            with torch.no_grad():
                for kept, now in zip(average.parameters(), model.parameters()):
                    kept.mul_(0.9).add_(now.cpu(), alpha=0.1)
            count += 1
    assert len(t.step_peaks) == 2
    assert all(torch.equal(t, before[name]) for name, t in average.state_dict().items())
    assert count.item() == 0


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_tensor_from_before_the_block_written_with_values_the_trace_knows_is_as_it_was_after_it(device):
    # A count of tokens kept in a tensor from before the block, added to
    # from token ids the trace knows: the op runs for real for its values,
    # and nothing put back what it wrote (the count was 24 after the block).
    seen = torch.zeros(2, dtype=torch.int64)
    with metamem.trace(device=device):
        for _ in range(2):
            ids = torch.randint(0, 4, (3, 4), device=device)
            seen.add_((ids >= 0).sum())
        inside = seen.tolist()
    assert inside == [24, 24] and seen.tolist() == [0, 0]


def test_a_real_gradient_from_before_the_block_is_kept():
    model = small_batch_norm_net()
    model(torch.randn(16, 32)).sum().backward()
    grads = [p.grad for p in model.parameters()]
    kept = [g.clone() for g in grads]
    with metamem.trace(device="cpu"):
        model(torch.randn(16, 32)).sum().backward()  # accumulates into them in a real run
        model.zero_grad()
    assert all(p.grad is g and torch.equal(g, k) for p, g, k in zip(model.parameters(), grads, kept))


def test_a_dtype_move_of_a_model_from_before_the_block_is_undone():
    # On a fake cpu, .double() of a model left real runs for real and sets
    # each parameter's data and gradient in place (param.data = ...), as
    # torch does: the model stayed float64 after the block, and a second
    # trace of the same block moved nothing.
    model = small_batch_norm_net()
    model(torch.randn(16, 32)).sum().backward()
    params = list(model.parameters())
    grads = [p.grad for p in params]
    kept = {"state": {name: t.clone() for name, t in model.state_dict().items()}, "grads": [g.clone() for g in grads]}

    def step():
        model.double()(torch.randn(16, 32, dtype=torch.float64)).sum().backward()

    with metamem.trace(device="cpu") as first:
        step()
    state = model.state_dict()
    assert all(state[name].dtype == t.dtype and torch.equal(state[name], t) for name, t in kept["state"].items())
    assert [p is q and p.grad is g for p, q, g in zip(model.parameters(), params, grads)] == [True] * len(params)
    assert all(g.dtype == torch.float32 and torch.equal(g, k) for g, k in zip(grads, kept["grads"]))
    with metamem.trace(device="cpu") as second:
        step()
    assert first.peak_bytes == second.peak_bytes
    model(torch.randn(16, 32)).sum().backward()  # in float32, as before the block


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_an_optimizer_built_before_the_block_steps_the_modules_it_moved(device):
    # With modules=[model] the block's model holds fakes; an optimizer built
    # with it holds the real parameters, which have no gradient there: it
    # stepped nothing, and the trace missed AdamW's moments (47,184 B
    # traced against 110,252 B of the real CPU run at 64 features).
    def build():
        model = small_batch_norm_net()
        opt = torch.optim.AdamW(model.parameters())
        return model, opt, torch.optim.lr_scheduler.StepLR(opt, 1)

    def steps(model, opt, sched):
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(16, 32, device=device)).sum().backward()
            opt.step()
            sched.step()

    model, opt, sched = build()
    params = list(model.parameters())
    with metamem.trace(device=device, modules=[model]) as before:
        steps(model, opt, sched)
    assert opt.param_groups[0]["params"] == params and len(opt.state) == 0
    fresh, *_ = build()
    with metamem.trace(device=device, modules=[fresh]) as inside:
        opt_inside = torch.optim.AdamW(fresh.parameters())
        steps(fresh, opt_inside, torch.optim.lr_scheduler.StepLR(opt_inside, 1))
    assert before.step_peaks == inside.step_peaks
    assert before.json()["model_states"] == inside.json()["model_states"]
    if device == "cpu":
        real = build()
        assert before.peak_bytes == metamem.achieved_cpu(lambda: steps(*real), modules=[real[0]])

    opt.zero_grad()
    model(torch.randn(4, 32)).sum().backward()
    opt.step()
    with pytest.raises(ValueError, match="AdamW stepped in the block holds state from before it"):
        with metamem.trace(device=device, modules=[model]):
            opt.step()
    assert model[0].weight is params[0] and opt.param_groups[0]["params"] == params


def test_a_model_built_before_the_block_and_moved_in_it_is_as_it_was_after_it():
    # .cuda() in the block makes new Parameters where torch moves a real
    # one in place (a traced tensor is not a real one's kind): the optimizer
    # built before the move stepped nothing (67,953,744 B traced where its
    # moments make 68,478,120 B at 256 features), and the model held the
    # trace's tensors after the block (TraceEndedError).
    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.BatchNorm1d(256), torch.nn.Linear(256, 8))
        return model, torch.optim.AdamW(model.parameters())

    def steps(model, opt):
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(16, 256, device="cuda")).sum().backward()
            opt.step()

    model, opt = build()
    params = list(model.parameters())
    with metamem.trace(device="cuda") as before_the_move:
        opt.zero_grad()  # followed from here on, before the model moves
        steps(model.cuda(), opt)
    assert [p is q for p, q in zip(model.parameters(), params)] == [True] * len(params)
    assert opt.param_groups[0]["params"] == params and len(opt.state) == 0
    model(torch.randn(4, 256)).sum().backward()  # on the CPU, as before the block
    opt.step()

    fresh, _ = build()
    with metamem.trace(device="cuda") as after_the_move:
        fresh.cuda()
        steps(fresh, torch.optim.AdamW(fresh.parameters()))
    assert before_the_move.step_peaks == after_the_move.step_peaks


def test_hooks_on_parameters_from_before_the_block_run_on_their_replacements():
    # An optimizer stepped in backward, as torch's tutorial writes it: a
    # hook after each gradient accumulates steps that parameter's optimizer,
    # found by the parameter, and frees the gradient. modules= made fakes
    # without the hooks: one step of all the gradients at once, 10,240,008 B
    # traced where the real run holds 16,277,556 B (four 512 x 512 layers).
    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)])
        optimizers = {p: torch.optim.AdamW([p]) for p in model.parameters()}
        clipped = []

        def step_in_backward(p):
            optimizers[p].step()
            optimizers[p].zero_grad()
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(step_in_backward)
            p.register_hook(lambda grad: clipped.append(grad.shape) or grad.clamp(-1, 1))
        return model, optimizers, clipped

    def steps(model):
        for _ in range(2):
            model(torch.randn(64, 512)).sum().backward()

    model, optimizers, clipped = build()
    with metamem.trace(device="cpu", modules=[model]) as t:
        steps(model)
    assert len(clipped) == 16 and len(t.step_peaks) == 2
    real, *_ = build()
    assert t.peak_bytes == metamem.achieved_cpu(lambda: steps(real), modules=[real])
    assert all(len(o.state) == 0 for o in optimizers.values()) and all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_hook_after_accumulation_reads_the_gradient_of_the_parameter_it_was_given(device):
    # The hook gets the parameter it was registered on, from before the
    # block, whose .grad was None there (AttributeError on p.grad.norm()):
    # it is lent its replacement's as the hook runs, and the None the hook
    # sets frees the replacement's.
    def keeping_norms(norms):
        def keep(p):
            norms.append(p.grad.norm())
            p.grad = None
        return keep

    def build(norms):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)])
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(keeping_norms(norms))
        return model

    def steps(model, device="cpu"):
        for _ in range(2):
            model(torch.randn(64, 512, device=device)).sum().backward()

    norms = []
    model = build(norms)
    with metamem.trace(device=device, modules=[model]) as t:
        steps(model.to(device), device)
    assert len(norms) == 16 and all(p.grad is None for p in model.parameters())
    if device == "cpu":
        real_norms = []
        real = build(real_norms)
        assert t.peak_bytes == metamem.achieved_cpu(lambda: steps(real), modules=[real]) == 6_037_544
        assert len(real_norms) == 16
    else:  # as the same hook registered in the block, on the moved model
        model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)])
        with metamem.trace(device="cuda", modules=[model]) as registered_in_block:
            model.cuda()
            for p in model.parameters():
                p.register_post_accumulate_grad_hook(keeping_norms([]))
            steps(model, "cuda")
        assert t.peak_bytes == registered_in_block.peak_bytes


# --- out of memory ----------------------------------------------------------

def test_a_caught_out_of_memory_error_leaves_the_peak_as_what_was_live():
    # A trace's allocator has the memory the step needs unless told otherwise: a fraction of the GPU's.
    with metamem.trace(device="cuda", gpu="H100-80GB", alloc_conf="per_process_memory_fraction:0.9") as t:
        x = torch.empty(2048, device="cuda")
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(1 << 40, dtype=torch.uint8, device="cuda")
        y = x + 1
        del y
    assert t.peak_bytes == 2 * 8192
    assert "out of memory, caught" in t.report()
    assert t.json()["out_of_memory_caught"][0]["bytes"] == 1 << 40



@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_live_bytes_past_2_63_are_out_of_memory_not_a_wrapped_count(device):
    with metamem.trace(device=device) as t:
        a = torch.empty(1 << 62, dtype=torch.uint8, device=device)
        with pytest.raises(torch.OutOfMemoryError, match="2\\^63-1"):
            torch.empty(1 << 62, dtype=torch.uint8, device=device)
        del a
    assert t.peak_bytes == 1 << 62


def test_mem_get_info_never_goes_below_zero():
    # Without a memory fraction the trace holds what the step asks for, more than the GPU has.
    with metamem.trace(device="cuda", gpu="L4"):
        free, total = torch.cuda.mem_get_info()
        x = torch.empty(total, dtype=torch.uint8, device="cuda")
        assert torch.cuda.mem_get_info() == (0, total) and free > 0
        del x


# --- distributed --------------------------------------------------------------

def test_the_first_distributed_trace_of_a_process_communicates():
    # Importing torch.distributed.fsdp registered torch's own "fake" backend
    # over metamem's inside the first trace: its collectives raised.
    program = """
import torch, torch.distributed as dist, metamem
for _ in range(2):
    with metamem.trace(device="cuda", world_size=4, rank=1):
        x = torch.ones(1024, device="cuda")
        dist.all_reduce(x)
        print(type(dist.group.WORLD).__name__)
"""
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["TracedProcessGroup"] * 2


@pytest.mark.parametrize("world_size", [0, 2**20 + 1, 10**9, True, 4.0])
def test_world_size_is_capped_and_checked(world_size):
    with pytest.raises(ValueError, match="world_size must be an int in \\[1, 1,048,576\\]"):
        with metamem.trace(device="cpu", world_size=world_size):
            pass



# --- values the trace knows ---------------------------------------------------

OUT_OF_RANGE = {
    "embedding": lambda d: torch.nn.Embedding(10, 4, device=d)(torch.arange(11, device=d)),
    "index_select": lambda d: torch.zeros(10, 4, device=d).index_select(0, torch.arange(11, device=d)),
    "gather": lambda d: torch.zeros(10, 4, device=d).gather(0, torch.full((1, 4), 10, device=d)),
    "indexing": lambda d: torch.zeros(10, 4, device=d)[torch.tensor([3, -11], device=d)],
    # Broadcast indices (stride 0), whose repeats the trace does not read:
    # the first out of range is still the one the kernel names.
    "gather broadcast": lambda d: torch.zeros(10, 4, device=d).gather(
        0, torch.tensor([[3], [12], [11]], device=d).expand(3, 4)),
    "indexing broadcast": lambda d: torch.zeros(10, 4, device=d)[
        torch.tensor([3, 12, -11], device=d).expand(2, 3), torch.tensor([[0], [5]], device=d).expand(2, 3)],
}


@pytest.mark.parametrize("op", OUT_OF_RANGE)
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_known_index_out_of_range_raises_the_real_kernels_error(op, device):
    with pytest.raises(Exception) as real:
        OUT_OF_RANGE[op]("cpu")
    with pytest.raises(type(real.value), match=f"^{re.escape(str(real.value))}$"):
        with metamem.trace(device=device):
            OUT_OF_RANGE[op](device)


def test_an_index_in_range_traces_as_before():
    with metamem.trace(device="cuda") as t:
        torch.nn.Embedding(10, 4, device="cuda")(torch.arange(10, device="cuda")).sum().backward()
    assert t.peak_bytes > 0




# --- host data -----------------------------------------------------------------

def data_loader_step(device, workers, pin_memory, seen):
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.arange(64).repeat_interleave(16).view(64, 16) % 100,
                                          torch.randint(0, 100, (64,)))
    seen["labels"] = data.tensors[1].tolist()
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True, num_workers=workers,
                                         pin_memory=pin_memory)
    model = torch.nn.Sequential(torch.nn.Embedding(100, 32), torch.nn.Flatten(), torch.nn.Linear(512, 100)).to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    for step, (x, y) in enumerate(loader):
        seen.setdefault("samples", []).extend(x[:, 0].tolist())  # which samples came, by their first token
        loss = torch.nn.functional.cross_entropy(model(x.to(device, non_blocking=True)), y.to(device))
        print(f"step {step}: loss {loss.item():.3f}", loss)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step == 2:
            break


@pytest.mark.parametrize("workers, pin_memory", [(0, False), (0, True), (2, False), (2, True)])
def test_a_data_loader_loop_runs_unchanged(workers, pin_memory):
    # The base seed and the sampler's permutation are drawn on torch's CPU
    # generator, the labels too: values the real run could have drawn (the
    # labels are its own, drawn first). The batches come from this process,
    # as with num_workers=0, and hold the same memory.
    real = {}
    data_loader_step("cpu", 0, False, real)
    traced = {}
    with metamem.trace(device="cuda", values="placeholder") as t:
        data_loader_step("cuda", workers, pin_memory, traced)
    assert traced["labels"] == real["labels"]
    assert len(set(traced["samples"])) == len(traced["samples"]) == 24  # three batches of a permutation
    with metamem.trace(device="cuda", values="placeholder") as in_process:
        data_loader_step("cuda", 0, False, {})
    assert t.peak_bytes == in_process.peak_bytes


# --- many traces in one process ------------------------------------------------

def resident_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_thousand_traces_leave_the_resident_memory_flat(device):
    # 0.04% from the 100th trace to the 1,000th here (about 300 B a trace).
    def traced_step():
        with metamem.trace(device=device) as t:
            model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(device)
            optimizer = torch.optim.AdamW(model.parameters())
            for _ in range(2):
                model(torch.randn(16, 64, device=device)).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
        t.report()

    for _ in range(100):
        traced_step()
    warm = resident_bytes()
    for _ in range(900):
        traced_step()
    assert abs(resident_bytes() - warm) <= 0.01 * warm


# --- the command line's errors ----------------------------------------------

def metamem_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "metamem", *args], capture_output=True, text=True, timeout=300,
                          env=env)


@pytest.mark.parametrize("args, names", [
    (["profile", "--hf", "gpt2", "--hf-set", "n_layer=abc"], "n_layer"),
    (["profile", "--hf", "gpt2", "--seq", "2048"], "max_position_embeddings"),
    (["profile", "--hf", "no_such_model_type"], "no_such_model_type"),
    (["profile", "--hf", "gpt2", "--batch", str(2**63 - 1)], "x vocab_size 50257: a tensor of more than 2^60"),
    (["profile", "--hf", "gpt2", "--hf-set", f"n_layer={2**63 - 1}"], "num_hidden_layers must be at most 10,000"),
])
def test_bad_input_is_one_line_and_exit_2(args, names):
    run = metamem_cli(*args)
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and names in run.stderr and len(run.stderr) < 400


def test_a_trace_takes_devices_and_modules_as_torch_names_them_and_names_what_it_cannot_take():
    # torch.device("cuda") stopped in pybind11's overload list, modules=[3]
    # with "'int' object has no attribute 'children'"; a single module
    # given without a list was iterated for its children.
    model = torch.nn.Linear(8, 8)

    def step():
        model(torch.randn(2, 8)).sum().backward()

    with metamem.trace(device=torch.device("cpu"), modules=model) as one:
        step()
    with metamem.trace(device="cpu", modules=[model]) as listed:
        step()
    assert one.peak_bytes == listed.peak_bytes == metamem.achieved_cpu(step, modules=model)
    with metamem.trace(device=torch.device("cuda", 0)) as t:
        torch.empty(256, device="cuda")
    assert t.peak_bytes == 1024
    for device in ("gpu", "cuda:1", 3):
        with pytest.raises(ValueError, match=f"device must be 'cpu' or 'cuda' .*, got {re.escape(repr(device))}$"):
            metamem.trace(device=device).__enter__()
    for modules, kind in (([model, 3], "int"), ("model", "str"), (None, "NoneType")):
        with pytest.raises(TypeError, match=f"modules must be torch.nn.Module objects .*, got {kind}$"):
            metamem.trace(device="cpu", modules=modules).__enter__()


def test_a_bad_config_file_is_named(tmp_path):
    malformed, unknown = tmp_path / "malformed.json", tmp_path / "unknown.json"
    malformed.write_text('{"model_type": "gpt2",')
    unknown.write_text(json.dumps({"model_type": "not_a_model"}))
    for path in (malformed, unknown):
        run = metamem_cli("profile", "--hf", str(path))
        assert run.returncode == 2 and str(path) in run.stderr and run.stderr.count("\n") == 1, run.stderr


def test_debug_prints_the_traceback():
    run = metamem_cli("profile", "--hf", "gpt2", "--hf-set", "n_layer=abc", "--debug")
    assert run.returncode == 1 and "Traceback" in run.stderr


def test_an_allocator_setting_names_its_variable():
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:x")
    env.pop("PYTORCH_ALLOC_CONF", None)
    run = metamem_cli("profile", "--hf", "gpt2", "--hf-set", "n_layer=1", env=env)
    assert run.returncode == 2 and run.stderr.startswith("metamem: PYTORCH_CUDA_ALLOC_CONF: "), run.stderr


@pytest.mark.parametrize("exit", [None, RuntimeError, KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_block_restores_every_global_it_changed(device, exit):
    before = {name: read() for name, (_, read) in CHANGES.items()}
    try:
        with metamem.trace(device=device):
            torch.randn(4, device=device)
            for change, _ in CHANGES.values():
                change()
            if exit is not None:
                raise exit()
    except BaseException as error:  # the one the block raised, no other (a restore that failed)
        if exit is None or type(error) is not exit:
            raise
    after = {name: read() for name, (_, read) in CHANGES.items()}
    assert {name for name in before if before[name] != after[name]} == set()
    assert torch.randn(3).device.type == "cpu"  # factories work as before
    # A trace after it too: restoring the default device before the mode
    # stack failed on the stack `with torch.device(...)` left, and a later
    # fake-cuda trace then met the real CUDA runtime.
    with metamem.trace(device="cuda") as t:
        torch.empty(1024, device="cuda")
    assert t.peak_bytes == 4096


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_sparse_gradient_is_refused_by_name(device):
    # A MetaTensor is strided: one standing for a sparse gradient was read
    # as sparse by the ops after it, and the process died (SIGSEGV).
    with pytest.raises(metamem.UnsupportedOpError, match="returns a Sparse tensor.*Embedding\\(sparse=True\\)"):
        with metamem.trace(device=device):
            embedding = torch.nn.Embedding(1000, 16, sparse=True).to(device)
            embedding(torch.randint(0, 1000, (8, 4)).to(device)).sum().backward()
    real = torch.nn.Embedding(1000, 16, sparse=True)
    real(torch.randint(0, 1000, (8, 4))).sum().backward()  # the process goes on
    assert real.weight.grad.is_sparse
