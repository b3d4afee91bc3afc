"""A training step captured in a CUDA graph by hand, as PyTorch's notes on
CUDA graphs capture a whole network: traced on fake cuda by
test_cuda_idioms.py, and run by real torch on the fake GPU, which captures
and replays graphs as a GPU does. It imports only torch."""

import torch


def whole_network(capture_on_warmup_stream, replays=3):
    """Warm-up on a side stream, one capture of forward, backward and the
    optimizer step, replays with new data copied in, then an evaluation
    pass on the warm-up stream. Each phase's max allocated and max
    reserved."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    static_x = torch.randn(256, 1024, device="cuda")
    peaks = []

    def phase_ends():
        peaks.append([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()])
        torch.cuda.reset_peak_memory_stats()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            model(static_x).square().mean().backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    phase_ends()
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph, stream=side if capture_on_warmup_stream else None):
        model(static_x).square().mean().backward()
        opt.step()
    phase_ends()
    for _ in range(replays):
        static_x.copy_(torch.randn(256, 1024, device="cuda"))
        graph.replay()
        phase_ends()
    # The blocks the capture freed are its graph's pool's: this pass on the
    # warm-up stream cannot take them.
    with torch.no_grad(), torch.cuda.stream(side):
        model(torch.randn(1024, 1024, device="cuda")).sum()
    phase_ends()
    return peaks


def mem_pool_routing():
    """torch.cuda.use_mem_pool: the thread's requests go to a MemPool, whose
    segments empty_cache keeps while the pool is in use. Allocated and
    reserved bytes after routing, and after a pooled tensor is freed and
    the cache emptied."""
    x = torch.empty(3 << 20, device="cuda")  # 12 MiB: a segment of its own, cached once freed
    del x
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        pooled = torch.empty(3 << 20, device="cuda")  # not in the cached segment: one of the pool's
        small = torch.empty(1000, device="cuda")
    outside = torch.empty(3 << 20, device="cuda")  # the cached segment
    states = [[torch.cuda.memory_allocated(), torch.cuda.memory_reserved()]]
    del pooled
    torch.cuda.empty_cache()  # the pool's free segment stays: the pool is in use
    states.append([torch.cuda.memory_allocated(), torch.cuda.memory_reserved()])
    del small, outside
    return states


def forked_capture(join_by_event):
    """A capture whose work forks to a side stream and joins back, as FSDP2's
    all-gather stream does inside a captured step: the side stream waits on
    the capturing one (wait_stream, or wait_event on an event recorded
    there), so CUDA captures it too and c10 serves its requests from the
    graph's pool, not from the side stream's cached segment. Allocated and
    reserved bytes after the capture, and after a request on the side
    stream once the capture has ended (its cache serves it again)."""
    side, capturing = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.empty(3 << 20, device="cuda")  # 12 MiB, freed: the side stream's cached 12 MiB segment
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(capturing):
        graph.capture_begin()
        if join_by_event:
            event = torch.cuda.Event()
            event.record(capturing)
            side.wait_event(event)
        else:
            side.wait_stream(capturing)
        with torch.cuda.stream(side):
            captured = torch.empty(3 << 20, device="cuda")  # the graph pool's segment
        capturing.wait_stream(side)
        graph.capture_end()
    states = [[torch.cuda.memory_allocated(), torch.cuda.memory_reserved()]]
    with torch.cuda.stream(side):
        after = torch.empty(3 << 20, device="cuda")  # the cached segment
    states.append([torch.cuda.memory_allocated(), torch.cuda.memory_reserved()])
    del captured, after
    return states


def rng_state_read_in_capture(then_draw):
    """A capture that reads CUDA's generator's state first, as activation
    checkpointing does at each region's start, and then maybe draws
    (dropout). Allocated and reserved bytes after the capture, after a
    second capture that does the same, and after both graphs are gone."""
    x = torch.ones(1024, device="cuda")
    states = []
    graphs = []
    for _ in range(2):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            torch.cuda.get_rng_state()
            torch.cuda.get_rng_state()  # a second read makes nothing more
            y = torch.nn.functional.dropout(x, 0.5) if then_draw else x * 2
        graphs.append((graph, y))
        states.append([torch.cuda.memory_allocated(), torch.cuda.memory_reserved()])
    del graphs, graph, y
    states.append([torch.cuda.memory_allocated(), torch.cuda.memory_reserved()])
    return states
