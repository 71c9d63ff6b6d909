"""Running one sweep point: compile, replay, and turn the report into one result row.

:func:`run_point` is the task every executor runs (a top-level function of
an importable module, so process pools and Dask workers pickle it by
reference). It never raises for a point's own failure: any exception while
loading, compiling or replaying becomes the row's ``error`` text
(``ExceptionType: message``) with every metric None, so the sweep goes on.

The row's ``program_hash`` is the sha256 of what the executor replays: the
instruction stream (records, multicast groups, section table) and the
container's named arrays (placement, KV map, power schedule), each array
hashed with its name, dtype and shape. Container metadata (target name and
hash, package version) is left out, so two points that compile to the same
program share the hash even when they differ in a cost-only target constant,
and the hash does not depend on how the program file would be laid out.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any, TYPE_CHECKING

import numpy as np

from primal_compiler.sweep.metrics import flatten, select
from primal_compiler.sweep.spec import Point

if TYPE_CHECKING:
    from primal_compiler.isa.stream import Stream


def program_hash(stream: Stream, arrays: dict[str, np.ndarray]) -> str:
    """sha256 (hex) of the stream and the program arrays, independent of metadata and file layout."""
    h = hashlib.sha256()

    def put(name: str, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a)
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.view(np.uint8).reshape(-1).tobytes() if a.size else b"")

    put("stream.records", stream.records)
    put("stream.group_ptr", stream.group_ptr)
    put("stream.group_ct", stream.group_ct)
    put("stream.group_pe", stream.group_pe)
    h.update(repr([(s.name, s.start, s.stop) for s in stream.sections]).encode())
    for name in sorted(arrays):
        put(name, np.asarray(arrays[name]))
    return h.hexdigest()


@lru_cache(maxsize=16)
def _target(ref: str, overrides: tuple[tuple[str, Any], ...]):
    from primal_compiler.target import load_target, with_overrides

    base = load_target(ref)
    return with_overrides(base, dict(overrides)) if overrides else base


@contextmanager
def _cluster_executor():
    """The Dask cluster's executor when running inside a Dask task (the task secedes while it waits)."""
    try:
        from distributed import get_worker, worker_client

        get_worker()
    except (ImportError, ValueError):
        yield None
        return
    with worker_client() as client:
        yield client.get_executor()


def _passes(point: Point, executor):
    """The point's passes; a pass that takes an executor (``ga-placement``) evaluated serially, on ``executor``,
    or as the pipeline says."""
    from primal_compiler.passmgr import parse_pipeline

    passes = []
    for p in parse_pipeline(point.pipeline):
        if hasattr(p, "executor_override") and point.ga_executor != "pipeline":
            # options of the pass the check above found (the base Pass declares none of them)
            changes: dict[str, Any] = ({"executor": "serial", "progress": False} if executor is None
                                       else {"executor_override": executor, "progress": False})
            p = replace(p, **changes)
        passes.append(p)
    return tuple(passes)


def run_point(point: Point) -> dict[str, Any]:
    """Compile and replay ``point``; the result row (see :func:`row`). Never raises for the point's own errors."""
    start = time.perf_counter()
    flat, phash, error, timings = None, None, None, {}
    try:
        from primal_compiler.report import collect
        from primal_compiler import compiled
        from primal_compiler.frontend import load_model
        from primal_compiler.ir.program import Program
        from primal_compiler.passmgr import PassManager

        target = _target(point.target, point.overrides)
        model = load_model(point.model, point.lora)
        ctx = _cluster_executor() if point.ga_executor == "sweep" and "ga-placement" in point.pipeline else nullcontext()
        with ctx as executor:
            program = PassManager(_passes(point, executor)).run(Program(model=model), target)
        timings["compile_s"] = time.perf_counter() - start
        c = compiled.Compiled.of(program, target, point.point_id)
        phash = program_hash(c.stream, c.arrays)
        t = time.perf_counter()
        report = collect.replay_report(c, validate=point.validate)
        timings["replay_s"] = time.perf_counter() - t
        flat = flatten(report)
    except Exception as exc:  # noqa: BLE001 - a point's failure is data, not a crash of the sweep
        error = f"{type(exc).__name__}: {exc}".splitlines()[0][:2000] if str(exc) else type(exc).__name__
    except MemoryError:  # pragma: no cover
        error = "MemoryError"
    return row(point, flat, phash, error, time.perf_counter() - start, timings)


def row(point: Point, flat: dict[str, float] | None, phash: str | None, error: str | None, wall_s: float,
        timings: dict[str, float] | None = None) -> dict[str, Any]:
    """One result row: id, grid, every axis value, the compiled pipeline text, program hash, error, timings, kept metrics."""
    out: dict[str, Any] = {"point_id": point.point_id, "grid": point.grid}
    out.update(dict(point.axes))
    out.update({
        "compiled_pipeline": point.pipeline, "program_hash": phash, "error": error, "wall_s": wall_s,
        "compile_s": (timings or {}).get("compile_s"), "replay_s": (timings or {}).get("replay_s"),
        "worker": f"{socket.gethostname()}:{os.getpid()}",
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
    })
    out.update(select(flat, point.metrics))
    return out
