"""Small random placement instances for solver tests."""

from __future__ import annotations

import numpy as np
from ortools.graph.python import linear_sum_assignment

from primal_compiler.mapping.instance import Instance


def random_instance(seed: int, rows: int, cols: int, tiles: int, hubs: int) -> Instance:
    """Every tile exchanges data with one or two random hubs; integer byte counts 1..16."""
    rng = np.random.default_rng(seed)
    src, dst, w = [], [], []
    for t in range(tiles):
        for h in rng.choice(hubs, size=int(rng.integers(1, 3)), replace=False):
            a, b = (t, tiles + int(h)) if rng.random() < 0.5 else (tiles + int(h), t)
            src.append(a), dst.append(b), w.append(float(rng.integers(1, 17)))
    return Instance(rows, cols, tiles, hubs, np.array(src, np.int32), np.array(dst, np.int32),
                    np.array(w), np.zeros(len(w), np.int8))


def ortools_optimum(C: np.ndarray) -> int:
    """Optimal cost of assigning C's rows (tiles) to distinct columns (PEs) by OR-Tools' cost-scaling solver,
    rows padded with zero-cost dummies to a square: an implementation independent of :mod:`.lap`'s."""
    S = C.shape[1]
    square = np.zeros((S, S), np.int64)
    square[: len(C)] = C
    lap = linear_sum_assignment.SimpleLinearSumAssignment()
    lap.add_arcs_with_cost(np.repeat(np.arange(S), S), np.tile(np.arange(S), S), square.ravel())
    if lap.solve() != lap.OPTIMAL:
        raise RuntimeError("OR-Tools found no assignment")
    return int(lap.optimal_cost())


def matrix(rows: int, cols: int, mesh: tuple[int, int], wa: float = 256.0, wb: float = 512.0,
           then: int = 0) -> Instance:
    """A rows x cols matrix of tiles: hub r broadcasts to tile row r, column c reduces to its own hub. With
    ``then`` > 0 a second matrix (cols x ``then``) follows, whose row k is broadcast by the first's column
    root k (a hub of both kinds, in two blocks)."""
    flows = []  # (source, destination, weight) with hubs named ("a", k), ("b", k), ("c", k)
    tile = 0
    for first, (nr, nc, row_hub, col_hub) in enumerate([(rows, cols, "a", "b"), (cols, then, "b", "c")]):
        for r in range(nr):
            for c in range(nc):
                flows += [((row_hub, r), tile, wa), (tile, (col_hub, c), wb)]
                tile += 1
    names = sorted({x for f in flows for x in f[:2] if isinstance(x, tuple)})
    index = {h: tile + k for k, h in enumerate(names)}
    src = np.array([index.get(f[0], f[0]) for f in flows], np.int32)
    dst = np.array([index.get(f[1], f[1]) for f in flows], np.int32)
    w = np.array([f[2] for f in flows], np.float64)
    return Instance(mesh[0], mesh[1], tile, len(names), src, dst, w, np.zeros(len(w), np.int8))


def exact_cost(inst: Instance, slot: np.ndarray) -> float:
    """Byte-hops with the tiles at PEs ``slot`` and every hub at its best PE (hubs are independent here)."""
    T, cols = inst.num_tiles, inst.cols
    pe = np.arange(inst.rows * cols)
    r, c = np.divmod(pe, cols)
    total = 0.0
    for h in range(T, T + inst.num_hubs):
        sel = (inst.src == h) | (inst.dst == h)
        leaf = np.where(inst.src[sel] == h, inst.dst[sel], inst.src[sel])
        lr, lc = np.divmod(slot[leaf], cols)
        d = np.abs(r[:, None] - lr[None, :]) + np.abs(c[:, None] - lc[None, :])
        total += float((d @ inst.weight[sel]).min())
    return total
