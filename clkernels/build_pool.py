"""Builds from source in worker processes, side by side, into the binary cache.

Why processes: a driver's compiler is the cold start's cost (NVIDIA's: 0.2-2.5 s a program, about
6 s for a bundle-adjustment solve's seven), and a driver serialises the builds of one process, so
threads gain nothing (:mod:`clkernels.warmup`'s measurements in the README). Separate processes
compile at once, one core each.

How: :func:`clkernels.templates.prefetch` hands the sources of the programs a caller is about to
ask for, and that the binary cache lacks, to :func:`submit`. Each worker
(``python -m clkernels.build_worker``) opens the same device (matched by
:func:`clkernels.cache.device_identity`), then takes sources from the queue, builds each and stores
the binary in the cache, as the caller's own build would. The caller's later request for a
program waits for its worker (:func:`wait`) and loads the binary; if no worker has taken that
source yet (they are still starting, or all busy), the caller takes it back and builds it itself,
at once. A worker that fails costs nothing but its time: the caller then builds in its own
process, which reports a build error as it always did.

Workers start when sources are submitted, at most :func:`max_workers` at once in a process, take
sources from one queue, and end when it is empty (so no idle process holds a device context). ``PYCLAD_BUILD_PROCESSES=0`` turns them off; a number caps them.
Left off on the Oclgrind simulator (no binary cache there), under MPI (each rank is already a
process; forking from a rank is fragile) and when the cache cannot be written.
"""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import Future
from typing import Deque, Dict, List, Optional, Tuple

from . import cache

__all__ = ["ENV", "max_workers", "enabled", "start", "submit", "wait", "pending", "running", "failed",
           "stats"]

ENV = "PYCLAD_BUILD_PROCESSES"
_MPI_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # where clkernels is imported from

_lock = threading.Lock()
_pending: Dict[str, Future] = {}        # program key -> the worker's result (None or an error text)


def max_workers() -> int:
    """How many worker processes a batch may start: ``$PYCLAD_BUILD_PROCESSES``, else the cores
    this process may use (at most 8)."""
    text = os.environ.get(ENV, "").strip()
    if text:
        try:
            return max(0, int(text))
        except ValueError:
            raise ValueError(f"{ENV}={text!r}: give a number of worker processes (0 turns them off)") from None
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return min(8, cores)


def enabled() -> bool:
    """Whether builds may go to worker processes here (see the module docstring)."""
    if max_workers() < 1 or any(os.environ.get(v) for v in _MPI_VARIABLES):
        return False
    return cache.writable()


class _Worker:
    """One ``python -m clkernels.build_worker`` process."""

    def __init__(self, identity: str):
        env = dict(os.environ)
        # The worker imports clkernels from where this process did.
        env["PYTHONPATH"] = _ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen([sys.executable, "-m", "clkernels.build_worker", identity],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env, text=True, bufsize=1)

    def ready(self) -> Optional[str]:
        """Wait until the worker has opened its device: None, or why it cannot build."""
        try:
            line = self.proc.stdout.readline()
            if not line:
                return f"the worker ended (exit {self.proc.wait()})"
            answer = json.loads(line)
            return None if answer.get("ready") else (answer.get("error") or "the worker is not ready")
        except (OSError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"

    def build(self, job: dict) -> Optional[str]:
        """The job's error text, or None once its binary is in the cache."""
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
            return json.loads(line).get("error") if line else f"the worker ended (exit {self.proc.poll()})"
        except (OSError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"

    def close(self):
        try:
            self.proc.stdin.close()      # the worker ends at the end of its input
        except OSError:
            pass


_queues: Dict[str, Deque[Tuple[Future, dict]]] = {}   # device identity -> jobs not yet taken
_live: Dict[str, int] = {}                             # device identity -> workers running
_idle: Dict[str, int] = {}                             # of them, started ahead and not yet given a job
_arrived = threading.Condition(_lock)                  # notified when jobs are queued
_failed: Dict[str, str] = {}                           # device identity -> why its workers could not start
_warned: set = set()                                   # device identities warned of that
_taken_back = 0                                        # jobs the caller built itself (wait)
LINGER_S = 10.0       # how long a worker started ahead (start()) waits for its first job


def _serve(identity: str, linger: float) -> None:
    """A worker's thread: start the process, build jobs of ``identity`` until none is left, end.
    A worker started ahead (``linger`` > 0) first waits that long for jobs to come."""
    # A job is taken only once the worker's device is open (its start: about a second), so that
    # until then the caller can take a job back (wait) rather than wait for a worker to start.
    idle = linger > 0
    try:
        worker = _Worker(identity)
        error = worker.ready()
    except OSError as exc:
        worker, error = None, f"could not start a build worker process: {exc}"
    if error is not None:    # its jobs stay queued: the caller takes them back when it needs them
        if worker is not None:
            worker.close()
        with _lock:
            _live[identity] -= 1
            if idle:
                _idle[identity] -= 1
            first = identity not in _warned
            _warned.add(identity)
        if first:
            warnings.warn(f"build worker processes cannot start ({error.splitlines()[0][:300]}); programs are "
                          f"built in this process (set {ENV}=0 to stop trying)", cache.CacheWarning, stacklevel=2)
        with _lock:             # after the warning: whoever sees failed() has been warned
            _failed[identity] = error
        return
    deadline = time.monotonic() + linger
    while True:
        with _arrived:
            queue = _queues[identity]
            while not queue and idle and time.monotonic() < deadline:
                _arrived.wait(deadline - time.monotonic())
            if idle:
                _idle[identity] -= 1
                idle = False
            if not queue:
                _live[identity] -= 1
                break
            future, job = queue.popleft()
        future.set_result(worker.build(job))
    worker.close()


def _start_workers(identity: str, count: int, linger: float) -> None:
    for _ in range(count):
        threading.Thread(target=_serve, args=(identity, linger), daemon=True, name="clkernels-build-worker").start()


def start(identity: str, count: Optional[int] = None, linger: float = LINGER_S) -> int:
    """Start worker processes for the device of ``identity`` now, before their sources are known, so
    that their start (the interpreter, pyopencl, the device's context: about a second) overlaps the
    caller's own; each waits up to ``linger`` seconds for a job. Returns how many were started."""
    if not enabled() or identity in _failed:
        return 0
    limit = max_workers()
    with _lock:
        _queues.setdefault(identity, collections.deque())
        live = _live.get(identity, 0)
        n = max(0, min(limit if count is None else count, limit) - live)
        _live[identity] = live + n
        _idle[identity] = _idle.get(identity, 0) + n
    _start_workers(identity, n, linger)
    return n


def submit(identity: str, jobs: List[Tuple[str, str, tuple, str]]) -> int:
    """Build ``jobs`` — ``(program key, source, options, name)`` — in worker processes for the
    device of ``identity``, at most :func:`max_workers` at once in this process (workers end when
    no job is left); :func:`wait` on a key blocks until its binary is in the cache (or the worker
    failed). Returns how many jobs were queued (none where workers cannot start here)."""
    limit = max_workers()
    if limit < 1 or identity in _failed:
        return 0
    queued = 0
    with _arrived:
        queue = _queues.setdefault(identity, collections.deque())
        # The longest sources first: a batch ends about when its largest build does.
        for key, source, options, name in sorted(jobs, key=lambda j: -len(j[1])):
            if key not in _pending:
                _pending[key] = future = Future()
                queued += 1
                queue.append((future, {"key": key, "source": source, "options": list(options), "name": name}))
        live = _live.get(identity, 0)
        n = max(0, min(limit - live, len(queue) - _idle.get(identity, 0)))
        _live[identity] = live + n
        _arrived.notify_all()
    _start_workers(identity, n, 0.0)
    return queued


def _take_back(future: Future) -> bool:
    """Remove ``future``'s job from its queue if no worker has taken it (the caller holds _lock)."""
    for queue in _queues.values():
        for entry in queue:
            if entry[0] is future:
                queue.remove(entry)
                return True
    return False


def running(identity: str) -> int:
    """How many worker processes of ``identity`` are running (starting, idle or building)."""
    with _lock:
        return _live.get(identity, 0)


def failed(identity: str) -> Optional[str]:
    """Why the worker processes of ``identity`` could not start (None: they could, or none tried)."""
    with _lock:
        return _failed.get(identity)


def stats() -> Dict[str, int]:
    """``{"taken_back": n}``: the jobs that no worker had taken when the caller needed them, which
    the caller then built itself."""
    with _lock:
        return {"taken_back": _taken_back}


def pending(key: str) -> bool:
    with _lock:
        return key in _pending


def wait(key: str) -> Optional[str]:
    """Wait for the worker building ``key``, if any; returns its error text (None: built, or no
    worker had it).

    A job that no worker has taken yet is taken back instead (None, and no binary: the caller
    builds it in its own process, at once). The caller would otherwise sit idle until a worker
    is free or has started, about a second on NVIDIA's driver, and then for the whole build."""
    global _taken_back
    with _lock:
        future = _pending.get(key)
        if future is not None and _take_back(future):
            _taken_back += 1
            _pending.pop(key, None)
            future.set_result(None)
            return None
    if future is None:
        return None
    error = future.result()
    with _lock:
        _pending.pop(key, None)
    return error
