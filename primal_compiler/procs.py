"""Process pools whose workers never outlive the process that made them.

:func:`worker_pool` is the one constructor of every process pool in the
package (the sweep's local pool, ``ga-placement``'s ``executor = "process"``).
It returns a :class:`WorkerPool`, a ``ProcessPoolExecutor`` whose workers

- **die with their parent**: on Linux each worker asks the kernel for
  ``SIGKILL`` when its parent goes (``prctl(PR_SET_PDEATHSIG)``, set in the
  worker's initializer and followed by a check that the parent had not
  already gone); everywhere, a watchdog thread in each worker also exits the
  worker within :data:`WATCH_S` seconds of its parent's death (the parent
  pid no longer being the worker's parent, or, under the ``forkserver``
  start method, no longer existing). So a parent killed by ``SIGKILL`` or
  ``SIGTERM`` leaves no worker running.
- **ignore SIGINT, and die quietly on SIGTERM**: Ctrl-C reaches the whole
  foreground process group, but only the parent handles it (one
  ``KeyboardInterrupt``, in the parent); a worker takes SIGTERM's default
  action, never a handler inherited from the parent (``primal``'s SIGTERM
  handler raises an exception). Both signals are blocked in the parent while
  a worker is started, so no worker receives one before its dispositions
  are set, and no worker ever prints a traceback for either.
- **share the cores, not oversubscribe them**: each worker's native thread
  pools (OpenBLAS behind numpy's matrix products, OpenMP) are limited to the
  CPUs the process may use divided by the workers (threadpoolctl), at least
  one, and never raised (a user's ``OPENBLAS_NUM_THREADS=1`` stays). Unlimited,
  every worker's BLAS starts a thread per core: on 2 cores the GA's two
  workers ran four BLAS threads, and ``ga-placement`` on Llama-2-13B took
  6.2 s and 12.2 CPU s instead of 3.8 s and 7.6 CPU s, with the same
  placement (tiles and slots compared byte for byte).
- **are killed, not waited for, on an error**: :meth:`WorkerPool.shutdown`
  called while an exception propagates (in a ``finally`` or ``except``
  block, or leaving a ``with`` block) kills the workers at once instead of
  waiting for their running tasks, whose results nobody would read; an
  interrupted sweep or compile ends in well under a second.

On Linux the parent-death signal is tied to the thread that starts a worker
(the thread of the first ``submit``); the watchdog covers a pool whose
starting thread exits early.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from multiprocessing.context import BaseContext

from threadpoolctl import threadpool_info, threadpool_limits

#: Seconds between a worker's checks that its parent is alive.
WATCH_S = 0.5
_PR_SET_PDEATHSIG = 1
_ORPHAN_EXIT = 70  # exit status of a worker that found its parent gone (never seen by anyone)


class WorkerPool(ProcessPoolExecutor):
    """A ``ProcessPoolExecutor`` whose workers die with their parent and ignore SIGINT (module docstring).

    ``mp_context`` is the multiprocessing start method's context (default: the platform's).
    """

    def __init__(self, max_workers: int | None = None, *, mp_context: BaseContext | None = None) -> None:
        ctx = mp_context or multiprocessing.get_context()
        direct = ctx.get_start_method() != "forkserver"  # forkserver: the workers' parent is the fork server
        cores = _cores()
        threads = max(1, cores // (max_workers or cores))
        super().__init__(max_workers=max_workers, mp_context=ctx, initializer=_init_worker,
                         initargs=(os.getpid(), direct, threads))

    def _spawn_process(self) -> None:  # ProcessPoolExecutor's hook that starts one worker
        with _signals_blocked():
            # typeshed's ProcessPoolExecutor stub lists _adjust_process_count but omits the hook it calls
            # (CPython 3.9+), so mypy cannot see it on the superclass
            super()._spawn_process()  # type: ignore[misc]

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """As ``ProcessPoolExecutor.shutdown``; while an exception propagates, kill the workers first."""
        if sys.exc_info()[1] is not None:
            _kill_workers(self)
            cancel_futures = True
        super().shutdown(wait=wait, cancel_futures=cancel_futures)


def worker_pool(max_workers: int | None = None) -> WorkerPool:
    """A :class:`WorkerPool` of ``max_workers`` processes (default: the CPU count)."""
    return WorkerPool(max_workers)


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    """SIGKILL every live worker of ``pool`` (its running tasks are lost; the pool becomes broken)."""
    for p in list((getattr(pool, "_processes", None) or {}).values()):
        if p.is_alive():
            p.kill()


_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextmanager
def _signals_blocked() -> Iterator[None]:
    """SIGINT and SIGTERM held pending in this thread (a child started inside inherits the block)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _cores() -> int:
    """The CPUs this process may run on (its affinity where the platform says, else the CPU count)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def _limit_threads(threads: int) -> None:
    """Native thread pools (BLAS, OpenMP) at most ``threads`` threads each, never more than they have.

    Libraries loaded later (a spawned worker imports numpy when its first task does) start within the
    share through the environment variables they read, unless the user set those; numpy's BLAS is loaded
    here so the limit reaches it under every start method.
    """
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(threads))
    import numpy  # noqa: F401  (loads the BLAS the limit applies to)

    over = {pool["prefix"]: threads for pool in threadpool_info() if pool["num_threads"] > threads}
    if over:
        threadpool_limits(limits=over)


def _init_worker(parent_pid: int, direct: bool, threads: int) -> None:
    """Worker initializer: ignore SIGINT, default SIGTERM, die with ``parent_pid`` (``direct``: our parent);
    native thread pools (BLAS, OpenMP) use at most ``threads`` threads."""
    _limit_threads(threads)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):  # a pending SIGINT is now discarded, a pending SIGTERM ends us
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
    _set_parent_death_signal()
    if not _parent_alive(parent_pid, direct):  # it died before the death signal was armed
        os._exit(_ORPHAN_EXIT)
    threading.Thread(target=_watch, args=(parent_pid, direct), name="primal-parent-watch", daemon=True).start()


def _set_parent_death_signal() -> None:
    """Linux: SIGKILL this process when its parent (thread) exits; elsewhere nothing (the watchdog remains)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl in this libc: the watchdog remains
        pass


def _parent_alive(parent_pid: int, direct: bool) -> bool:
    if direct:  # an orphan is re-parented (to init or a subreaper), so its parent pid changes
        return os.getppid() == parent_pid
    try:  # forkserver: the pool's process is the grandparent (POSIX only, where os.kill(pid, 0) only probes)
        os.kill(parent_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _watch(parent_pid: int, direct: bool) -> None:
    while _parent_alive(parent_pid, direct):
        time.sleep(WATCH_S)
    os._exit(_ORPHAN_EXIT)
