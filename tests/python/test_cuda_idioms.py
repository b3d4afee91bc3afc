"""A training script written for a GPU runs unchanged inside
metamem.trace(device="cuda"): each torch.cuda idiom it uses, answered for
the traced GPU; on a fake cpu, the idioms that run on a CPU are byte-exact
against the real CPU run."""

import os
import subprocess
import textwrap

import pytest
import torch
import torch.utils.checkpoint as cp

import idiom_steps
import metamem
from ci_subset import one_gpu_each

MiB = 1024 * 1024


def mlp(dropout=0.0):
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Dropout(dropout),
                               torch.nn.Linear(256, 64))


def trace_and_run(step):
    with metamem.trace(device="cpu") as t:
        step()
    return t.peak_bytes, metamem.achieved_cpu(step)


def test_gpu_memory_leaves_the_allocator_what_the_context_does_not_hold():
    # A T4's context: 40 SMs × 1024 threads × 1 KiB of stack, and the driver's 213 MiB.
    t4 = metamem.gpu_memory("T4")
    assert t4["total_bytes"] == 15360 * MiB and t4["beside_allocator"][0]["bytes"] == (40 + 213) * MiB
    assert t4["allocator_bytes"] == (15360 - 253) * MiB
    assert metamem.gpu_memory("T4", memory=1 << 30, cuda_context=0)["allocator_bytes"] == 1 << 30
    with pytest.raises(ValueError, match="leaves nothing to the CUDA caching allocator"):
        metamem.gpu_memory("T4", memory=200 * MiB)


def test_device_queries_answer_for_the_traced_gpu():
    cached_count = torch.cuda._cached_device_count
    with metamem.trace(device="cuda") as t:
        assert torch.cuda.is_available() and torch.cuda.device_count() == 1
        assert torch.cuda.current_device() == 0 and torch.cuda.is_initialized()
        props = torch.cuda.get_device_properties(0)
        assert (props.name, props.major, props.minor) == ("NVIDIA H100 80GB HBM3", 9, 0)
        assert props.total_memory == 81559 * MiB and props.multi_processor_count == 132
        assert torch.cuda.get_device_name() == props.name
        assert torch.cuda.get_device_capability("cuda:0") == (9, 0)
        assert torch.cuda.is_bf16_supported()
        assert props.max_threads_per_multi_processor == 2048
        x = torch.empty(3 * MiB, device="cuda")  # 12 MiB: a 12 MiB segment
        # Free: less the CUDA context, a stack of 1 KiB per thread the SMs hold and the driver's 213 MiB.
        context = 132 * 2048 * 1024 + 213 * MiB
        assert torch.cuda.mem_get_info() == (props.total_memory - context - 12 * MiB, props.total_memory)
        del x
    assert t.peak_bytes == 12 * MiB
    with metamem.trace(device="cuda", gpu="a100-40gb"):
        assert torch.cuda.get_device_properties(0).total_memory == 40960 * MiB
        assert torch.cuda.get_device_capability() == (8, 0)
    assert metamem.gpus()[0] == "H100-80GB" and "T4" in metamem.gpus()
    with pytest.raises(ValueError, match="unknown GPU 'H800'; known: H100-80GB"):
        with metamem.trace(device="cuda", gpu="H800"):
            pass
    assert not torch.cuda.is_available() and torch.cuda.default_generators == ()
    assert torch.cuda._cached_device_count == cached_count and not torch.cuda.is_initialized()


def test_synchronize_devices_streams_and_events_complete_at_once():
    with metamem.trace(device="cuda") as t:
        torch.cuda.synchronize()
        torch.cuda.set_device(0)
        with torch.cuda.device(0):
            x = torch.randn(256, device="cuda")
        side = torch.cuda.Stream()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = x * 2
        y.record_stream(side)
        torch.cuda.current_stream().wait_stream(side)
        end.record()
        end.synchronize()
        assert start.query() and side.query()
        # A trace runs no kernels: every interval takes the same 1 ms, as on
        # the fake GPU (a throughput a script logs stays finite).
        assert start.elapsed_time(end) == 1.0
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            torch.cuda.set_device(1)
    assert t.peak_bytes == 2 * 1024


def test_streams_keep_their_own_memory_and_record_stream_delays_a_free():
    with metamem.trace(device="cuda") as t:
        side = torch.cuda.Stream()
        assert side.stream_id == 1 and torch.cuda.Stream().stream_id == 2
        with torch.cuda.stream(side):
            assert torch.cuda.current_stream() == side
            x = torch.empty(3 * MiB, device="cuda")  # a 12 MiB segment of the side stream's
        assert torch.cuda.current_stream().stream_id == 0
        del x  # cached for the side stream alone
        y = torch.empty(3 * MiB, device="cuda")
        assert torch.cuda.memory_reserved() == 24 * MiB
        y.record_stream(side)  # used there too: its free waits for the side stream
        del y
        stats = torch.cuda.memory_stats()
        assert stats["allocated_bytes.all.current"] == 0 and stats["active_bytes.all.current"] == 12 * MiB
        segments = torch.cuda.memory_snapshot()
        assert sorted(s["stream"] for s in segments) == [0, 1]
        assert [b["state"] for s in segments if s["stream"] == 0 for b in s["blocks"]] == ["active_pending_free"]
        z = torch.empty(3 * MiB, device="cuda")  # the side stream's work is done: y's block serves
        assert torch.cuda.memory_reserved() == 24 * MiB and torch.cuda.memory_stats()["active_bytes.all.current"] == 12 * MiB
        del z
        with pytest.raises(ValueError, match="metamem traces streams 0 to 31, got 40"):
            torch.cuda.set_stream(torch.cuda.Stream(stream_id=40, device_index=0, device_type=1))
    assert t.peak_bytes == 12 * MiB
    with metamem.trace(device="cuda"):
        assert torch.cuda.Stream().stream_id == 1  # each trace hands out streams afresh


def test_each_stream_gets_its_own_cublas_workspace():
    with metamem.trace(device="cuda"):  # an H100: 32 MiB, as the wheel's cuBLAS makes it on sm90
        a = torch.empty(64, 64, device="cuda")
        a @ a  # the default stream's first product makes it
        before = torch.cuda.memory_allocated()
        a @ a
        assert torch.cuda.memory_allocated() == before
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            a @ a  # the side stream's first: its own
            a @ a
        assert torch.cuda.memory_allocated() - before == 32 * MiB
        assert [s["stream"] for s in torch.cuda.memory_snapshot() if s["total_size"] == 32 * MiB] == [0, 1]


# Backward's products take autograd's device thread's cuBLAS handle, and so
# a workspace of its own, unless the code turned autograd's multithreading
# off (torchtitan does): then the calling thread's.
BACKWARD_WORKSPACES = """
def backward_workspaces(multithreading):
    with torch.autograd.set_multithreading_enabled(multithreading):
        assert torch.autograd.is_multithreading_enabled() == multithreading
        linear = torch.nn.Linear(256, 256).cuda()
        linear(torch.randn(64, 256, device="cuda", requires_grad=True)).sum().backward()
    return [s["total_size"] for s in torch.cuda.memory_snapshot()].count(32 * 1024 * 1024)
"""


@pytest.mark.parametrize("multithreading", [True, False])
def test_backward_takes_the_cublas_handle_of_the_thread_it_runs_on(multithreading):
    exec(BACKWARD_WORKSPACES, globals())
    before = torch.autograd.is_multithreading_enabled()
    with metamem.trace(device="cuda", gpu="H100-80GB"):
        workspaces = backward_workspaces(multithreading)  # noqa: F821 (defined by the exec above)
        torch.autograd.set_multithreading_enabled(not before)  # the traced code's own setting
    assert workspaces == (2 if multithreading else 1)
    assert torch.autograd.is_multithreading_enabled() == before  # put back as it was
    oracle = os.environ.get("METAMEM_ORACLE", "")
    if os.path.exists(os.path.join(oracle, "libmetamem_fake_cuda_preload.so")):
        import metamem._metamem as native
        from real_torch_on_fake_gpu import PROLOGUE, measure

        assert measure(oracle, native.gpu("H100-80GB"), PROLOGUE + "import torch\n" + BACKWARD_WORKSPACES
                       + f"print(json.dumps(backward_workspaces({multithreading})))\n") == workspaces


def test_memory_statistics_follow_the_simulated_caching_allocator():
    with metamem.trace(device="cuda") as t:
        x = torch.randn(1024, device="cuda")
        assert torch.cuda.memory_allocated() == 4096
        assert torch.cuda.memory_reserved() == 2 * MiB  # a small-pool segment
        y = torch.empty(30 * MiB // 4, device="cuda")
        del y
        assert torch.cuda.memory_allocated() == 4096
        assert torch.cuda.max_memory_allocated() == 4096 + 30 * MiB
        assert torch.cuda.memory_reserved() == 32 * MiB  # cached, not given back
        stats = torch.cuda.memory_stats()
        assert stats["allocation.all.allocated"] == 2 and stats["allocation.all.freed"] == 1
        assert stats["segment.large_pool.current"] == 1 and stats["requested_bytes.all.current"] == 4096
        torch.cuda.reset_peak_memory_stats()
        assert torch.cuda.max_memory_allocated() == 4096
        torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved() == 2 * MiB
        assert torch.cuda.max_memory_reserved() == 32 * MiB  # peaks stay until reset
        assert torch.cuda.memory_stats()["num_device_free"] == 1
        assert "Allocated memory" in torch.cuda.memory_summary()
        # torch.accelerator's device-generic functions read the same allocator.
        assert torch.accelerator.memory_allocated() == 4096
        assert torch.accelerator.max_memory_reserved() == 32 * MiB
        assert torch.accelerator.get_memory_info() == torch.cuda.mem_get_info()
        del x
    assert t.reserved_peak_bytes == 32 * MiB  # the block's, as torch.cuda.max_memory_reserved() ended it
    with metamem.trace(device="cpu") as cpu:
        torch.empty(1024)
    assert cpu.reserved_peak_bytes is None  # a CPU has no caching allocator


def test_memory_snapshot_lists_the_simulated_segments_and_blocks():
    with metamem.trace(device="cuda"):
        kept = torch.empty(1000, device="cuda")  # 4000 B: a 4 KiB block of a 2 MiB segment
        big = torch.empty(3 * MiB, device="cuda")  # 12 MiB: a segment of its own
        del kept
        segments = torch.cuda.memory_snapshot()
        layout = [(s["segment_type"], s["total_size"], [(b["size"], b["state"]) for b in s["blocks"]])
                  for s in segments]
        assert layout == [("small", 2 * MiB, [(2 * MiB, "inactive")]),
                          ("large", 12 * MiB, [(12 * MiB, "active_allocated")])]
        assert sum(s["total_size"] for s in segments) == torch.cuda.memory_reserved()
        assert sum(s["allocated_size"] for s in segments) == torch.cuda.memory_allocated() == 12 * MiB
        assert segments[1]["blocks"][0]["requested_size"] == big.numel() * 4
        assert torch.cuda.memory._snapshot()["segments"] == segments


def test_the_allocator_takes_pytorch_alloc_conf():
    with metamem.trace(device="cuda", alloc_conf="expandable_segments:True") as t:
        x = torch.empty(1024, device="cuda")  # the small pool's address space maps a 2 MiB page
        y = torch.empty(30 * MiB // 4, device="cuda")  # the large pool's maps two pages of 20 MiB
        assert torch.cuda.memory_reserved() == 2 * MiB + 40 * MiB
        assert torch.cuda.memory_stats()["segment.all.current"] == 0  # mapped pages are no segments
        layout = [(s["segment_type"], s["total_size"], s["is_expandable"], [(b["size"], b["state"]) for b in s["blocks"]])
                  for s in torch.cuda.memory_snapshot()]
        assert layout == [("small", 2 * MiB, True, [(4096, "active_allocated"), (2 * MiB - 4096, "inactive")]),
                          ("large", 40 * MiB, True, [(30 * MiB, "active_allocated"), (10 * MiB, "inactive")])]
        del x, y
    assert t.json()["alloc_conf"] == "expandable_segments:True"
    assert t.reserved_peak_bytes == 42 * MiB


def test_the_allocator_reads_the_environment_as_torch_does(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:40")
    with metamem.trace(device="cuda"):
        assert torch.cuda.memory_stats()["max_split_size"] == 40 * MiB
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:60")  # the newer name wins
    with metamem.trace(device="cuda"):
        assert torch.cuda.memory_stats()["max_split_size"] == 60 * MiB
    with pytest.raises(ValueError, match="alloc_conf: unknown option 'bogus'"):  # named where it came from
        with metamem.trace(device="cuda", alloc_conf="bogus:1"):
            pass


def test_out_of_memory_raises_what_torch_raises():
    # 5% of an 80 GB H100: 4 GB. A batch-size search catches the error and goes on.
    batches = []
    with metamem.trace(device="cuda", alloc_conf="per_process_memory_fraction:0.05"):
        for batch in (2048, 1536, 512):  # 8 GiB and 6 GiB do not fit, 2 GiB does
            try:
                torch.empty(batch, MiB, device="cuda")
                batches.append(batch)
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
        assert torch.cuda.memory_stats()["num_ooms"] == 2
    assert batches == [512]


def test_peaks_read_at_the_end_of_a_step_are_the_reports():
    with metamem.trace(device="cuda") as t:
        model = torch.nn.Linear(1024, 1024).cuda()
        opt = torch.optim.AdamW(model.parameters())
        for _ in range(2):
            model(torch.randn(64, 1024, device="cuda")).sum().backward()
            opt.step()
            opt.zero_grad()
        allocated, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    predicted = t.json()["predicted"]
    assert allocated == predicted["allocator_allocated_peak_bytes"] == t.peak_bytes
    assert reserved == predicted["allocator_reserved_peak_bytes"]


EMPTYING_STEPS = """
def emptying_steps():
    # Two AdamW steps, the second on a smaller batch, each ending in
    # torch.cuda.empty_cache(): the second step's requests find nothing
    # cached, so it reserves less than the first.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2048, 8192), torch.nn.ReLU(), torch.nn.Linear(8192, 2048)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    peaks = []
    for batch in (512, 384):
        torch.cuda.reset_peak_memory_stats()
        model(torch.randn(batch, 2048, device="cuda")).square().mean().backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.empty_cache()
        peaks.append([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()])
    return peaks
"""


def test_empty_cache_in_a_block_is_in_its_report(tmp_path):
    exec(EMPTYING_STEPS, globals())
    with metamem.trace(device="cuda", gpu="H100-80GB") as t:
        peaks = emptying_steps()  # noqa: F821 (defined by the exec above)
    assert peaks[1][1] < peaks[0][1]
    predicted = t.json()["predicted"]
    assert [predicted["allocator_allocated_peak_bytes"], predicted["allocator_reserved_peak_bytes"]] == peaks[1]
    t.save_allocator_events(str(tmp_path / "events.txt"))
    assert (tmp_path / "events.txt").read_text().count("empty_cache\n") == 2
    oracle = os.environ.get("METAMEM_ORACLE", "")
    if os.path.exists(os.path.join(oracle, "libmetamem_fake_cuda_preload.so")):
        import metamem._metamem as native
        from real_torch_on_fake_gpu import PROLOGUE, measure

        real = measure(oracle, native.gpu("H100-80GB"),
                       PROLOGUE + "import torch\n" + EMPTYING_STEPS + "print(json.dumps(emptying_steps()))\n")
        assert real == peaks  # 786,432,000 B reserved in the second step (the report left empty_cache out: 799,014,912)


def cuda_graph_steps_on_the_fake_gpu(call):
    """What `cuda_graph_steps.<call>` returns when real torch runs it on the
    fake GPU made an H100 (the test is skipped where none was built)."""
    oracle = os.environ.get("METAMEM_ORACLE", "")
    if not os.path.exists(os.path.join(oracle, "libmetamem_fake_cuda_preload.so")):
        pytest.skip(f"METAMEM_ORACLE={oracle!r} holds no fake GPU to run real torch on")
    import metamem._metamem as native
    from real_torch_on_fake_gpu import PROLOGUE, measure

    here = os.path.dirname(os.path.abspath(__file__))
    return measure(oracle, native.gpu("H100-80GB"), PROLOGUE + f"sys.path.insert(0, {here!r})\n"
                   f"import cuda_graph_steps\nprint(json.dumps(cuda_graph_steps.{call}))\n")


@pytest.mark.parametrize("on_warmup_stream", [False, True], ids=["capture stream", "warm-up stream"])
def test_a_step_captured_in_a_cuda_graph(on_warmup_stream, tmp_path):
    # A capture's allocations take segments of its graph's private pool;
    # replays allocate nothing. Captured on the warm-up stream, the pool
    # keeps what the capture freed from the evaluation pass after it, which
    # reserves 23 MiB more than it would from the stream's own cache.
    from cuda_graph_steps import whole_network

    with metamem.trace(device="cuda", gpu="H100-80GB") as t:
        peaks = whole_network(on_warmup_stream)
        assert not torch.cuda.is_current_stream_capturing()
    assert len(peaks) == 6 and peaks[2] == peaks[3] == peaks[4]  # replays
    # torch's own again, with no capture stream of the trace's kept.
    assert torch.cuda.CUDAGraph.__module__ == "torch.cuda.graphs" and torch.cuda.graph.default_capture_stream is None
    t.save_allocator_events(str(tmp_path / "events.txt"))
    assert "pool_begin 1" in (tmp_path / "events.txt").read_text()
    assert cuda_graph_steps_on_the_fake_gpu(f"whole_network({on_warmup_stream})") == peaks
    # The trace's event list, pools included, through PyTorch's own allocator.
    oracle = os.environ["METAMEM_ORACLE"]
    replay = subprocess.run([os.path.join(oracle, "metamem-allocator-oracle"), str(tmp_path / "events.txt")],
                            capture_output=True, text=True)
    assert replay.returncode == 0 and "equal after every one" in replay.stdout


@pytest.mark.parametrize("join_by_event", [False, True], ids=["wait_stream", "wait_event"])
def test_a_stream_that_waits_on_a_capture_is_captured(join_by_event):
    from cuda_graph_steps import forked_capture

    with metamem.trace(device="cuda", gpu="H100-80GB"):
        states = forked_capture(join_by_event)
        assert not torch.cuda.is_current_stream_capturing()
    # The side stream's request in the capture takes a 12 MiB segment of the
    # graph's pool beside its own cached one, which serves it after.
    assert states == [[12 * MiB, 24 * MiB], [24 * MiB, 24 * MiB]]
    assert cuda_graph_steps_on_the_fake_gpu(f"forked_capture({join_by_event})") == states


@pytest.mark.parametrize("then_draw", [False, True], ids=["read only", "read, then dropout"])
def test_reading_the_rng_state_in_a_capture_makes_the_graphs_seed_and_offset(then_draw):
    from cuda_graph_steps import rng_state_read_in_capture

    with metamem.trace(device="cuda", gpu="H100-80GB"):
        states = rng_state_read_in_capture(then_draw)
    # Each graph: its output (4 KiB, from its pool's 2 MiB segment) and,
    # made at the first read, the generator's seed and offset (512 B each,
    # on the default stream), which the graph keeps until it goes.
    assert states == [[4096 + 4096 + 1024, 4 * MiB], [4096 + 2 * 5120, 6 * MiB], [4096, 6 * MiB]]
    assert cuda_graph_steps_on_the_fake_gpu(f"rng_state_read_in_capture({then_draw})") == states


def test_a_mem_pool_keeps_its_segments():
    from cuda_graph_steps import mem_pool_routing

    with metamem.trace(device="cuda", gpu="H100-80GB"):
        states = mem_pool_routing()
        with pytest.raises(NotImplementedError, match="no_split"):
            torch.cuda.MemPool(no_split=True)
    # 12 MiB cached, 12 MiB and a 2 MiB small segment the pool's; after the
    # pooled tensor's free and empty_cache, the pool's segments stay.
    assert states == [[25169920, 26 * MiB], [12587008, 26 * MiB]]
    assert cuda_graph_steps_on_the_fake_gpu("mem_pool_routing()") == states


def test_seeds_and_rng_state_and_the_real_generator_kept():
    state = torch.random.get_rng_state()
    expected = torch.randn(4)
    torch.random.set_rng_state(state)
    with metamem.trace(device="cuda"):
        torch.manual_seed(0)
        torch.cuda.manual_seed_all(7)
        assert torch.cuda.initial_seed() == 7
        saved = torch.cuda.get_rng_state()
        assert saved.dtype == torch.uint8 and saved.numel() == 16 and saved.device.type == "cpu"
        torch.cuda.manual_seed(9)
        torch.cuda.set_rng_state(saved)
        assert torch.cuda.initial_seed() == 7
        with torch.random.fork_rng(device_type="cuda"):
            torch.cuda.seed()
        assert torch.cuda.initial_seed() == 7
    assert torch.equal(torch.randn(4), expected)  # the block's manual_seed(0) was put back


def test_autocast_and_grad_scaler():
    with metamem.trace(device="cuda") as t:
        model = mlp().cuda()
        opt = torch.optim.AdamW(model.parameters())
        scaler = torch.amp.GradScaler("cuda")
        for _ in range(2):
            with torch.autocast("cuda", dtype=torch.float16):
                out = model(torch.randn(32, 64, device="cuda"))
                assert out.dtype == torch.float16
            scaler.scale(out.float().sum()).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)  # reads whether a gradient overflowed: in a trace none did
            scaler.update()
            opt.zero_grad(set_to_none=True)
    report = t.json()
    assert report["optimizer"] == "AdamW" and len(t.step_peaks) == 2
    assert report["model_states"]["optimizer_bytes"] == 2 * report["model_states"]["param_bytes"]
    with metamem.trace(device="cuda"):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            assert (mlp().cuda()(torch.randn(4, 64, device="cuda"))).dtype == torch.bfloat16


def test_a_grad_scaler_on_the_cpu_steps_as_the_real_run_does():
    # torch.amp.GradScaler("cpu") reads whether a gradient overflowed, as on
    # the GPU: on a fake cpu that read stopped the block (ValueReadError).
    def step():
        torch.manual_seed(0)
        model = mlp()
        opt = torch.optim.AdamW(model.parameters())
        scaler = torch.amp.GradScaler("cpu")
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(torch.randn(32, 64))
            scaler.scale(out.float().sum()).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
        assert len(opt.state) == 4

    traced, real = trace_and_run(step)
    assert traced == real


def test_anomaly_mode_checks_each_gradient_for_nan_and_finds_none():
    # Backward under anomaly mode reads isnan(grad)._is_any_true() for every
    # gradient: a value a trace does not have (ValueReadError). The check
    # finds none, as in a healthy step; its temporaries are the real run's.
    def step():
        torch.manual_seed(0)
        model = mlp()
        with torch.autograd.detect_anomaly():
            model(torch.randn(32, 64)).sum().backward()

    traced, real = trace_and_run(step)
    assert traced == real
    with metamem.trace(device="cuda"), torch.autograd.detect_anomaly():
        loss = mlp().cuda()(torch.randn(32, 64, device="cuda")).sum()
        loss.backward()
        with pytest.raises(metamem.ValueReadError):  # the user's own read still has no value
            loss.item()


class Blocks(torch.nn.Module):
    def __init__(self, form):
        super().__init__()
        self.form = form
        self.blocks = torch.nn.Sequential(*(mlp(dropout=0.1) for _ in range(4)))

    def forward(self, x):
        if self.form == "sequential":
            return cp.checkpoint_sequential(self.blocks, 2, x, use_reentrant=False)
        for block in self.blocks:
            x = cp.checkpoint(block, x, use_reentrant=self.form == "reentrant", preserve_rng_state=True)
        return x


@pytest.mark.parametrize("form", ["reentrant", "non_reentrant", "sequential"])
def test_every_checkpoint_form_traces_on_cuda_and_is_exact_on_cpu(form):
    def step(device):
        torch.manual_seed(0)
        model = Blocks(form).to(device)
        x = torch.randn(1024, 64, device=device, requires_grad=True)
        model(x).sum().backward()
        torch.optim.SGD(model.parameters(), lr=0.1).step()

    with metamem.trace(device="cuda") as checkpointed:
        step("cuda")
    with metamem.trace(device="cuda") as plain:
        model = torch.nn.Sequential(*(mlp(dropout=0.1) for _ in range(4))).cuda()
        model(torch.randn(1024, 64, device="cuda", requires_grad=True)).sum().backward()
        torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert checkpointed.peak_bytes < plain.peak_bytes
    traced, achieved = trace_and_run(lambda: step("cuda"))  # on the CPU: code written for CUDA
    assert traced == achieved


def test_backend_flags_and_library_versions():
    cudnn_version = torch.backends.cudnn.version()
    tf32 = torch.backends.cuda.matmul.allow_tf32
    with metamem.trace(device="cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.enable_flash_sdp(True)
        assert torch.backends.cudnn.is_available() and torch.backends.cudnn.version() == cudnn_version
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = False


@pytest.mark.parametrize("move", ["cuda()", "to('cuda')", "to(device)"])
def test_moving_a_model_to_cuda(move):
    def step():
        device = torch.device("cuda:0")
        model = {"cuda()": lambda m: m.cuda(), "to('cuda')": lambda m: m.to("cuda"),
                 "to(device)": lambda m: m.to(device)}[move](mlp())
        x = torch.randn(8, 64).to(device, non_blocking=True)
        model(x).sum().backward()

    with metamem.trace(device="cuda") as t:
        step()
        assert t is not None and next(iter(torch.nn.Linear(2, 2).cuda().parameters())).is_cuda
    assert t.peak_bytes > 0
    traced, achieved = trace_and_run(step)
    assert traced == achieved


def test_a_module_made_and_moved_in_the_block_is_freed_when_let_go():
    # BatchNorm2d makes num_batches_tracked from a Python number (a host
    # tensor) and .cuda() replaces it in the block: the record that puts it
    # back held the module's buffers until the block ended (1,536 B after
    # this step, where real torch holds none); now it holds the module
    # weakly. A module from before the block is still put back.
    kept = torch.nn.BatchNorm2d(8)
    counter = kept.num_batches_tracked

    def step():
        x = torch.randn(8, 64, 56, 56, device="cuda", requires_grad=True)
        torch.nn.BatchNorm2d(64).cuda()(x).sum().backward()

    with metamem.trace(device="cuda"):
        step()
        assert torch.cuda.memory_allocated() == 0
        kept.cuda()
        assert kept.num_batches_tracked is not counter
    assert kept.num_batches_tracked is counter and counter.device.type == "cpu"


def test_pinned_host_memory_is_not_the_gpus():
    # A DataLoader's pinned batch and a script's pinned staging buffer hold
    # host memory: pinning a traced tensor gives the tensor itself.
    def step(pin):
        batch = torch.randn(8, 64)
        if pin:
            pinned = batch.pin_memory()
            assert pinned is batch and pinned.is_pinned()
            assert torch.empty(8, 64, pin_memory=True).is_pinned()
        mlp().cuda()(batch.cuda(non_blocking=True)).sum().backward()

    peaks = []
    for pin in (False, True):
        with metamem.trace(device="cuda") as t:
            step(pin)
        peaks.append(t.peak_bytes)
    assert peaks[0] == peaks[1] > 0


def test_host_tensors_stay_on_the_host_when_asked():
    # A dataset of 64 MiB in host memory, a batch of it copied to the GPU:
    # only the copy, the model and what it makes are the GPU's.
    dataset_bytes = 1024 * 16384 * 4

    def step(rows=1024, devices=None):
        dataset = torch.randn(rows, 16384)
        batch = dataset[:8, :64].contiguous()
        model = mlp().cuda()
        x = batch.cuda()
        scale = torch.tensor(2.0) * torch.ones(())  # a 0-dim host tensor goes with a device one
        loss = (model(x) * scale).sum()
        loss.backward()
        logged = loss.detach().cpu()
        assert batch.pin_memory() is batch  # pinned memory is the host's
        if devices is not None:
            devices += [t.device.type for t in (dataset, batch, scale, x, loss, logged)] + [x.is_pinned()]

    peaks, devices = {}, []
    for rows in (1024, 8):
        with metamem.trace(device="cuda", host_tensors="host") as t:
            step(rows, devices)
        peaks[rows] = t.peak_bytes
    assert devices == ["cpu", "cpu", "cpu", "cuda", "cuda", "cpu", False] * 2
    assert peaks[1024] == peaks[8] > 0
    # By default a block's host tensors stand on the GPU; on a fake cpu the
    # host is the device: the dataset counts in both.
    with metamem.trace(device="cuda") as on_device:
        step()
    assert on_device.peak_bytes >= peaks[8] + dataset_bytes
    with metamem.trace(device="cpu", host_tensors="host") as on_cpu:
        step()
    assert on_cpu.peak_bytes > dataset_bytes
    with pytest.raises(ValueError, match="host_tensors must be 'device' or 'host'"):
        with metamem.trace(device="cuda", host_tensors="pinned"):
            pass


def test_an_lstm_on_host_tensors_runs_on_the_host_in_a_fake_cuda_trace():
    # The host's LSTM is the CPU's (oneDNN's layer where oneDNN is on): it
    # runs there and holds none of the GPU's memory; its output copied over
    # and summed is all the GPU holds.
    lstm = torch.nn.LSTM(16, 32)
    for onednn in (True, False):
        with torch.backends.mkldnn.flags(enabled=onednn), \
                metamem.trace(device="cuda", host_tensors="host") as t:
            out, _ = lstm(torch.randn(5, 3, 16))
            assert out.device.type == "cpu"
            out.cuda().sum()
        assert t.peak_bytes == 5 * 3 * 32 * 4 + 4


# Ops on a device tensor and a host tensor, as a script may mix them by
# mistake: each case's outcome ("ok", or the start of torch's error).
MIXED_DEVICES = """
import torch
import torch.nn.functional as F


def mixed_devices():
    a = torch.ones(4, 4, device="cuda")
    host = torch.ones(4, 4)
    scalar = torch.tensor(2.0)  # 0-dim, on the host
    rows = torch.tensor([0, 1])  # host indices
    cases = {
        "device + host": lambda: a + host,
        "device + host 0-dim": lambda: a + scalar,
        "host += device": lambda: host.clone().add_(a),
        "host + device 0-dim": lambda: host + a.sum(),
        "matmul": lambda: a @ host,
        "linear": lambda: F.linear(a, host),
        "cat": lambda: torch.cat([a, host]),
        "where, host 0-dim": lambda: torch.where(a > 0, a, scalar),
        "where, host": lambda: torch.where(a > 0, a, host),
        "masked_fill, host 0-dim": lambda: a.masked_fill(a > 0, scalar),
        "index by host indices": lambda: a[rows],
        "index_select by host indices": lambda: a.index_select(0, rows),
        "embedding of host indices": lambda: F.embedding(rows, a),
        "rows set from the host": lambda: a.clone().__setitem__(rows, host[:2]),
        "rows set to a host 0-dim": lambda: a.clone().__setitem__(rows, scalar),
        "index_put_ accumulating host values": lambda: a.clone().index_put_((rows,), host[:2], accumulate=True),
        "copy_ from the host": lambda: a.clone().copy_(host),
        "to the device first": lambda: host.cuda() + a,
    }
    outcomes = {}
    for name, case in cases.items():
        try:
            case()
            outcomes[name] = "ok"
        except RuntimeError as error:
            outcomes[name] = str(error)[:48]
    return outcomes
"""


def test_ops_that_mix_host_and_device_tensors_fail_as_on_a_gpu():
    # With host tensors on the host, an op whose CUDA kernel refuses a host
    # tensor beside a device one stops the trace with torch's error, as the
    # GPU run would stop; one that takes it (a 0-dim scalar, host indices,
    # a copy) runs. The same cases run by real torch on the fake GPU.
    # index_put takes host indices but not host values (but a 0-dim one).
    exec(MIXED_DEVICES, globals())
    with metamem.trace(device="cuda", gpu="H100-80GB", host_tensors="host"):
        traced = mixed_devices()  # noqa: F821 (defined by the exec above)
    refused = "Expected all tensors to be on the same device"
    assert {name for name, outcome in traced.items() if outcome != "ok"} == {
        "device + host", "host += device", "host + device 0-dim", "matmul", "linear", "cat", "where, host",
        "index_select by host indices", "embedding of host indices", "rows set from the host",
        "index_put_ accumulating host values"}
    assert traced["index_put_ accumulating host values"] == "expected device cuda:0 but got device cpu for va"
    assert all(outcome == "ok" or outcome.startswith(refused) for name, outcome in traced.items()
               if name != "index_put_ accumulating host values")
    # On the device by default, the host tensors are the GPU's: all run.
    with metamem.trace(device="cuda", gpu="H100-80GB"):
        assert set(mixed_devices().values()) == {"ok"}  # noqa: F821
    oracle = os.environ.get("METAMEM_ORACLE", "")
    if os.path.exists(os.path.join(oracle, "libmetamem_fake_cuda_preload.so")):
        import metamem._metamem as native
        from real_torch_on_fake_gpu import PROLOGUE, measure

        real = measure(oracle, native.gpu("H100-80GB"),
                       PROLOGUE + MIXED_DEVICES + "print(json.dumps(mixed_devices()))\n")
        assert real == traced


def test_the_fake_gpu_tells_pinned_memory_from_host_and_device_memory():
    # A host tensor copied to the device asks whether it is pinned
    # (cudaPointerGetAttributes); torchtitan's batches are.
    oracle = os.environ.get("METAMEM_ORACLE", "")
    if not os.path.exists(os.path.join(oracle, "libmetamem_fake_cuda_preload.so")):
        pytest.skip(f"METAMEM_ORACLE={oracle!r} holds no fake GPU to run real torch on")
    import metamem._metamem as native
    from real_torch_on_fake_gpu import PROLOGUE, measure

    program = PROLOGUE + textwrap.dedent("""
        import torch
        pinned = torch.empty(8, 64).pin_memory()
        host = torch.arange(64).expand(8, -1)
        on_device = host.to("cuda", non_blocking=True)
        print(json.dumps([pinned.is_pinned(), pinned[4:].is_pinned(), host.is_pinned(), on_device.stride(0),
                          torch.cuda.memory_allocated()]))
    """)
    assert measure(oracle, native.gpu("H100-80GB"), program) == [True, True, False, 64, 4096]


def test_reading_a_value_is_a_named_error_unless_placeholders_are_asked():
    for read, op in [(lambda loss: loss.item(), "aten::_local_scalar_dense"),
                     (lambda loss: bool(torch.isnan(loss)), "aten::_local_scalar_dense")]:
        with pytest.raises(metamem.ValueReadError, match='values="placeholder"') as error:
            with metamem.trace(device="cuda"):
                read(mlp().cuda()(torch.randn(4, 64, device="cuda")).sum())
        assert error.value.op == op and isinstance(error.value, metamem.UnsupportedOpError)

    logged = []
    with metamem.trace(device="cuda", values="placeholder") as t:
        model = mlp().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(2):
            loss = model(torch.randn(4, 64, device="cuda")).pow(2).mean()
            if torch.isnan(loss):  # zero is not NaN: the step goes on
                break
            loss.backward()
            opt.step()
            opt.zero_grad()
            logged.append(f"step {step}: loss {loss.item():.3f}")
    assert logged == ["step 0: loss 0.000", "step 1: loss 0.000"] and len(t.step_peaks) == 2

    with pytest.raises(ValueError, match="values must be 'error' or 'placeholder'"):
        with metamem.trace(device="cuda", values="zeros"):
            pass
    assert torch.ones(2).sum().item() == 2.0  # real tensors read real values after the block


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_inference_mode_makes_inference_tensors_and_views_of_normal_ones(device):
    # torch makes a view of a normal tensor in inference mode with its
    # base's keys, and autograd gives it the base's version counter: the
    # trace's view of a weight stopped every inference-mode forward.
    def step():
        model = mlp().to(device)
        with torch.inference_mode():
            out = model(torch.randn(8, 64).to(device))
            assert out.is_inference() and not model[0].weight.t().is_inference()
            out.view(-1)[:4].add_(1)  # an inference tensor is written in inference mode
        with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
            out.add_(1)
        model(torch.randn(8, 64).to(device)).sum().backward()

    with metamem.trace(device=device) as t:
        step()
    if device == "cpu":
        assert t.peak_bytes == metamem.achieved_cpu(step)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_distributions_check_their_arguments_and_find_them_valid(device):
    # torch.distributions checks each argument and sample it is given
    # (torch._is_all_true of the constraint), on values a trace does not
    # know: the check holds, as in a healthy step. It read a value before.
    def step():
        encoder = torch.nn.Linear(64, 32).to(device)
        mean, log_std = encoder(torch.randn(16, 64).to(device)).chunk(2, dim=1)
        posterior = torch.distributions.Normal(mean, log_std.exp())
        prior = torch.distributions.Normal(torch.zeros_like(mean), torch.ones_like(mean))
        sample = posterior.rsample()
        (torch.distributions.kl_divergence(posterior, prior).sum() - posterior.log_prob(sample).sum()).backward()

    with metamem.trace(device=device) as t:
        step()
    if device == "cpu":
        assert t.peak_bytes == metamem.achieved_cpu(step)
    with pytest.raises(ValueError, match="Expected parameter scale"):  # a real tensor is checked for real
        torch.distributions.Normal(torch.zeros(2), -torch.ones(2))


def test_a_tied_weight_moves_once_beside_host_tensors():
    # Host and device tensors are of one kind, as real CPU and CUDA ones:
    # Module._apply moves a parameter in place, and a head tied to its
    # embedding stays tied (it was moved twice, and trained as two).
    with metamem.trace(device="cuda", host_tensors="host"):
        embed = torch.nn.Embedding(1024, 512)
        head = torch.nn.Linear(512, 1024, bias=False)
        head.weight = embed.weight
        weight = embed.weight
        torch.nn.ModuleList([embed, head]).cuda()
        assert head.weight is embed.weight is weight and weight.is_cuda
        assert torch.cuda.memory_allocated() == 1024 * 512 * 4
        host = torch.randn(4, 4)
        host.data = host.data.cuda()
        assert host.is_cuda
        with torch.autocast("cuda", torch.bfloat16):  # each autocast casts its own device's tensors
            assert (host @ host).dtype == torch.bfloat16
            assert (torch.randn(4, 4) @ torch.randn(4, 4)).dtype == torch.float32
        with torch.autocast("cpu", torch.bfloat16):
            assert (host @ host).dtype == torch.float32
            assert (torch.randn(4, 4) @ torch.randn(4, 4)).dtype == torch.bfloat16


def test_per_sample_gradients_by_torch_func_trace_on_cuda_and_are_exact_on_cpu():
    # Before: functional_call inside grad and vmap gives the model the
    # transforms' wrappers as parameters, and the trace, marking a model's
    # parameters as it first runs, stopped reading their data.
    from torch.func import functional_call, grad, vmap

    def step(device):
        torch.manual_seed(0)
        model = mlp().to(device)
        params = {name: p.detach() for name, p in model.named_parameters()}

        def loss(p, x, y):
            return torch.nn.functional.cross_entropy(functional_call(model, p, (x[None],)), y[None])

        x, y = torch.randn(32, 64, device=device), torch.randint(0, 64, (32,), device=device)
        grads = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
        for name, g in grads.items():
            params[name] = params[name] - 0.1 * g.sum(0)

    with metamem.trace(device="cuda") as t:
        step("cuda")
    assert t.peak_bytes > 32 * 4 * sum(p.numel() for p in mlp().parameters())  # a gradient per sample
    traced, achieved = trace_and_run(lambda: step("cpu"))
    assert traced == achieved


@pytest.mark.parametrize("gpu, idiom", one_gpu_each(idiom_steps.GPUS, list(idiom_steps.IDIOMS)))
def test_each_idiom_of_a_training_script_is_exact_against_real_torch_on_the_fake_gpu(gpu, idiom):
    # Two steps, max allocated and max reserved, cuDNN on, traced as
    # `metamem run` traces (idiom_steps.py; the table in docs/accuracy.md).
    oracle = os.environ.get("METAMEM_ORACLE", "")
    if not os.path.exists(os.path.join(oracle, "libmetamem_fake_cuda_preload.so")):
        pytest.skip(f"METAMEM_ORACLE={oracle!r} holds no fake GPU to run real torch on")
    row = idiom_steps.compare(idiom, gpu, oracle)
    assert row["traced"] == row["real"]
