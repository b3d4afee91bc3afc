"""torch.compile'd training steps traced on fake cuda (issue 46), against
the same compiled step run by the pinned torch on metamem's fake GPU
(tests/python/real_torch_on_fake_gpu.py): Dynamo, AOTAutograd, Inductor and
Triton as they run for a GPU, kernels launched as no-ops. Max allocated and
max reserved of every step, to the byte. Each side compiles from a cold
Inductor cache of its own, so that each autotunes its kernels at their
first call: the first step holds the autotuner's benchmarking buffers."""

import json
import os
import subprocess
import sys

import pytest
import torch

import metamem
import metamem._metamem as native
from ci_subset import full
from compiled_steps import misaligned_head, two_adamw_steps

ORACLE = os.environ.get("METAMEM_ORACLE", "")
GPU = "H100-80GB"
# Where activations, not the cuBLAS workspace, make the peak: 8,192 tokens.
SHAPE = {"batches": [32, 32], "seq": 256}
HERE = os.path.dirname(os.path.abspath(__file__))

# The child: a step of compiled_steps, by name, its arguments as JSON.
CHILD = f"""
sys.path.insert(0, {HERE!r})
import compiled_steps
step = json.loads(sys.argv[3])
print(json.dumps(getattr(compiled_steps, step.pop("function"))(device="cuda", **step)()))
"""


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()


def cold(cache):
    """Inductor's cache for what follows, on either side: `cache`."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache)


def require_oracle():
    if not os.path.exists(os.path.join(ORACLE, "libmetamem_fake_cuda_preload.so")):
        pytest.skip(f"METAMEM_ORACLE={ORACLE!r} holds no fake CUDA libraries (the CUDA Toolkit's headers or the "
                    "torch wheel's libc10_cuda.so were missing when it was built)")


def on_fake_gpu(cache, function="two_adamw_steps", **step):
    """Each step's max allocated and max reserved, real torch on the fake GPU."""
    require_oracle()
    from real_torch_on_fake_gpu import PROLOGUE, measure

    cold(cache)
    step = {**SHAPE, **step} if function == "two_adamw_steps" else step
    return measure(ORACLE, native.gpu(GPU), PROLOGUE + CHILD, json.dumps({"function": function, **step}))


def traced(cache, **step):
    cold(cache)
    with metamem.trace(device="cuda", gpu=GPU) as t:
        peaks = two_adamw_steps(device="cuda", **{**SHAPE, **step})()
    return t, peaks


@pytest.fixture
def caches(tmp_path, monkeypatch):
    """A cold Inductor cache for each side; the process's own put back."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "unused"))
    return tmp_path / "trace", tmp_path / "real"


@pytest.mark.parametrize("how", ["torch.compile(model)", pytest.param("each block", marks=full), "the loss",
                                 pytest.param("fullgraph", marks=full), pytest.param("graph break", marks=full)])
def test_a_compiled_step_is_exact_against_real_torch_on_the_fake_gpu(how, caches):
    t, peaks = traced(caches[0], how=how)
    assert peaks == on_fake_gpu(caches[1], how=how)
    assert len(t.step_peaks) == 2


@pytest.mark.parametrize("how", ["torch.compile(model)", "eager"])
def test_bf16_autocast_with_flash_attention_is_exact(how, caches):
    # FlashAttention's backward makes its temporaries one by one, the
    # output's gradient copied before dq, dk and dv: in one block instead,
    # the trace met another free list and took one 2 MiB segment less.
    t, peaks = traced(caches[0], how=how, bf16=True)
    assert peaks == on_fake_gpu(caches[1], how=how, bf16=True)


@full  # test_compile.py's recompiles, against the real compiled run on the CPU, stay
def test_recompiles_on_new_batch_sizes_are_exact(caches):
    t, peaks = traced(caches[0], how="torch.compile(model)", batches=[16, 24, 32])
    assert peaks == on_fake_gpu(caches[1], how="torch.compile(model)", batches=[16, 24, 32])
    assert len(peaks) == len(t.step_peaks) == 3


def test_traces_in_one_process_hold_what_a_process_of_their_own_holds(caches):
    # A trace of the same step on the same GPU runs the graphs the last one
    # compiled, without compiling; each kernel autotunes again at its first
    # call (before, it had kept its choice, and the first step held neither
    # the L2-sized buffer nor the clones its benchmarks make). Another batch
    # compiles static, as a process of its own would: Dynamo took it for a
    # recompile and made the batch dynamic. Another GPU compiles afresh.
    from torch._dynamo.utils import counters

    def run(batch, gpu=GPU):
        graphs = counters["stats"]["unique_graphs"]
        cold(caches[0])
        with metamem.trace(device="cuda", gpu=gpu) as t:
            two_adamw_steps(device="cuda", how="torch.compile(model)", batches=[batch], seq=SHAPE["seq"])()
        return (t.step_peaks, t.reserved_peak_bytes), counters["stats"]["unique_graphs"] - graphs

    def fresh(batch, gpu=GPU):
        torch._dynamo.reset()
        return run(batch, gpu)[0]

    first, compiled = run(16)
    again, recompiled = run(16)
    assert again == first == fresh(16) and compiled == 1 and recompiled == 0
    run(16)
    assert run(24)[0] == fresh(24)
    assert run(24, "A100-80GB") == (fresh(24, "A100-80GB"), 1)


def traced_calls(compiled, batches):
    """((step peaks, reserved peak), graphs Dynamo compiled) of a trace that
    calls `compiled` on a batch of 4,096-wide rows of each size."""
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    with metamem.trace(device="cuda", gpu=GPU) as t:
        for batch in batches:
            compiled(torch.randn(batch, 4096))
    return (t.step_peaks, t.reserved_peak_bytes), counters["stats"]["unique_graphs"] - graphs


def test_a_kept_graph_that_other_sizes_fail_gives_way_to_theirs(caches):
    # Batches 8, 12, 12: the third trace runs the graph the second compiled
    # (before, a function whose kept graph had failed its guards kept none,
    # and every later trace compiled it). Batches alternating past Dynamo's
    # recompile limit (8) each compile once, static, as in a process of
    # their own: a function is reset before its dropped entries pile up,
    # and past the limit Dynamo would run the function uncompiled.
    compiled = torch.compile(lambda x: (x * 2).softmax(-1))

    def fresh(batch):
        torch._dynamo.reset()
        return traced_calls(compiled, [batch])[0]

    cold(caches[0])
    assert [traced_calls(compiled, [batch])[1] for batch in (8, 12, 12)] == [1, 1, 0]
    alternating = [traced_calls(compiled, [batch]) for batch in (8, 12) * 5]
    alone = {8: fresh(8), 12: fresh(12)}
    assert alternating == [(alone[batch], 1) for batch in (8, 12) * 5]
    assert alone[8] != alone[12]


def test_a_trace_has_dynamos_whole_recompile_limit_beside_dropped_graphs(caches):
    # A static function called at eight sizes compiles eight graphs in a
    # process of its own (Dynamo's limit: eight entries). After a trace
    # whose kept graph the next one drops, Dynamo counted the dropped entry
    # too, and ran the eighth size uncompiled.
    compiled = torch.compile(lambda x: (x * 2).softmax(-1), dynamic=False)
    cold(caches[0])
    traced_calls(compiled, [8])
    eight = range(12, 20)
    after_a_dropped_graph = traced_calls(compiled, eight)
    torch._dynamo.reset()
    assert after_a_dropped_graph == traced_calls(compiled, eight) and after_a_dropped_graph[1] == 8


def test_a_ranks_graphs_serve_that_rank_alone(caches):
    # Dynamo bakes what a graph reads of the rank (a mesh coordinate, an
    # uneven shard's size) into it without a guard: another rank compiles
    # its own, unless its caller says the ranks compile alike
    # (test_torchtitan.py).
    from torch._dynamo.utils import counters

    def scaled(x):
        return (x * 2).softmax(-1)

    def compiles(rank):
        graphs = counters["stats"]["unique_graphs"]
        with metamem.trace(device="cuda", gpu=GPU, world_size=2, rank=rank):
            torch.compile(scaled)(torch.randn(8, 64))
        return counters["stats"]["unique_graphs"] - graphs

    cold(caches[0])
    assert [compiles(0), compiles(0), compiles(1)] == [1, 0, 1]


def test_an_autotune_cache_is_read_as_a_real_run_reads_it(caches):
    # Every configuration times 1 ms in a trace: it writes no choice to
    # Inductor's autotune cache, so that a real run after it still
    # autotunes; after a real run, a trace reads its choices and, as a real
    # run would, benchmarks nothing.
    cache = caches[1]
    _, cold = traced(cache, how="torch.compile(model)")
    assert on_fake_gpu(cache, how="torch.compile(model)") == cold
    _, warm = traced(cache, how="torch.compile(model)")
    assert warm == on_fake_gpu(cache, how="torch.compile(model)")
    # Benchmarking held an L2-sized buffer in the cold first step, and
    # segments it took stay reserved; the second steps allocate alike.
    assert cold[0][0] > warm[0][0] and cold[1][0] == warm[1][0] and cold[1][1] > warm[1][1]


def test_a_graph_read_from_aotautograds_cache_makes_its_constants_on_the_cpu(caches, capfd):
    # FlexAttention's and_masks starts from a full([], True) on the GPU. A
    # graph read back from AOTAutograd's cache is traced again from its
    # code, which runs that op: on the CUDA this process lacks, so a trace
    # after the first (as a second process) logged the failure and compiled
    # again.
    from torch._dynamo.utils import counters
    from torch.nn.attention.flex_attention import and_masks, create_block_mask, flex_attention

    def attention(q, k, v, mask):
        return flex_attention(q, k, v, block_mask=mask)

    def trace():
        torch._dynamo.reset()
        with metamem.trace(device="cuda", gpu=GPU) as t:
            mask = create_block_mask(and_masks(lambda b, h, q, kv: q >= kv), 1, 1, 256, 256, device="cuda")
            q, k, v = (torch.randn(1, 2, 256, 64, device="cuda", requires_grad=True) for _ in range(3))
            torch.compile(attention)(q, k, v, mask).sum().backward()
        return t.step_peaks

    cold(caches[0])
    first = trace()
    hits = counters["aot_autograd"]["autograd_cache_hit"]
    assert trace() == first
    assert counters["aot_autograd"]["autograd_cache_hit"] == hits + 1
    assert capfd.readouterr().err == ""


# mode="max-autotune" takes the same trees after its benchmarks (docs/compile.md;
# about four minutes here, so not in CI: compile_sweep.py --mode).
@pytest.mark.parametrize("how", [pytest.param("mode=reduce-overhead", marks=full), "each block, mode=reduce-overhead"])
def test_cuda_graph_trees_are_exact_against_real_torch_on_the_fake_gpu(how, caches):
    # Inductor's own cudagraph_trees.py runs in the trace: the first step
    # warms up in the graphs' pool, the second records, the third and fourth
    # replay, holding only what lives outside the pool (docs/compile.md).
    t, peaks = traced(caches[0], how=how, batches=[32] * 4)
    assert peaks == on_fake_gpu(caches[1], how=how, batches=[32] * 4)
    assert len(t.step_peaks) == 4
    # The pool is kept between steps, and a replay allocates nothing of its own.
    assert len({reserved for _, reserved in peaks}) == 1 and peaks[2] == peaks[3] and peaks[1] > peaks[2]


# A tree switches paths where a step records a graph beside the path it
# replays: an evaluation after training steps, a batch of another shape
# (recompiled with a dynamic batch, recorded once per size). It returns the
# pool to the layout it had after the recording it branches from
# (_cuda_setCheckpointPoolState), every block of the checkpointed segments
# allocated for a moment, and frees the outputs that died since.
@pytest.mark.parametrize("steps", [
    {"batches": [32, 32, 32, 32, 32, 32], "evaluate_at": [3]},
    pytest.param({"batches": [32, 32, 32, 16, 16, 16, 32, 16, 32, 32], "evaluate_at": [8]}, marks=full),
], ids=["an evaluation", "batches of two sizes"])
def test_a_cuda_graph_tree_that_switches_paths_is_exact(steps, caches, monkeypatch):
    from torch._inductor import cudagraph_trees

    restores = []
    restore = cudagraph_trees.CUDAGraphTreeManager.apply_checkpoint_execution_state_in_allocator
    monkeypatch.setattr(cudagraph_trees.CUDAGraphTreeManager, "apply_checkpoint_execution_state_in_allocator",
                        lambda tree: (restores.append(tree), restore(tree))[1])
    t, peaks = traced(caches[0], how="mode=reduce-overhead", **steps)
    assert len(restores) == (1 if len(steps["batches"]) == 6 else 3)
    assert peaks == on_fake_gpu(caches[1], how="mode=reduce-overhead", **steps)
    # PyTorch's own allocator, given the trace's requests, checkpoints and
    # restores, agrees with the simulator after every one.
    events = caches[0] / "allocator-events.txt"
    t.save_allocator_events(str(events))
    replay = subprocess.run([os.path.join(ORACLE, "metamem-allocator-oracle"), str(events)], capture_output=True,
                            text=True)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "equal after every one" in replay.stdout
    # The trace's trees were its own and are gone: none is left for a real
    # GPU's compiled code, and c10's cached tensors are off again.

    assert not cudagraph_trees.get_obj(cudagraph_trees.local, "tree_manager_containers")
    with pytest.raises(RuntimeError, match="cached_tensorimpls_enabled"):
        torch._C._add_cached_tensor(torch.ones(1))


def test_reading_an_overwritten_output_raises_as_in_torch(caches):
    # Blocks compiled one by one and evaluated after training steps: the
    # tree reads the address of a block's output that it had freed, which
    # raises torch's error, in a trace as in torch.
    steps = {"batches": [32] * 5, "evaluate_at": [3]}
    overwritten = "accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run"
    with pytest.raises(RuntimeError, match=overwritten):
        traced(caches[0], how="each block, mode=reduce-overhead", **steps)
    with pytest.raises(RuntimeError, match=overwritten):
        on_fake_gpu(caches[1], how="each block, mode=reduce-overhead", **steps)


# A stream captures on the fake GPU as on a GPU: the caching allocator
# serves the capture from the graph's private pool, and what CUDA forbids
# while capturing fails with CUDA's words.
CAPTURE = """
import warnings
x = torch.empty(1 << 20, device="cuda")  # 4 MiB, in a 20 MiB segment
graph, seen = torch.cuda.CUDAGraph(), {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with torch.cuda.graph(graph):
        seen["capturing"] = torch.cuda.is_current_stream_capturing()
        y = x * 2
        z = y + 1
        del y
seen["warnings"] = [str(w.message) for w in caught]  # "The CUDA Graph is empty" where no launch was captured
seen["capturing after"] = torch.cuda.is_current_stream_capturing()
graph.replay()
seen["allocated"], seen["reserved"] = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
try:
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        x.sum().item()
except RuntimeError as error:
    seen["read"] = [str(error.__context__).splitlines()[0], str(error).splitlines()[0]]
print(json.dumps(seen))
"""


def test_the_fake_gpu_captures_cuda_graphs_as_a_gpu():
    require_oracle()
    from real_torch_on_fake_gpu import PROLOGUE, measure

    seen = measure(ORACLE, native.gpu(GPU), PROLOGUE + "import torch\n" + CAPTURE)
    assert seen["capturing"] and not seen["capturing after"] and seen["warnings"] == []
    # x and z (y's block went back to the pool); the pool's own 20 MiB
    # segment beside x's: captured outside it, y would have fitted in x's.
    assert seen["allocated"] == 8 << 20 and seen["reserved"] == 40 << 20
    # A value read synchronizes the capturing stream, which invalidates the
    # capture; ending it then fails.
    assert seen["read"] == ["CUDA error: operation not permitted when stream is capturing",
                            "CUDA error: operation failed due to a previous error during capture"]


# torch.cuda.make_graphed_callables, which compares its inputs' data_ptr():
# in a trace, their addresses in the simulated allocator.
GRAPHED = """
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)).cuda()
graphed = torch.cuda.make_graphed_callables(model, (torch.randn(32, 64, device="cuda", requires_grad=True),))
for _ in range(2):
    graphed(torch.randn(32, 64, device="cuda", requires_grad=True)).sum().backward()
seen = [torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated(), torch.cuda.max_memory_reserved()]
"""


# A captured graph's first random draw: CUDA's generator keeps a seed and
# an offset for the graph (8 B each) while the graph lives, on the default
# stream, outside the graph's pool (reserved shows where).
DRAWS = """
import gc
x = torch.empty(1024, device="cuda")
seen, graphs = [], []
for body in (lambda: torch.nn.functional.dropout(x, 0.1) + torch.rand(1024, device="cuda"),
             lambda: torch.rand(1024, device="cuda"), lambda: x * 2,
             lambda: torch.nn.functional.dropout(x, 0.0, training=False)):
    graphs.append(torch.cuda.CUDAGraph())
    with torch.cuda.graph(graphs[-1]):
        kept = body()
    seen.append([torch.cuda.memory_allocated(), torch.cuda.memory_reserved()])
del graphs[:2]
gc.collect()
seen.append([torch.cuda.memory_allocated(), torch.cuda.memory_reserved()])
"""


@pytest.mark.parametrize("program", [DRAWS, GRAPHED], ids=["random draws captured", "make_graphed_callables"])
def test_captured_graphs_hold_what_real_torch_holds_on_the_fake_gpu(program):
    require_oracle()
    from real_torch_on_fake_gpu import PROLOGUE, measure

    real = measure(ORACLE, native.gpu(GPU), PROLOGUE + "import torch\n" + program + "print(json.dumps(seen))\n")
    scope = {"torch": torch}
    with metamem.trace(device="cuda", gpu=GPU):
        exec(program, scope)
    assert scope["seen"] == real


def test_max_autotune_is_exact_against_real_torch_on_the_fake_gpu(caches):
    # Its benchmarks allocate on the GPU while compiling, in the trace as in
    # the real run; every choice times 1 ms on both, so the first (cuBLAS)
    # is taken. Neither the choices nor the fused kernels' timings are
    # written to Inductor's caches.
    from compiled_steps import max_autotuned_layer

    cold(caches[0])
    with metamem.trace(device="cuda", gpu=GPU):
        peaks = max_autotuned_layer()()
    assert peaks == on_fake_gpu(caches[1], "max_autotuned_layer")
    written = [os.path.join(folder, name) for folder, _, names in os.walk(caches[0]) for name in names]
    assert not [path for path in written if path.endswith((".best_config", ".kernel_perf"))]
    assert not os.path.exists(caches[0] / "cache")  # max-autotune's choices, as a real run writes them


@pytest.mark.parametrize("recipe, compile", [pytest.param("tensorwise", False, marks=full), ("tensorwise", True),
                                             ("rowwise", False), pytest.param("rowwise", True, marks=full)],
                         ids=["tensorwise-eager", "tensorwise-compiled", "rowwise-eager", "rowwise-compiled"])
def test_float8_training_is_exact_against_real_torch_on_the_fake_gpu(recipe, compile, caches):
    # torchao's float8 linears: cuBLASLt's scaled products (with their
    # workspace on an H100, rowwise included), their casts (a jiterated
    # exp2 among them, which the fake GPU compiles with NVRTC), compiled
    # into Inductor's kernels around extern _scaled_mm calls.
    from compiled_steps import float8_mlp

    cold(caches[0])
    with metamem.trace(device="cuda", gpu=GPU):
        peaks = float8_mlp(recipe, compile)()
    assert peaks == on_fake_gpu(caches[1], "float8_mlp", recipe=recipe, compile=compile)


def test_float8_on_a_gpu_without_it_is_refused_as_torch_refuses():
    from compiled_steps import float8_mlp

    with pytest.raises(RuntimeError, match=r"compute capability >= 9.0 or 8.9.*the traced GPU's is 8.0"):
        with metamem.trace(device="cuda", gpu="A100-80GB"):
            float8_mlp("tensorwise", compile=False)()
    with metamem.trace(device="cuda", gpu="L4"):  # sm89 runs it
        assert len(float8_mlp("tensorwise", compile=False)()) == 2


def test_leaving_the_block_puts_back_inductors_code_that_float8_replaced():
    # torchao's convert_to_float8_training replaces Inductor's Triton code
    # for minimum and maximum, once per process: a model compiled after
    # the block got other kernel sources than in a process of its own, and
    # missed the entries a real run had written to the autotune cache (a
    # trace after this one reserved 350,224,384 B in step 1 for 297,795,584).
    from torch._inductor.codegen.triton import TritonOverrides
    from compiled_steps import float8_mlp

    before = TritonOverrides.__dict__["minimum"]
    with metamem.trace(device="cuda", gpu="L4"):
        float8_mlp("tensorwise", compile=False)()
        assert TritonOverrides.__dict__["minimum"] is not before
    assert TritonOverrides.__dict__["minimum"] is before
    assert not sys.modules["torchao.float8._inductor_patch"]._PATCHED


def test_a_misaligned_product_is_benchmarked_padded_while_compiling_as_on_a_gpu(caches):
    # Inductor times the product against a padded one on GPU tensors it
    # makes while compiling; a real run counts them. The trace does the
    # same, and writes no decision to Inductor's cache.
    cold(caches[0])
    with metamem.trace(device="cuda", gpu=GPU):
        peaks = misaligned_head()()
    assert peaks == on_fake_gpu(caches[1], "misaligned_head")
    assert os.path.isdir(caches[1] / "cache") and not os.path.exists(caches[0] / "cache")


def test_a_compiled_optimizer_step_is_followed(caches):
    # Dynamo makes AdamW's state while it compiles the step, with step
    # counters on the GPU: in the trace, as on the GPU. The compiled step is
    # a step boundary, as the eager one is.
    t, peaks = traced(caches[0], how="torch.compile(model)", compile_step=True)
    real = on_fake_gpu(caches[1], how="torch.compile(model)", compile_step=True)
    assert len(t.step_peaks) == 2 and t.json()["optimizer"] == "AdamW"
    assert peaks[0] == real[0] and peaks[1][1] == real[1][1]
    # The real run holds one more 512 B block in the second step: the scalar
    # weight _foreach_lerp's decomposition put on the GPU while compiling,
    # garbage until Python's next collection; the trace makes it on the CPU
    # (docs/compile.md).
    assert 0 <= real[1][0] - peaks[1][0] <= 512


def test_compiled_code_that_reaches_the_cuda_runtime_is_named():
    # An error of the CUDA runtime this process lacks, from torch's code
    # while compiling (as Dynamo wraps it), is a named error saying where.
    from metamem._compile_cuda import refused
    from torch._dynamo.exc import BackendCompilerFailed

    where = {}
    exec(compile("def _init_group():\n    raise torch.AcceleratorError('CUDA error: cudaErrorInsufficientDriver')",
                 "/venv/site-packages/torch/optim/adam.py", "exec"), {"torch": torch}, where)
    try:
        try:
            where["_init_group"]()
        except torch.AcceleratorError as error:
            raise BackendCompilerFailed(lambda *args: None, error, None) from None
    except BackendCompilerFailed as wrapped:
        named = refused(wrapped)
    assert isinstance(named, metamem.UnsupportedCompileError)
    assert "reached the CUDA runtime, which this process does not have, at torch/optim/adam.py:2 (_init_group)" \
        in str(named)
    assert refused(RuntimeError("another error")) is None


@pytest.mark.parametrize("mode", [pytest.param(None, marks=full), "reduce-overhead"])
def test_a_transformers_model_compiled_is_exact_against_real_torch_on_the_fake_gpu(mode, caches):
    # GPT-2 (its head tied, a graph break before its loss) at 32 x 256;
    # compile_sweep.py runs all the models of compiled_models.py. With CUDA
    # graphs, its dropout draws while the graphs are captured: CUDA's
    # generator keeps a seed and offset for the graph, and the attention its
    # own on the device.
    import compile_sweep

    require_oracle()
    traced, real, _, _ = compile_sweep.on_cuda("GPT-2", True, ORACLE, mode)
    assert traced == real


def test_a_vision_transformer_meets_the_allocator_in_the_real_order(caches):
    # timm's ViT, built before the block, eager: its tensors are made as
    # .to() makes them (class token and position embedding after the
    # blocks), and its patch embedding, torch's own convolution, makes
    # cuBLAS's workspace. In another order the allocator split a segment
    # the real run does not: 2 MiB over in reserved (allocation_order.py).
    import compile_sweep

    require_oracle()
    traced, real, _, _ = compile_sweep.on_cuda("timm ViT-Ti/16 at 64 px", False, ORACLE)
    assert traced == real


def test_leaving_the_block_puts_back_what_compiling_for_the_gpu_changed(caches):
    import sys

    from torch._dynamo.device_interface import CudaInterface
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torch.utils._triton import has_triton

    driver = sys.modules["triton.runtime.driver"].driver
    # Asked before the block, as a compile for the CPU asks it, the answer
    # is cached: without a GPU, no Triton. The trace compiles for its GPU
    # all the same, and the process's answer is its own again after it.
    triton_here = has_triton()
    before = (CudaInterface.Event, CudaInterface.Stream, CudaInterface.exchange_device, driver._active,
              FakeTensorMode.avoid_device_init)
    t, peaks = traced(caches[0], how="torch.compile(model)")
    assert len(peaks) == 2
    assert (CudaInterface.Event, CudaInterface.Stream, CudaInterface.exchange_device, driver._active,
            FakeTensorMode.avoid_device_init) == before
    assert not torch.cuda.is_available()
    assert has_triton() == triton_here


CASES = {
    "torch.compile(model)": {"how": "torch.compile(model)"},
    "model.compile()": {"how": "model.compile()"},
    "each block's .compile()": {"how": "each block"},
    "only the loss": {"how": "the loss"},
    "fullgraph=True": {"how": "fullgraph"},
    "a graph break": {"how": "graph break"},
    "bf16 autocast, flash attention": {"how": "torch.compile(model)", "bf16": True},
    "batch 16, 24, 32 (recompiles)": {"how": "torch.compile(model)", "batches": [16, 24, 32]},
    "`torch.compile(optimizer.step)` too": {"how": "torch.compile(model)", "compile_step": True},
    "eager (not compiled)": {"how": "eager"},
    "bf16 autocast, eager": {"how": "eager", "bf16": True},
}


def table():
    """docs/compile.md's table: every case, each side from a cold cache."""
    import tempfile
    import time

    print(f"| how | trace: allocated / reserved per step | real torch on the fake {GPU} | trace | real |")
    print("|---|---|---|---|---|")
    for name, step in CASES.items():
        with tempfile.TemporaryDirectory() as cache:
            torch._dynamo.reset()
            start = time.perf_counter()
            _, peaks = traced(os.path.join(cache, "trace"), **step)
            trace_s = time.perf_counter() - start
            start = time.perf_counter()
            real = on_fake_gpu(os.path.join(cache, "real"), **step)
            real_s = time.perf_counter() - start
        cells = ["; ".join(f"{a:,} / {r:,}" for a, r in run) for run in (peaks, real)]
        print(f"| {name} | {cells[0]} | {'equal' if real == peaks else cells[1]} | {trace_s:.1f} s | {real_s:.1f} s |",
              flush=True)


if __name__ == "__main__":
    # METAMEM_ORACLE=build/oracle PYTHONPATH=build/python:tests/python .venv/bin/python tests/python/test_compile_cuda.py
    table()
