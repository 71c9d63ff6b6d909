"""Reachability in a stream's dependency graph: ancestors, producers the graph misses, dead records.

The graph is the CSR list of :func:`primal_compiler.executor.deps.predecessors`: the predecessors of
record ``i`` are ``pred[ptr[i]:ptr[i+1]]``, each ``< i``. Record ``a`` is an *ancestor* of ``b`` when a
path of predecessor edges leads from ``b`` back to ``a``; every record is its own ancestor. Since every
edge points to an earlier record, one sweep in descending record order settles reachability.

* :func:`ancestors`: the records from which some root is reachable.
* :func:`missing_producers`: the (consumer, producer) pairs, e.g. the value flow a functional replay
  logged, whose producer is not a strict ancestor of its consumer: dependencies the graph drops.
* :func:`dead_records`: the prefill records of a request that no ARGMAX of that request (prefill or
  decode) depends on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.isa.opcodes import Opcode, step_ends
from primal_compiler.jit import njit

if TYPE_CHECKING:
    from primal_compiler.isa.stream import Stream

INERT = (Opcode.PG_ON, Opcode.PG_OFF, Opcode.SYNC)
"""Records that compute, move and keep no value, so nothing can depend on their data: never dead."""


@njit(nogil=True)
def _sweep(ptr, pred, mark, top):  # pragma: no cover - compiled
    for i in range(top, -1, -1):
        if mark[i]:
            for q in range(ptr[i], ptr[i + 1]):
                mark[pred[q]] = True


@njit(nogil=True)
def _unreached(ptr, pred, cons, first, prod):  # pragma: no cover - compiled
    """Per pair (sorted by consumer; cons[k]'s producers are prod[first[k]:first[k+1]]): not an ancestor.

    Consumers go 64 at a time, one bit each: reach[i] bit k says cons[b0 + k] is reachable from i. A batch
    sweeps from its last consumer down to its smallest producer.
    """
    missing = np.zeros(len(prod), dtype=np.bool_)
    reach = np.zeros(len(ptr) - 1, dtype=np.uint64)
    one = np.uint64(1)
    for b0 in range(0, len(cons), 64):
        b1 = min(b0 + 64, len(cons))
        hi = cons[b1 - 1]
        lo = cons[b0]
        for k in range(b0, b1):
            reach[cons[k]] |= one << np.uint64(k - b0)
            for j in range(first[k], first[k + 1]):
                lo = min(lo, prod[j])
        for i in range(hi, lo - 1, -1):
            bits = reach[i]
            if bits != 0:
                for q in range(ptr[i], ptr[i + 1]):
                    p = pred[q]
                    if p >= lo:
                        reach[p] |= bits
        for k in range(b0, b1):
            bit = one << np.uint64(k - b0)
            for j in range(first[k], first[k + 1]):
                p = prod[j]
                missing[j] = p >= cons[k] or (reach[p] & bit) == 0
        reach[lo : hi + 1] = 0
    return missing


def _graph(ptr: np.ndarray, pred: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.ascontiguousarray(ptr, dtype=np.int64), np.ascontiguousarray(pred, dtype=np.int64)


def ancestors(ptr: np.ndarray, pred: np.ndarray, roots: np.ndarray) -> np.ndarray:
    """bool per record: some record of ``roots`` (indices) is reachable from it; roots included."""
    ptr, pred = _graph(ptr, pred)
    roots = np.asarray(roots, dtype=np.int64)
    mark = np.zeros(len(ptr) - 1, dtype=np.bool_)
    if len(roots):
        mark[roots] = True
        _sweep(ptr, pred, mark, int(roots.max()))
    return mark


def missing_producers(ptr: np.ndarray, pred: np.ndarray, consumer: np.ndarray, producer: np.ndarray) -> np.ndarray:
    """Indices (ascending) of the pairs whose ``producer[j]`` is not a strict ancestor of ``consumer[j]``.

    A producer at or after its consumer is always reported. Cost: one sweep per 64 distinct consumers,
    over the records between the batch's smallest producer and its last consumer. Record indices outside
    the graph are a ValueError.
    """
    ptr, pred = _graph(ptr, pred)
    consumer, producer = np.asarray(consumer, dtype=np.int64), np.asarray(producer, dtype=np.int64)
    n = len(ptr) - 1
    if consumer.shape != producer.shape or consumer.ndim != 1:
        raise ValueError(f"consumer {consumer.shape} and producer {producer.shape} must be 1-d and alike")
    if len(consumer) and (min(consumer.min(), producer.min()) < 0 or max(consumer.max(), producer.max()) >= n):
        raise ValueError(f"record indices must be in 0..{n - 1}")
    order = np.argsort(consumer, kind="stable")
    cons, first = np.unique(consumer[order], return_index=True)
    missing = _unreached(ptr, pred, cons, np.append(first, len(order)).astype(np.int64), producer[order])
    return np.sort(order[missing])


def argmax_records(stream: Stream) -> np.ndarray:
    """bool per record: a controller ARGMAX (the end of a prefill or decode step)."""
    return step_ends(stream.records)


def dead_records(stream: Stream, ptr: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """Prefill records (ascending) that are not ancestors of any ARGMAX of their request.

    A request ``R`` is the sections named ``*:R`` (``adapter:R``, ``prefill:R``, ``decode:R``); its ARGMAXes
    are the prefill's and every decode step's, so a prefill KV_APPEND that only later decode steps read is
    live, as is a CONFIG or MASK whose SRAM slot or mask bit a SMAC_SRAM of the request reads. Records of
    :data:`INERT` (power gating, SYNC) are never dead: they carry no value.
    """
    sink = argmax_records(stream)
    inert = np.isin(stream.records["op"], INERT)
    requests: dict[str, list] = {}
    for s in stream.sections:
        requests.setdefault(s.name.partition(":")[2], []).append(s)
    dead = [np.zeros(0, dtype=np.int64)]
    for sections in requests.values():
        prefill = [np.arange(s.start, s.stop) for s in sections if s.name.startswith("prefill:")]
        if not prefill:
            continue
        roots = np.concatenate([np.flatnonzero(sink[s.start : s.stop]) + s.start for s in sections])
        live = ancestors(ptr, pred, roots)
        for idx in prefill:
            dead.append(idx[~live[idx] & ~inert[idx]])
    return np.sort(np.concatenate(dead))
