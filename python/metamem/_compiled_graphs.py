"""The graphs a trace compiled, kept for a later trace in the process that
can run them (docs/compile.md, "Traces again in one process").

Each trace compiles as its own process would: Dynamo's first compile of a
function in a trace starts from what a fresh process knows of it. Left to
itself, Dynamo would take a trace's call with other sizes (the next batch
of a largest-batch search) for a recompile and make the changed sizes
dynamic: another graph, other buffers. What is kept, and under which
conditions it runs again:

- A function compiled once in a trace keeps that entry, and what Dynamo
  learnt of its sizes from it. A function compiled more than once in a
  trace (a recompile, perhaps dynamic) is forgotten at the trace's end.
- A kept entry runs only in a trace of the same kind: the same fake
  device and GPU (Inductor compiled for its properties), the same world
  size and ranks to a node, and the same rank, or any rank of a layout
  whose caller says its ranks compile alike (`shared_by_ranks`, as
  metamem.torchtitan does where every tensor-parallel split is even).
  Dynamo guards what the graph reads of its inputs; this guard, added to
  each entry, what a trace's settings decide around them.
- A trace whose first call of a kept function does not pass its guards
  compiles it afresh: the kept entry is dropped and Dynamo's record of
  the function's sizes cleared first, so the new graph is static, as in a
  fresh process. The new entry is kept in its place. Dropped entries stay
  in Dynamo's cache until the function is reset: in a trace Dynamo counts
  only the others (counting_live_entries), as a fresh process holds none,
  and a function is reset once it holds more than _MOST_DROPPED (outside
  traces Dynamo counts them towards its recompile limit, and each compile
  since the last reset towards its accumulated limit). A trace of another
  kind drops every kept entry as it begins.
- Between traces, Dynamo's records of sizes are as they were before the
  first: a real compile after a trace sees none of the trace's sizes.

Kept only for fake cuda, and there only where running a graph again is
what compiling it would have held: a kernel's first call autotunes again
(metamem._compile), and a trace keeps nothing where compiling allocated
in it (an optimizer's compiled step, whose state Dynamo makes as it
compiles; max-autotune's and pad_mm's benchmarks; CUDA graph trees, which
are the trace's own). On a fake cpu, what a compile leaves behind in host
memory (a constant Dynamo makes a tensor of: 8 B for `x * 2`) is the
first step's, in a trace as in a real process, and a trace that did not
compile would not hold it: a fake cpu's traces compile every time.
"""

import contextlib
import copy
import threading

# The trace running on each thread (Traces), whose kind a kept entry's
# guard compares with its own.
_RUNNING = {}


class _Kept:
    def __init__(self, key, guards, sizes):
        self.key = key
        self.guards = guards  # Dynamo's CheckFunctionManager of the entry
        self.sizes = sizes  # Dynamo's CodeState of the function after the compile (pgo), or None


# code object -> _Kept, for every trace of the process
_KEPT = {}

# Threads whose rank traces run graphs compiled for any rank of the layout.
_ALIKE = set()

# The dropped entries a function may hold: a function that drops one more
# is reset.
_MOST_DROPPED = 2


@contextlib.contextmanager
def ranks_compile_alike():
    """On this thread, for the block: a trace of one rank runs the graphs
    a trace of another rank of the same job compiled. The caller knows
    that its ranks compile the same graphs: Dynamo bakes what a graph
    reads of the rank (a mesh coordinate, an uneven shard's size) into it
    without a guard, so that it holds only where no split depends on it."""
    owner = threading.get_ident()
    added = owner not in _ALIKE
    _ALIKE.add(owner)
    try:
        yield
    finally:
        if added:
            _ALIKE.discard(owner)


def kind_of_trace(device, gpu, world_size, devices, rank):
    """Which traces run one another's graphs: those on the same fake
    `device` and `gpu` (Inductor compiled for its properties), of the same
    rank of a job of `world_size` ranks with `devices` GPUs to a node,
    or of any of its ranks within ranks_compile_alike()."""
    if world_size is not None and threading.get_ident() in _ALIKE:
        rank = "any"
    return device, gpu if device == "cuda" else None, world_size, devices, rank


def _code_states():
    """Dynamo's records of sizes by function (torch._dynamo.pgo), made if none."""
    from torch._dynamo import pgo

    return pgo.get_code_state()


def _code_ids(code):
    """The keys of `code` in Dynamo's records of sizes."""
    states = _code_states()
    return [code_id for code_id in states
            if (code_id.filename, code_id.firstlineno, code_id.name) == (code.co_filename, code.co_firstlineno,
                                                                         code.co_name)]


def _sizes_of(code):
    ids = _code_ids(code)
    return copy.deepcopy({code_id: _code_states()[code_id] for code_id in ids})


def _set_sizes(code, sizes):
    """Dynamo's records of `code`'s sizes made `sizes` (from _sizes_of)."""
    states = _code_states()
    for code_id in _code_ids(code):
        del states[code_id]
    states.update(copy.deepcopy(sizes))


def _invalidate(code, guards_list, why):
    """Dynamo's entries of `code` made with `guards_list`, those still in its
    cache (torch._dynamo.reset() empties it), invalidated."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    live = {id(entry.guard_manager) for entry in _debug_get_cache_entry_list(code)}
    for guards in guards_list:
        if id(guards.guard_manager) in live:
            guards.invalidate(why)  # "... got deallocated": Dynamo's words


def _dropped(entry):
    """Whether Dynamo's cache entry `entry` is invalid (passes no guard)."""
    from torch._dynamo.guards import DeletedGuardManagerWrapper

    return isinstance(entry.guard_manager, DeletedGuardManagerWrapper)


def _dropped_entries(code):
    """How many of Dynamo's entries of `code` are invalid."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return sum(map(_dropped, _debug_get_cache_entry_list(code)))


def counting_live_entries(compute_cache_size):
    """Dynamo's convert_frame.compute_cache_size(frame, entries, total),
    where a trace compiles: over the entries not dropped. Dynamo counts
    every entry of a function towards its recompile limit (8) and takes a
    compile beside any for a recompile; a process of its own would hold
    none of the dropped ones."""
    def compute(frame, entries, total=0):
        if threading.get_ident() not in _RUNNING:
            return compute_cache_size(frame, entries, total)
        live = [entry for entry in entries if not _dropped(entry)]
        return compute_cache_size(frame, live, total - (len(entries) - len(live)))
    return compute


def _drop(code, guards_list, why):
    """_invalidate(); a function whose every entry is invalid is reset, so
    that they stop counting towards its recompile limit."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list, reset_code

    _invalidate(code, guards_list, why)
    if all(map(_dropped, _debug_get_cache_entry_list(code))):
        reset_code(code)


class Traces:
    """One trace's part: entered as the trace begins, on its thread; `key`
    says which traces may run its graphs (a hashable value, kind_of_trace),
    `keeps` whether any is kept for them."""

    def __init__(self, key, keeps=True):
        self.key = key
        self.owner = threading.get_ident()
        self.compiled = []  # (code, guards) of each entry compiled in the trace, in order
        self.carried = set()  # kept codes of earlier traces that this one may run
        self.ran = set()  # codes whose kept entry this trace ran
        self.sizes_before = {}  # code -> its records of sizes before the trace
        self.not_kept = set()  # codes whose entries go with the trace
        self.keep = keeps  # False: nothing this trace compiled is kept

    def __enter__(self):
        for code in list(_KEPT):
            kept = _KEPT[code]
            if kept.key != self.key:
                del _KEPT[code]
                _drop(code, [kept.guards], "a trace of another kind")
                continue
            self._remember_sizes(code)
            _set_sizes(code, kept.sizes)
            self.carried.add(code)
        _RUNNING[self.owner] = self
        return self

    def __exit__(self, *exc):
        _RUNNING.pop(self.owner, None)
        by_code = {}
        for code, guards in self.compiled:
            by_code.setdefault(code, []).append(guards)
        for code, guards_list in by_code.items():
            # Kept: a function compiled once, in a trace that ran no kept
            # entry of it (that graph is what a fresh process compiles),
            # beside at most _MOST_DROPPED dropped ones.
            earlier = _KEPT.pop(code, None)
            if (self.keep and len(guards_list) == 1 and code not in self.not_kept and earlier is None
                    and _dropped_entries(code) <= _MOST_DROPPED):
                _KEPT[code] = _Kept(self.key, guards_list[0], _sizes_of(code))
            else:
                _drop(code, guards_list + ([earlier.guards] if earlier else []), "a trace recompiled it")
        for code, sizes in self.sizes_before.items():
            _set_sizes(code, sizes)

    def compiling(self, code):
        """As Dynamo begins compiling `code` for this trace: where it is a
        kept function whose kept entry this trace has not run, that entry
        did not pass its guards at the first call. It is invalidated
        (Dynamo is using its cache: the function is reset when the trace
        ends, if its new entry is not kept), and the sizes it recorded
        cleared, so that the new graph is static. After a run of the kept
        entry, a recompile is Dynamo's own, from the sizes of that entry, as
        in the process that compiled it."""
        self._remember_sizes(code)
        if code in self.carried and code not in self.ran:
            self.carried.discard(code)
            _invalidate(code, [_KEPT.pop(code).guards], "a trace of other sizes")
            _set_sizes(code, {})

    def guarded(self, code, guards, keepable=True):
        """`guards`, Dynamo's guards of an entry of `code` compiled in this
        trace: they pass only in traces of its kind. An entry not
        `keepable` is dropped with the trace."""
        key = self.key

        def same_kind(_):
            # Dynamo asks this last, when the entry's own guards passed: a
            # trace of the same kind runs it.
            running = _RUNNING.get(threading.get_ident())
            if running is None or running.key != key:
                return False
            running.ran.add(code)
            return True

        guards.guard_manager.root.add_epilogue_lambda_guard(
            same_kind, [f"metamem: a trace of the kind {key!r}"], None)
        self.compiled.append((code, guards))
        if not keepable:
            self.not_kept.add(code)

    def _remember_sizes(self, code):
        if code not in self.sizes_before:
            self.sizes_before[code] = _sizes_of(code)
