"""Work that splits into independent calls (a layout search's layouts,
each its own traces), run where the user asks: in this process, in
processes of this machine, or as Ray tasks on a cluster; with a progress
bar over the calls on a terminal."""

import concurrent.futures
import multiprocessing
import sys

__all__ = ["each_apart"]


def each_apart(function, calls, jobs=1, ray=None, setup=None):
    """[function(*call) for call in calls], in this process (jobs 1), in
    `jobs` spawned processes (each imports torch afresh: the calls share
    nothing), or with `ray` as Ray tasks of one CPU on the cluster at that
    address ("local": one started for these calls and stopped after them).
    `setup` runs first in each process. `function` and the calls must
    pickle, and the cluster's machines import what they name."""
    progress = Progress(len(calls))
    if ray is not None:
        results = _on_ray(ray, function, calls, progress, setup)
    elif jobs == 1:
        results = [progress.done(function(*call)) for call in calls]
    else:
        with concurrent.futures.ProcessPoolExecutor(min(jobs, len(calls)), initializer=setup,
                                                    mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(function, *call) for call in calls]
            for future in concurrent.futures.as_completed(futures):
                progress.done(future)
            results = [future.result() for future in futures]
    progress.close()
    return results


class Progress:
    """A progress bar over calls, on stderr where it is a terminal (a
    program reading the output sees none)."""

    def __init__(self, total):
        self.total, self.finished = total, 0
        self.shown = sys.stderr.isatty()
        self._draw()

    def done(self, result):
        self.finished += 1
        self._draw()
        return result

    def close(self):
        if self.shown:
            print(file=sys.stderr)

    def _draw(self):
        if self.shown:
            filled = 30 * self.finished // max(self.total, 1)
            print(f"\r  [{'#' * filled}{'.' * (30 - filled)}] {self.finished}/{self.total} done", end="",
                  file=sys.stderr, flush=True)


def _on_ray(address, function, calls, progress, setup):
    try:
        import ray
    except ImportError as error:
        raise ImportError("--ray needs Ray: pip install ray==2.60.0 (metamem's [cluster] extra)") from error
    ray.init(address=None if address == "local" else address, include_dashboard=False, log_to_driver=False,
             configure_logging=False, runtime_env={"worker_process_setup_hook": setup} if setup else None)
    try:
        task = ray.remote(num_cpus=1)(function)
        pending = refs = [task.remote(*call) for call in calls]
        while pending:
            ready, pending = ray.wait(pending)
            for ref in ready:
                progress.done(ref)
        return ray.get(refs)
    finally:
        ray.shutdown()
