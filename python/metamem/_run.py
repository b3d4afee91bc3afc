"""`metamem run SCRIPT ARGS`: a training script, unchanged, under a trace.

The script runs as `python SCRIPT ARGS` runs it (its `__main__`, its
`sys.argv`, its folder first on `sys.path`) inside `metamem.trace`, and
stops after its K-th optimizer step: nothing after it runs. What the trace
cannot do for it is said, not hidden: `torch.save` writes nothing (a trace
has shapes, not values), a value read from a traced tensor is a
placeholder, and the run lists where each happened. With a job's shape
(torchrun's --nproc-per-node and --nnodes), the script runs as one rank
of it.
"""

import contextlib
import os
import runpy
import sys
import traceback

import torch
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook

from . import _metamem, trace
from ._checkpointing import checkpoint_blocks, recomputing
from ._cuda import Patches

# The Tensor methods through which Python reads a value.
_VALUE_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__")
_LIBRARIES = tuple(os.path.dirname(module.__file__) + os.sep for module in (torch, sys.modules[__package__]))


class StepsDone(BaseException):
    """Ends the script after its last traced optimizer step. A
    BaseException, as KeyboardInterrupt is, so that the script's own
    `except Exception` lets it through."""


class ScriptError(Exception):
    """The script ended on an error of its own (an exception metamem did
    not raise, or a non-zero exit status), as `python SCRIPT` would have
    ended on it: named by the script's line, not taken for bad input."""


class ScriptRun:
    """What the script did beside the memory the trace holds."""

    def __init__(self, script, steps, world_size=None, rank=0, nproc_per_node=None):
        self.script = script
        self.steps_asked = steps
        self.job = None if world_size is None else {"world_size": world_size, "rank": rank,
                                                    "nproc_per_node": nproc_per_node}
        self.steps = 0  # optimizer steps taken
        self.unsaved = []  # file:line of each torch.save, which wrote nothing
        self.values_read = {}  # file:line: how many values read there the trace does not know
        self.blocks = None  # with a Checkpointing: the paths of its model's blocks

    @property
    def stopped(self):
        """Whether the run was stopped after its steps (else the script ended)."""
        return self.steps == self.steps_asked

    def json(self):
        return {"script": self.script, **({"job": self.job} if self.job else {}), "optimizer_steps": self.steps,
                "stopped": self.stopped, "unsaved": self.unsaved,
                "values_read": [{"where": where, "reads": reads} for where, reads in self.values_read.items()]}

    def lines(self):
        end = "stopped after" if self.stopped else "ended by itself after"
        out = [f"  script {self.script}: {end} {self.steps} optimizer step{'s' * (self.steps != 1)}"]
        if self.job:
            world, local = self.job["world_size"], self.job["nproc_per_node"]
            out.append(f"  as rank {self.job['rank']} of {world} ({world // local} node{'s' * (world != local)} "
                       f"of {local}), torchrun's environment")
        out += [f"  torch.save at {where} wrote nothing (a trace has no values)" for where in self.unsaved]
        out += [f"  values read at {where} ({reads}x): placeholders (zeros)" for where, reads in self.values_read.items()]
        return out


def _runs_the_script(filename):
    """Whether a frame of `filename` runs the script rather than the
    script's own code: torch, metamem and runpy (named "<frozen runpy>"
    where it is frozen)."""
    return filename.startswith(_LIBRARIES) or filename == runpy.__file__ or filename.startswith("<frozen ")


def _caller():
    """file:line of the script's (or its libraries') line that led here:
    the innermost frame of its own code."""
    frame = sys._getframe(1)
    while frame.f_back is not None and _runs_the_script(frame.f_code.co_filename):
        frame = frame.f_back
    return f"{os.path.relpath(frame.f_code.co_filename)}:{frame.f_lineno}"


def _script_error(script, error):
    """A ScriptError for what the script raised, named by the innermost
    line of its own code in the traceback (the script's, or its
    libraries'), or by the script where none is (a syntax error)."""
    own = [frame for frame in traceback.extract_tb(error.__traceback__) if not _runs_the_script(frame.filename)]
    where = f"{os.path.relpath(own[-1].filename)}:{own[-1].lineno}" if own else script
    return ScriptError(f"{where} raised {type(error).__name__}: {error}")


def _exit_raising(patches):
    """os._exit in the script ends it as sys.exit does, so that the steps it
    took are reported (a script may end so, past threads that would not
    stop). A child the script forks ends as os._exit ends it."""
    exit_now, tracing = os._exit, os.getpid()

    def exiting(status):
        if os.getpid() != tracing:
            exit_now(status)
        raise SystemExit(status)
    patches.set(os, "_exit", exiting)


def _counting_reads(run, patches):
    """Each Tensor method that reads a value, counting the reads of values
    the trace does not know, by where the script made them."""
    for name in _VALUE_READS:
        read = getattr(torch.Tensor, name)

        def counted(tensor, *args, _read=read, **kwargs):
            if _metamem.is_traced(tensor) and _metamem.known_values(tensor) is None:
                where = _caller()
                run.values_read[where] = run.values_read.get(where, 0) + 1
            return _read(tensor, *args, **kwargs)
        patches.set(torch.Tensor, name, counted)


def _recomputing_its_model(run, checkpointing, exits):
    """At the first call of a module with blocks (checkpoint_blocks), the
    script's model, entered before any of its blocks: its blocks are the
    run's, and the first `checkpointing` names are recomputed until `exits`
    close."""
    def first_call(module, args):
        blocks = checkpoint_blocks(module)
        if blocks:
            hook.remove()
            run.blocks = [f"{type(module).__name__}.{path}" for path, _ in blocks]
            exits.enter_context(recomputing(module, checkpointing))

    hook = register_module_forward_pre_hook(first_call)
    exits.callback(hook.remove)


def trace_script(script, argv, steps, device, gpu, values, world_size=None, rank=0, nproc_per_node=None,
                 checkpointing=None):
    """(Trace, ScriptRun) of `script` run with `argv`, stopped after
    `steps` optimizer steps; with `world_size`, as rank `rank` of a
    torchrun job of `nproc_per_node` ranks to a node; with a
    `checkpointing`, recomputing the blocks of the script's model it names
    (the run's `blocks`)."""
    path = os.path.abspath(script)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no script {script!r}")
    if steps < 1:
        raise ValueError("--steps must be at least 1")
    run = ScriptRun(script, steps, world_size, rank, nproc_per_node)

    def after_step(optimizer, args, kwargs):
        run.steps += 1
        if run.steps == steps:
            raise StepsDone()

    def save_nothing(obj, f, *args, **kwargs):
        run.unsaved.append(_caller())

    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(path))
    patches = Patches()
    try:
        with trace(device=device, gpu=gpu, values=values, world_size=world_size, rank=rank,
                   nproc_per_node=nproc_per_node, host_tensors="host") as t:
            patches.set(torch, "save", save_nothing)
            _exit_raising(patches)
            _counting_reads(run, patches)
            hook = register_optimizer_step_post_hook(after_step)
            try:
                with contextlib.ExitStack() as exits:
                    if checkpointing is not None:
                        _recomputing_its_model(run, checkpointing, exits)
                    runpy.run_path(path, run_name="__main__")
            except StepsDone:
                pass
            except SystemExit as exit:
                if exit.code not in (None, 0):
                    raise ScriptError(f"{script} exited with status {exit.code}") from None
            except Exception as error:
                module = type(error).__module__
                if module == __package__ or module.startswith(__package__ + "."):  # metamem's: what it cannot trace
                    raise
                raise _script_error(script, error) from error
            finally:
                hook.remove()
                patches.restore()
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return t, run
