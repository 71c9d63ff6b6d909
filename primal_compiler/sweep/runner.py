"""Running a sweep: skip finished points, submit the rest to an executor, append rows as they finish.

Guarantees:

- **Resumable.** Before submitting, the point ids already in ``RESULTS/`` are
  skipped (a damaged part is moved aside with a one-line warning on stderr
  and its points run again, see :mod:`~primal_compiler.sweep.store`);
  finished points are appended as one Parquet part at most
  ``flush_s`` (1 s) after they finish, and at once on an interrupt or error,
  so a sweep killed at any instant (SIGKILL, power loss) loses only the
  points running and those finished in the last ``flush_s``; a rerun
  computes exactly the points not yet written, and no point is ever written
  twice.
- **Failures are rows.** A point that raises (inside :func:`run_point`) or
  whose task fails (a worker died, a Dask ``KilledWorker``) is written with
  its ``error`` and the sweep goes on. A local worker process that dies
  (out of memory, a crash in native code) breaks the whole pool: the pool is
  rebuilt and the points it held are rerun one at a time, so exactly the
  point that kills a worker on its own is recorded (``WorkerDied: ...``) and
  no innocent neighbour is.
- **Bounded.** At most ``2 x slots`` points are in flight, so a sweep of
  10^5 points does not submit 10^5 tasks up front.
- **Executor-agnostic.** Any ``concurrent.futures.Executor`` works; the rows
  do not depend on it (only ``wall_s``, ``compile_s``, ``replay_s``,
  ``worker``, ``finished_at`` and ``run_id`` differ between runs).
"""

from __future__ import annotations

import sys
import time
import uuid
from contextlib import suppress
from concurrent.futures import FIRST_COMPLETED, BrokenExecutor, Executor, Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from primal_compiler.sweep.metrics import columns
from primal_compiler.sweep.point import row, run_point
from primal_compiler.sweep.spec import Point, SweepSpec
from primal_compiler.sweep.store import ResultStore, column_kind


@dataclass(frozen=True)
class SweepResult:
    """What one call of :func:`run_sweep` did."""

    out: Path
    total: int  # points in the spec
    skipped: int  # already in RESULTS before this run
    ran: int  # finished (and written) by this run
    failed: int  # of ``ran``, rows with an error
    seconds: float
    run_id: str

    @property
    def complete(self) -> bool:
        return self.skipped + self.ran == self.total


def column_types(spec: SweepSpec, points: list[Point]) -> dict[str, str]:
    """Parquet type of every axis and metric column, from the whole spec (so every part agrees)."""
    types = {name: column_kind([dict(p.axes).get(name) for p in points]) for name in spec.axis_names}
    types.update({c: "float" for c in columns(spec.metrics)})
    return types


class _Progress:
    """Points done, failures and ETA on stderr (tqdm; a plain line every ~10 s when not a terminal)."""

    def __init__(self, total: int, skipped: int, description: str, enabled: bool) -> None:
        self.bar = None
        self.failed = 0
        if not enabled:
            return
        from tqdm import tqdm

        tty = sys.stderr.isatty()
        self.bar = tqdm(total=total, desc=f"sweep ({skipped} done before)" if skipped else "sweep", unit="pt",
                        file=sys.stderr, mininterval=0.2 if tty else 10.0, dynamic_ncols=True, smoothing=0.1,
                        postfix={"failed": 0})
        self.bar.write(f"sweep: {total} points to run on {description}", file=sys.stderr)

    def update(self, n: int, failed: int) -> None:
        self.failed += failed
        if self.bar is not None:
            self.bar.set_postfix(failed=self.failed, refresh=False)
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_sweep(spec: SweepSpec, out: str | Path, executor: Executor | None = None, *, slots: int | None = None,
              workers: int | None = None, progress: bool = True, description: str | None = None,
              task: Callable[[Point], dict[str, Any]] = run_point, rebuild: Callable[[], Executor] | None = None,
              limit: int | None = None, flush_s: float = 1.0) -> SweepResult:
    """Run every point of ``spec`` not yet in ``out`` on ``executor`` (a local process pool if None).

    ``slots`` is how many points the executor runs at once (default: ``workers``
    or the CPU count); ``limit`` stops after that many new points (for tests
    and benchmarks). ``task`` is the function applied to each point. Finished rows
    are written at least every ``flush_s`` seconds (0: as each point finishes).
    """
    from primal_compiler.sweep.backends import local_pool

    start = time.perf_counter()
    store = ResultStore(out)
    points = spec.points()
    types = column_types(spec, points)
    for warning in store.open({"spec": spec.source, "metrics": list(spec.metrics), "axes": list(spec.axis_names)},
                              types):
        print(f"primal: warning: {warning}", file=sys.stderr)
    done = store.done()
    todo = [p for p in points if p.point_id not in done]
    if limit is not None:
        todo = todo[:limit]
    run_id = uuid.uuid4().hex[:12]
    own: Executor | None = None  # a pool this call made, and so shuts down
    if executor is None:
        import os

        n = workers or os.cpu_count() or 1
        own = executor = local_pool(n)
        slots, rebuild = slots or n, rebuild or (lambda: local_pool(n))
        description = description or f"local process pool, {n} worker{'s' * (n != 1)}"
    slots = max(1, slots or workers or 1)
    bar = _Progress(len(todo), len(points) - len(todo) if limit is None else len(done), description or "executor",
                    progress and bool(todo))
    ran = failed = 0
    queue = list(reversed(todo))
    suspects: list[Point] = []  # in flight when a worker process died: rerun one at a time to find the culprit
    inflight: dict[Future, Point] = {}
    buffer: list[dict[str, Any]] = []
    last_flush = time.monotonic()

    def flush() -> None:
        nonlocal ran, failed, last_flush
        if buffer:
            extra = {k: "float" for r in buffer for k in r if k not in types}  # metric leaves found by a glob
            store.append(buffer, types | extra)
            nfail = sum(r["error"] is not None for r in buffer)
            ran, failed = ran + len(buffer), failed + nfail
            bar.update(len(buffer), nfail)
            buffer.clear()
        last_flush = time.monotonic()

    try:
        while queue or inflight or suspects:
            if suspects:
                if not inflight:
                    p = suspects.pop()
                    inflight[executor.submit(task, p)] = p
            else:
                while queue and len(inflight) < 2 * slots:
                    p = queue.pop()
                    inflight[executor.submit(task, p)] = p
            timeout = max(0.0, flush_s - (time.monotonic() - last_flush)) if buffer else None
            finished, _ = wait(list(inflight), timeout=timeout, return_when=FIRST_COMPLETED)
            broken = False
            for f in finished:
                p = inflight.pop(f)
                exc = f.exception()
                if exc is None:
                    r = f.result()
                elif isinstance(exc, BrokenExecutor) and rebuild is not None:
                    broken = True
                    if len(finished) + len(inflight) > 1:  # not alone: any of them may have killed the worker
                        suspects.append(p)
                        continue
                    r = row(p, None, None, "WorkerDied: the worker process running this point died "
                                           f"({type(exc).__name__}; out of memory?)", float("nan"))
                else:
                    text = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
                    r = row(p, None, None, text, float("nan"))
                buffer.append(r | {"run_id": run_id})
            if time.monotonic() - last_flush >= flush_s or not (queue or inflight or suspects):
                flush()
            if broken and rebuild is not None:  # (broken is only ever set where rebuild is not None)
                for f, p in list(inflight.items()):  # the pool is gone: what it still held is suspect
                    f.cancel()
                    suspects.append(p)
                inflight.clear()
                if own is not None:
                    own.shutdown(wait=False, cancel_futures=True)
                own = executor = rebuild()
    except BaseException:
        for f in inflight:
            f.cancel()
        if own is not None:
            own.shutdown(wait=False, cancel_futures=True)
            own = None
        with suppress(Exception):
            flush()  # rows already finished are kept, also on an interrupt
        raise
    finally:
        bar.close()
        if own is not None:
            own.shutdown(wait=True)
    result = SweepResult(Path(out), len(points), len(points) - len(todo) if limit is None else len(done), ran, failed,
                         time.perf_counter() - start, run_id)
    if result.complete and len(store.parts()) > 1:
        store.compact()
    return result
