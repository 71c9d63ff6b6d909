"""Exact placement with OR-Tools CP-SAT, and a star lower bound for large CTs.

CP-SAT model: a boolean per (tile, PE), one PE per tile and at most one tile
per PE; hub coordinates are free integers (several hubs may share a PE); the
objective is the integer-scaled byte-hops with ``|dx| + |dy|`` per flow. It
uses a deterministic-time budget and one worker, so results are reproducible,
and leaves SIGINT to the command (CP-SAT would otherwise catch it, stop early
and let the command finish with what it had: an interrupt ignored and a result
that depends on when it came); the interrupt lands when the solve returns.

The star bound splits the flows into disjoint stars (each tile-hub flow in
its hub's star, each tile-tile flow in its source's star; hub-hub flows can
cost 0). In a star the leaves are distinct tiles on distinct PEs, so by the
rearrangement inequality its cost is at least the heaviest-first weights
times the sorted distances from the centre's best PE. The sum over stars is
a valid lower bound for any placement and either hub policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from primal_compiler.mapping.instance import Instance


@dataclass(frozen=True)
class ExactResult:
    slots: np.ndarray | None
    cost: float
    bound: float
    optimal: bool


def solve_exact(inst: Instance, max_deterministic_time: float = 20.0, scale: float = 1.0,
                hint: np.ndarray | None = None) -> ExactResult:
    """Optimal (or best found) placement of ``inst`` with hubs at free positions.

    The mesh's mirror symmetries are broken on tile 0 (it sits in the top-left
    quadrant, and on or below the diagonal of a square mesh), the star bound
    is added as a cut, and ``hint`` (a known placement) seeds the search.
    """
    from ortools.sat.python import cp_model  # heavy: imported when used, not to parse a command line

    m = cp_model.CpModel()
    T, H, S = inst.num_tiles, inst.num_hubs, inst.num_slots
    cols, rows = inst.cols, inst.rows
    x = [[m.new_bool_var(f"x{t}_{s}") for s in range(S)] for t in range(T)]
    for t in range(T):
        m.add_exactly_one(x[t])
    for s in range(S):
        m.add_at_most_one(x[t][s] for t in range(T))
    X = [m.new_int_var(0, cols - 1, f"X{e}") for e in range(T + H)]
    Y = [m.new_int_var(0, rows - 1, f"Y{e}") for e in range(T + H)]
    for t in range(T):
        m.add(X[t] == sum((s % cols) * x[t][s] for s in range(S)))
        m.add(Y[t] == sum((s // cols) * x[t][s] for s in range(S)))
    terms = []
    weights = np.rint(inst.weight * scale).astype(np.int64)
    for f, (a, b) in enumerate(zip(inst.src.tolist(), inst.dst.tolist())):
        if a == b or weights[f] == 0:
            continue
        dx = m.new_int_var(0, cols - 1, f"dx{f}")
        dy = m.new_int_var(0, rows - 1, f"dy{f}")
        m.add_abs_equality(dx, X[a] - X[b])
        m.add_abs_equality(dy, Y[a] - Y[b])
        terms.append(int(weights[f]) * (dx + dy))
    objective = sum(terms)
    m.add(objective >= int(np.ceil(star_bound(inst).byte_hops * scale - 1e-9)))
    if T:
        m.add(2 * X[0] <= cols - 1)
        m.add(2 * Y[0] <= rows - 1)
        if rows == cols:
            m.add(Y[0] <= X[0])
    if hint is not None:
        for t in range(T):
            for s in range(S):
                m.add_hint(x[t][s], int(hint[t] == s))
    m.minimize(objective)
    solver = cp_model.CpSolver()
    solver.parameters.max_deterministic_time = max_deterministic_time
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.catch_sigint_signal = False  # CP-SAT's own handler would end the search and swallow a Ctrl-C
    status = solver.Solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return ExactResult(None, float("inf"), solver.BestObjectiveBound() / scale, False)
    slots = np.array([next(s for s in range(S) if solver.Value(x[t][s])) for t in range(T)], dtype=np.int32)
    return ExactResult(slots, solver.ObjectiveValue() / scale, solver.BestObjectiveBound() / scale,
                       status == cp_model.OPTIMAL)


def _sorted_distances(rows: int, cols: int) -> np.ndarray:
    """(S, S): for each PE, the distances to all PEs in ascending order."""
    r, c = np.divmod(np.arange(rows * cols), cols)
    d = np.abs(r[:, None] - r[None, :]) + np.abs(c[:, None] - c[None, :])
    return np.sort(d, axis=1).astype(np.float64)


@dataclass(frozen=True)
class StarBound:
    byte_hops: float  # lower bound on sum of bytes x hops
    hops: float  # lower bound on the sum of hops over transfers
    max_hops: int  # lower bound on the largest hop count


def star_bound(inst: Instance) -> StarBound:
    """Lower bounds for any placement of ``inst`` (see module docstring)."""
    T = inst.num_tiles
    src, dst, w = inst.src.astype(np.int64), inst.dst.astype(np.int64), inst.weight
    tile_hub = (src < T) != (dst < T)
    tile_tile = (src < T) & (dst < T) & (src != dst)
    centre = np.concatenate([np.where(src[tile_hub] >= T, src[tile_hub], dst[tile_hub]), src[tile_tile]])
    leaf = np.concatenate([np.where(src[tile_hub] >= T, dst[tile_hub], src[tile_hub]), dst[tile_tile]])
    weight = np.concatenate([w[tile_hub], w[tile_tile]])
    if len(centre) == 0:
        return StarBound(0.0, 0.0, 0)
    D = _sorted_distances(inst.rows, inst.cols)
    order = np.lexsort((leaf, centre))
    centre, leaf, weight = centre[order], leaf[order], weight[order]
    _, first = np.unique(centre * (T + 1) + leaf, return_index=True)
    leaf_w = np.add.reduceat(weight, first)
    leaf_n = np.diff(np.append(first, len(centre))).astype(np.float64)
    star = centre[first]
    byte_hops = hops = 0.0
    max_hops = 0
    for c in np.unique(star):
        offset = 1 if c < T else 0  # a tile centre's leaves cannot share its PE
        ws = np.sort(leaf_w[star == c])[::-1]
        ns = np.sort(leaf_n[star == c])[::-1]
        n = min(len(ws), D.shape[1] - offset)
        Dc = D[:, offset : offset + n]
        byte_hops += float((Dc @ ws[:n]).min())
        hops += float((Dc @ ns[:n]).min())
        max_hops = max(max_hops, int(Dc[:, n - 1].min()))
    return StarBound(byte_hops, hops, max_hops)
