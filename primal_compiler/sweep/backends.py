"""Where sweep points run: any ``concurrent.futures.Executor``.

:func:`open_backend` yields a :class:`Backend`: a local ``ProcessPoolExecutor``
by default, or the executor of a Dask distributed ``Client`` connected to
``--scheduler tcp://HOST:PORT`` or ``--scheduler-file F`` (the optional
``primal-compiler[dask]`` extra). Library callers can pass any executor of
their own to :func:`primal_compiler.sweep.run_sweep` instead.

Guarantees: an unreachable scheduler, a missing scheduler file or a missing
``distributed`` package is one :class:`InputError` raised before any point is
submitted; the backend closes what it opened (the pool, or the client — never
the remote cluster) when the block exits, and on an interrupt or error cancels
the points not yet started and kills the local workers running the others
(their rows could not be written anyway), so the block exits at once. Local
workers never outlive the sweep's process, even when it is killed
(:mod:`primal_compiler.procs`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from primal_compiler.errors import InputError
from primal_compiler.procs import WorkerPool, worker_pool


@dataclass(frozen=True)
class Backend:
    """An executor, how many points it runs at once, and a description for the progress line."""

    executor: Executor
    slots: int
    description: str
    client: Any = None  # the Dask client, when there is one
    rebuild: Any = None  # callable returning a fresh executor after a worker process died (local pool only)


def local_pool(workers: int | None = None) -> WorkerPool:
    """A pool of ``workers`` processes (default: CPU count) that die with this one (:mod:`primal_compiler.procs`)."""
    return worker_pool(workers or os.cpu_count() or 1)


@contextmanager
def open_backend(scheduler: str | None = None, scheduler_file: str | None = None, workers: int | None = None,
                 timeout_s: float = 10.0) -> Iterator[Backend]:
    """The local process pool, or a Dask cluster's executor; closed (points cancelled) when the block exits."""
    if workers is not None and workers < 1:
        raise InputError("--workers", f"must be >= 1, got {workers}")
    if scheduler and scheduler_file:
        raise InputError("--scheduler", "give --scheduler or --scheduler-file, not both")
    if not scheduler and not scheduler_file:
        n = workers or os.cpu_count() or 1
        pool = local_pool(n)
        try:
            yield Backend(pool, n, f"local process pool, {n} worker{'s' * (n != 1)}",
                          rebuild=lambda: local_pool(n))
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return
    client = connect(scheduler, scheduler_file, timeout_s)
    try:
        threads = sum(client.nthreads().values())
        slots = min(workers, threads) if workers else threads
        where = scheduler or f"scheduler file {scheduler_file}"
        nw = len(client.nthreads())
        yield Backend(client.get_executor(pure=False), max(slots, 1),
                      f"Dask cluster at {where}, {nw} worker{'s' * (nw != 1)}, {threads} threads", client=client)
    finally:
        client.close()


def connect(scheduler: str | None, scheduler_file: str | None, timeout_s: float = 10.0):
    """A Dask ``Client`` to a running scheduler; InputError naming the option if it cannot connect."""
    opt, value = ("--scheduler", scheduler) if scheduler else ("--scheduler-file", scheduler_file)
    try:
        from distributed import Client
    except ImportError:
        raise InputError(opt, "needs Dask distributed: pip install 'primal-compiler[dask]'") from None
    if scheduler_file and not os.path.isfile(scheduler_file):
        raise InputError(opt, f"{scheduler_file}: file not found")
    if scheduler:
        _reachable(scheduler, timeout_s)
    try:
        if scheduler:
            client = Client(scheduler, timeout=f"{timeout_s}s", set_as_default=False)
        else:
            client = Client(scheduler_file=scheduler_file, timeout=f"{timeout_s}s", set_as_default=False)
    except (OSError, TimeoutError, ValueError, TypeError) as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(opt, f"cannot reach the Dask scheduler {value}: {text}") from None
    if not client.nthreads():
        try:
            client.wait_for_workers(1, timeout=timeout_s)
        except (OSError, TimeoutError) as exc:
            client.close()
            raise InputError(opt, f"the Dask scheduler {value} has no workers ({exc})") from None
    return client


def _reachable(scheduler: str, timeout_s: float) -> None:
    """Open and close a TCP connection to ``scheduler``'s host and port (all of Dask's transports but ucx run
    over TCP), so an address nothing listens on is one line, not a half-built ``Client`` whose clean-up
    times out with a traceback."""
    import socket

    from primal_compiler.argtypes import scheduler_address

    scheme, host, port = scheduler_address(scheduler)  # checked where --scheduler is parsed
    if scheme == "ucx":
        return
    try:
        socket.create_connection((host, port), timeout=max(timeout_s, 0.1)).close()
    except OSError as exc:
        raise InputError("--scheduler", f"cannot reach the Dask scheduler {scheduler}: "
                                        f"{exc.strerror or type(exc).__name__}") from None
