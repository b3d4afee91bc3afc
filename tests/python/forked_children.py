"""Children of real torch on the fake GPU, forked from a Python that has
imported torch already.

A child that runs one case of real torch on the fake GPU spends about 1.5 s
of its 1.7 s starting Python and importing torch; the suites that compare
traces with real torch run some 400 of them in CI. A zygote, started as such
a child would be (the same interpreter, environment and fake runtime
preloaded), imports torch once and forks a child per request that runs the
program as `python -c PROGRAM ARGS...` would: its own `__main__`, argv,
environment and working directory, CUDA first initialized in the child (the
zygote never touches it, so each child meets the fake GPU and torch's
allocator as a fresh process does). A child leaves by os._exit, its exit
handlers not run, as the tests' programs leave (real_torch_on_fake_gpu's
LEAVE); measure() starts a program that ends through them as a process.

Requests and answers are JSON lines on the zygote's stdin and stdout; a
child's own output goes to files, which no pipe's capacity can stop.
"""

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time

# Set in each child, and read by neither Python's start nor torch's import:
# a zygote serves any environment that differs from its own in these alone.
PER_CHILD = {"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR"}

ZYGOTE = r"""
import builtins, json, os, sys, traceback, types
import torch

def child(request):
    os.setpgid(0, 0)  # its own group, which a timeout kills whole
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_TRUNC), fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = ["-c", *request["args"]]
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    code = 0
    try:
        exec(compile(request["program"], "<string>", "exec"), main.__dict__)
    except SystemExit as leaving:
        code = leaving.code if isinstance(leaving.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        child(request)
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class _Zygote:
    def __init__(self, env):
        self.env = env
        self.process = subprocess.Popen([sys.executable, "-c", ZYGOTE], env=env, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)

    def answer(self, deadline):
        ready, _, _ = select.select([self.process.stdout], [], [], max(0.0, deadline - time.monotonic()))
        line = self.process.stdout.readline() if ready else ""
        if not line:
            raise TimeoutError if not ready else RuntimeError("the zygote of real torch on the fake GPU died")
        return json.loads(line)

    def close(self):
        self.process.kill()
        self.process.wait()


# A zygote serves one request at a time: each thread that asks (the sweeps
# run children side by side from a thread pool) has its own.
_of_thread = threading.local()
_started = []


def run(argv, env, timeout):
    """subprocess.run(argv, env=env, capture_output=True, text=True,
    timeout=timeout) for argv = [sys.executable, "-c", program, *args], the
    child forked from a zygote whose environment matches `env` in all but
    PER_CHILD."""
    assert argv[:2] == [sys.executable, "-c"], argv
    started = {key: value for key, value in env.items() if key not in PER_CHILD}
    zygote = getattr(_of_thread, "zygote", None)
    if zygote is None or zygote.env != started or zygote.process.poll() is not None:
        if zygote is not None:
            zygote.close()
            _started.remove(zygote)
        zygote = _of_thread.zygote = _Zygote(started)
        _started.append(zygote)
    deadline = time.monotonic() + timeout
    with tempfile.TemporaryDirectory() as folder:
        out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        for path in (out, err):
            open(path, "w").close()
        request = {"program": argv[2], "args": argv[3:], "env": env, "cwd": os.getcwd(), "stdout": out,
                   "stderr": err}
        zygote.process.stdin.write(json.dumps(request) + "\n")
        zygote.process.stdin.flush()
        pid = zygote.answer(deadline)["pid"]
        try:
            returncode = zygote.answer(deadline)["returncode"]
        except TimeoutError:
            os.killpg(pid, signal.SIGKILL)
            zygote.answer(time.monotonic() + 60)  # the killed child's status, before the next request
            raise subprocess.TimeoutExpired(argv, timeout)
        return subprocess.CompletedProcess(argv, returncode, open(out).read(), open(err).read())


@atexit.register
def _close():
    for zygote in _started:
        zygote.close()
