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
