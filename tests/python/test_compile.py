"""torch.compile'd training steps, traced (issue 46): what the compiled
code allocates, to the byte, against the same compiled step run for real on
the CPU (Inductor's C++ backend), every way users compile. The models are
small: each compiles in seconds from a cold Inductor cache."""

import re

import pytest
import torch
import torch._functorch.config

import metamem
from compiled_steps import BATCH, two_adamw_steps


@pytest.fixture(autouse=True)
def fresh_dynamo():
    # Every test builds its models anew: without a reset, their shared
    # forward code would reach Dynamo's recompile limit as the file goes on.
    torch._dynamo.reset()


def traced_and_real(run):
    with metamem.trace(device="cpu") as t:
        run()
    return t, metamem.achieved_cpu(run)


@pytest.mark.parametrize("how", ["torch.compile(model)", "model.compile()", "each block", "the loss",
                                 "fullgraph", "graph break"])
def test_a_compiled_step_is_exact_against_the_real_compiled_run(how):
    t, real = traced_and_real(two_adamw_steps(how))
    assert len(t.step_peaks) == 2
    # Blocks compiled one by one: the real run reads 128 B less in some
    # runs, not in others, the trace never. The CPU flash attention's
    # backward makes a 128 B block in each of its two threads, alive together
    # or not as the threads run (docs/compile.md); the trace holds both.
    assert 0 <= max(t.step_peaks) - real <= (128 if how == "each block" else 0)


def test_the_trace_follows_the_compiled_code_not_the_eager_one():
    with metamem.trace(device="cpu") as eager:
        two_adamw_steps("eager")()
    with metamem.trace(device="cpu") as compiled_:
        two_adamw_steps("torch.compile(model)")()
    # Inductor fuses the layer norms' and GELU's intermediates away and
    # plans its buffers: the compiled step holds less.
    assert max(compiled_.step_peaks) < max(eager.step_peaks)


@pytest.mark.parametrize("how", ["eager", "torch.compile(model)"])
def test_a_compiled_optimizer_step_is_exact(how):
    t, real = traced_and_real(two_adamw_steps(how, compile_step=True))
    # Dynamo drops the record_function scope by which torch.optim marks a
    # step; the trace puts it back around the compiled step's graph.
    assert len(t.step_peaks) == 2
    assert t.json()["optimizer"] == "AdamW"
    # Dynamo makes the optimizer's state while it compiles. The trace knows
    # the values of the small zero states and computes them on the CPU
    # beside it; those copies were counted once compiling ended: 6,144 B
    # over, in the 16 states of up to 192 elements.
    assert max(t.step_peaks) == real


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_an_optimizer_built_before_the_block_has_its_compiled_step_follow_the_block(device):
    # The step pre-hook by which a trace follows an optimizer from before the
    # block runs while Dynamo traces the step, where it cannot change the
    # groups: with modules=[model] and no zero_grad() of the optimizer before
    # its first step, the compiled step read the real parameters, which have
    # no gradient there, and made no state: 43,560 B traced where the real
    # CPU run holds 78,936 B.
    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        return model, torch.optim.AdamW(model.parameters())

    def steps(model, optimizer):
        optimizer_step = torch.compile(optimizer.step)
        for _ in range(2):
            model.zero_grad()
            model(torch.randn(16, 64, device=device)).sum().backward()
            optimizer_step()

    model, optimizer = build()
    params = list(model.parameters())
    with metamem.trace(device=device, modules=[model]) as before:
        steps(model, optimizer)
    assert optimizer.param_groups[0]["params"] == params and len(optimizer.state) == 0
    fresh, _ = build()
    with metamem.trace(device=device, modules=[fresh]) as inside:
        steps(fresh, torch.optim.AdamW(fresh.parameters()))
    assert before.step_peaks == inside.step_peaks
    if device == "cpu":
        real = build()
        assert max(before.step_peaks) == metamem.achieved_cpu(lambda: steps(*real), modules=[real[0]])
        # Without modules=, a fake cpu's model from before the block is real,
        # its gradients and the optimizer's state traced: the compiled step's
        # kernels, given a real parameter first, raised "a kernel loaded for
        # a trace, unbuilt, is called on real tensors". The state the step
        # makes is the block's.
        with metamem.trace(device="cpu") as real_model:
            steps(model, optimizer)
        assert len(optimizer.state) == 0 and all(p.grad is None for p in params)
        real = build()
        assert max(real_model.step_peaks) == metamem.achieved_cpu(lambda: steps(*real))

    # One that has stepped is refused as its compiled step makes its state,
    # with the error its eager step raises; one the block does not step is
    # left alone while other code compiles.
    model(torch.randn(4, 64)).sum().backward()
    optimizer.step()  # on the CPU: a fake cuda's compile made the groups capturable, put back as it ended
    with metamem.trace(device=device, modules=[model]):
        fresh_optimizer = torch.optim.AdamW(model.parameters())
        steps(model, fresh_optimizer)
    with pytest.raises(ValueError, match="the AdamW stepped in the block holds state from before it"):
        with metamem.trace(device=device, modules=[model]):
            steps(model, optimizer)
    assert model[0].weight is params[0] and optimizer.param_groups[0]["params"] == params


def test_a_compiled_model_compiles_once_however_many_steps_the_trace_runs():
    # Dynamo's guards hold the thread's dispatch keys: built while compiling
    # (outside the trace) and checked in it, they must agree, or each call
    # recompiles until Dynamo's recompile limit, then runs eagerly.
    run = two_adamw_steps("each block", batches=(BATCH,) * 3)
    with torch._dynamo.config.patch(error_on_recompile=True), metamem.trace(device="cpu") as t:
        run()
    assert len(t.step_peaks) == 3
    assert max(t.step_peaks) - metamem.achieved_cpu(run) in (0, 128)  # the per-block row's 128 B (above)


def test_dynamic_shapes_and_recompiles_are_exact():
    # A new batch size recompiles (dynamic after the second); each graph traced as it runs.
    t, real = traced_and_real(two_adamw_steps("torch.compile(model)", batches=(2, 3, 4)))
    assert max(t.step_peaks) == real
    assert t.step_peaks[0] < t.step_peaks[2]


def test_the_users_partitioner_budget_is_followed():
    # activation_memory_budget makes AOTAutograd's partitioner save less
    # and recompute more: where activations make the peak, it is lower.
    def forward_backward():
        torch.manual_seed(0)
        model = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU())
                                      for _ in range(4)))
        torch.compile(model)(torch.randn(2048, 64)).pow(2).mean().backward()

    peaks = {}
    for budget in (1.0, 0.1):
        torch._dynamo.reset()  # Dynamo does not guard on the partitioner's configuration
        with torch._functorch.config.patch(activation_memory_budget=budget):
            t, real = traced_and_real(forward_backward)
        assert t.peak_bytes == real
        peaks[budget] = t.peak_bytes
    assert peaks[0.1] < peaks[1.0]


def test_the_report_names_compiled_graphs_under_the_model():
    with metamem.trace(device="cpu") as t:
        two_adamw_steps("torch.compile(model)")()
    modules = t.table("modules", depth=3)
    # The number is AOTAutograd's graph id, counted over the process.
    assert re.search(r"^LM\.\[compiled \d+ forward\] ", modules, re.MULTILINE)
    assert "OptimizedModule" not in modules


def test_a_trace_builds_no_kernel_and_leaves_none_behind():
    # The wrapper a trace loads has its kernels unbuilt and leaves
    # Inductor's cache with the block: the real run builds its own.
    from torch._inductor.codecache import PyCodeCache

    run = two_adamw_steps("torch.compile(model)")
    before = list(PyCodeCache.modules)
    with metamem.trace(device="cpu"):
        run()
    assert PyCodeCache.modules == before
    assert metamem.achieved_cpu(run) > 0


def test_compiling_freezes_older_objects_only_while_it_runs():
    # A compile's garbage is collected when it ends among the objects it
    # made, older ones frozen meanwhile (gc.freeze); a process that froze
    # objects itself (a server before it forks) finds them frozen still.
    import gc

    def compiled_in_a_trace(function):
        with metamem.trace(device="cpu"):
            torch.compile(function)(torch.ones(8))

    def frozen(thing):  # in no generation the collector walks
        return not any(any(o is thing for o in gc.get_objects(generation)) for generation in range(3))

    compiled_in_a_trace(lambda x: x.sin() + 1)
    assert gc.get_freeze_count() == 0
    kept = [object()]
    gc.freeze()
    try:
        compiled_in_a_trace(lambda x: x.cos() * 2)
        assert frozen(kept) and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    assert not frozen(kept)


def test_a_function_compiled_in_each_of_two_traces_is_traced_in_both():
    # Dynamo caches by code: the second trace's torch.compile of the same
    # function runs the graph compiled in the first, whose wrapper left
    # Inductor's cache when that trace ended. It ran with real buffers and
    # unbuilt kernels ("a kernel loaded for a trace, unbuilt, is called on
    # real tensors").
    def loss(logits, labels):
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())

    def step():
        logits = torch.randn(2, 64, 100, requires_grad=True)
        torch.compile(loss)(logits, torch.randint(0, 100, (2, 64))).backward()

    torch._dynamo.reset()
    peaks = []
    for _ in range(2):
        with metamem.trace(device="cpu", values="placeholder") as t:
            step()
        peaks.append(t.peak_bytes)
    assert peaks[0] == peaks[1] == metamem.achieved_cpu(step)


@pytest.mark.parametrize("world_size", [None, 2], ids=["one process", "a rank"])
def test_each_trace_compiles_as_a_process_of_its_own_would(world_size):
    # Traces of growing batches in one process. Dynamo took each new batch
    # for a recompile and made the batch dynamic, and a rank's graphs, left
    # invalidated in its cache, counted towards its recompile limit: a
    # layout search of many traces ran the function eagerly after eight
    # (torchtitan's compiled FlexAttention and block mask). Now each trace
    # compiles static, as a process of its own would, and between traces
    # Dynamo's records of sizes hold none of the traces'.
    from torch._dynamo import pgo
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.guards import DeletedGuardManagerWrapper
    from torch._dynamo.utils import counters

    def loss(x):
        return (x * 2).sin().sum()

    def traced(batch):
        with metamem.trace(device="cpu", world_size=world_size) as t:
            compiled(torch.randn(batch, 64, requires_grad=True)).backward()
        return t.peak_bytes

    torch._dynamo.reset()
    compiled = torch.compile(loss)
    peaks = []
    for batch in range(1, torch._dynamo.config.recompile_limit + 3):
        peaks.append(traced(batch))
        entries = _debug_get_cache_entry_list(loss.__code__)
        assert len(entries) <= 1 and not any(isinstance(e.guard_manager, DeletedGuardManagerWrapper) for e in entries)
        assert not [code for code in pgo._CODE_STATE or () if code.name == "loss"
                    and code.firstlineno == loss.__code__.co_firstlineno]
    assert peaks[-1] == peaks[-2] + 2 * 64 * 4  # one row more: 256 B for the input, 256 B for its gradient
    # On a fake cpu the same batch compiles again: what compiling left
    # behind in host memory (the tensor Dynamo makes of the 2) is the first
    # step's, as in the real run's first call.
    graphs = counters["stats"]["unique_graphs"]
    assert traced(batch) == peaks[-1] and counters["stats"]["unique_graphs"] == graphs + 1
    assert peaks[-1] == metamem.achieved_cpu(lambda: compiled(torch.randn(batch, 64, requires_grad=True)).backward())


def test_a_model_compiled_before_the_block_keeps_its_gradients_and_traces_again():
    # On a fake cpu its parameters stay real, and reach the compiled kernels
    # through reinterpret_tensor, an alias autograd does not know: backward
    # left the trace's gradients on them, and the next trace, of another
    # batch, stopped as Dynamo compiled ("attempting to assign a gradient
    # with device type 'meta' to a tensor with device type 'cpu'").
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    compiled = torch.compile(model)

    def step(batch):
        compiled(torch.randn(batch, 64)).sum().backward()

    peaks = []
    for batch in (4, 8):
        with metamem.trace(device="cpu") as t:
            step(batch)
        assert all(p.grad is None for p in model.parameters())
        peaks.append(t.peak_bytes)
    # A batch from before the block too: the compiled graph's buffers are
    # the trace's, and so is the gradient backward gives the parameters.
    batch = torch.randn(4, 64)
    with metamem.trace(device="cpu"):
        compiled(batch).sum().backward()
    assert all(p.grad is None for p in model.parameters())
    assert peaks[1] == metamem.achieved_cpu(lambda: step(8))


def test_compiled_code_outside_the_block_is_untouched():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU())
    forward = torch.compile(model)
    x = torch.randn(4, 16)
    before = forward(x)
    compile_ = torch.compile
    with metamem.trace(device="cpu", modules=[model]):
        forward(torch.randn(4, 16)).sum().backward()
    assert torch.compile is compile_
    # The graph compiled for real tensors runs its kernels as before.
    assert torch.equal(forward(x), before)
    assert torch.allclose(before, model(x))


@pytest.mark.parametrize("name", ["Llama", "BERT"])  # BERT's head is tied to its embedding
def test_transformers_models_compiled_are_exact(name, monkeypatch):
    # compile_sweep.py runs all the models of compiled_models.py.
    import compile_sweep

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # restored after the sweep's cold caches
    traced, real, _, _ = compile_sweep.on_cpu(name, compile=True)
    assert traced == real


def test_a_compiled_regions_products_count_the_flops_of_the_eager_ones():
    # Inductor calls its extern kernels with out= (aten::mm.out,
    # addmm.out): counted as mm and addmm are. Its fused kernels are not ops
    # and count nothing (here the bias gradient's sum). A compiled region's
    # backward is the backward of the region's first node.
    def linear_flops(compile):
        torch.manual_seed(0)
        with metamem.trace(device="cpu") as t:
            layer = torch.nn.Linear(64, 128)
            forward = torch.compile(layer) if compile else layer
            forward(torch.randn(32, 64, requires_grad=True)).relu().sum().backward()
        if compile:
            # The graph's number counts the process's compiles.
            rows = [row for row in t.json()["nodes"] if re.search(r"\[compiled \d+ forward\]", row["module"])]
        else:
            rows = [row for row in t.json()["nodes"] if row["op"] in ("aten::addmm", "aten::mm")]
        return sum(row["fwd_flops"] + row["bwd_flops"] for row in rows)

    assert linear_flops(compile=True) == linear_flops(compile=False) == 3 * 2 * 32 * 64 * 128
