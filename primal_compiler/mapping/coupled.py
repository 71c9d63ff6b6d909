"""A lower bound that couples a matrix's row broadcasts with its column reductions.

The star bound (``exact.star_bound``) lets every hub's leaves sit in a compact
diamond around it at once. In a weight matrix every tile is a leaf of two
hubs: the broadcast hub ``a`` of its block row (family A) and the reduction
root ``b`` of its output column (family B), and rows and columns cannot both
be compact. This bound says by how much, for every **block**: a connected set
of tiles, each joined to the block by its heaviest flow from a hub (its A
flow, weight ``wa``, the same for the block) and its heaviest flow to a hub
(its B flow, weight ``wb``); a hub may broadcast in one block and be a
reduction root in another. A tile's other flows (a LoRA adapter's, a second
flow to its root) are not in the block.

Let ``X`` and ``Y`` be the block's A and B hop sums (each hub at its best PE)
and ``g(n)`` the least sum of distances from one PE to ``n`` distinct PEs.
Then ``X >= G_A`` and ``Y >= G_B`` (the star bounds, unit weights), and, when
every column ``b`` meets every row ``a`` the same number of times ``m_b``
(each row the same for a column, so ``sum_t d(b, a(t)) = m_b sum_a d(b, a)``):

- ``Y >= S_B M - X``, with ``M = min_p sum_a d(p, a)`` over the A hubs'
  PEs and ``S_B`` the sum of the ``m_b``. Triangle inequality on every B
  flow: ``d(b, t) >= d(b, a(t)) - d(a(t), t)``; summed over the block's
  tiles, the first terms are ``sum_b m_b sum_a d(b, a) >= S_B M`` and the
  second are ``X``.
- ``X >= g(T) - k M``, with ``T`` the block's tiles and ``k`` its largest
  row: from the PE ``p*`` attaining ``M``, ``g(T) <= sum_t d(p*, t) <=
  sum_t (d(p*, a(t)) + d(a(t), t)) <= k M + X``.

and the same with A and B exchanged when every row meets every column
equally. So the block costs at least the least ``wa X + wb Y`` over ``X``,
``Y``, ``M``, ``M' >= 0`` under these inequalities, a linear program of four
variables (GLOP). With rows compact, ``M`` is large and the columns pay;
with rows spread, ``X`` pays. Every inequality holds for any placement and
either hub policy, and each flow is in at most one block, so the sum over
blocks plus the star bound of every hub in no block is a lower bound (taken
when it is above the star bound): a block hub's flows outside its blocks
are left out, which only lowers the sum. ``tests/mapping/test_coupled.py`` checks it against
CP-SAT optima and random placements.
"""

from __future__ import annotations

import numpy as np

from primal_compiler.mapping.exact import _sorted_distances, star_bound
from primal_compiler.mapping.instance import Instance

SLACK = 1e-9
"""Relative amount taken off each linear program's optimum, so solver rounding cannot lift it over the truth."""


def coupled_bound(inst: Instance) -> float:
    """Lower bound on the byte-hops of any placement of ``inst``: the star bound with the stars of every block's
    hubs replaced by the blocks' coupled bounds (module docstring); never below the star bound."""
    total = star_bound(inst).byte_hops
    blocks, hubs = _blocks(inst)
    if not blocks:
        return total
    dist = _distances(inst.rows, inst.cols)
    coupled = sum(_block_bound(dist, a, b, wa, wb) for a, b, wa, wb in blocks) * (1 - SLACK)
    return max(total, total - star_bound(_flows_of(inst, hubs)).byte_hops + coupled)


def _flows_of(inst: Instance, hubs: np.ndarray) -> Instance:
    """``inst`` with only the flows between a tile and one of ``hubs``: the star bound's terms of those hubs."""
    T = inst.num_tiles
    hub = np.where(inst.src >= T, inst.src, inst.dst)
    sel = ((inst.src < T) != (inst.dst < T)) & np.isin(hub, hubs)
    return Instance(inst.rows, inst.cols, T, inst.num_hubs, inst.src[sel], inst.dst[sel], inst.weight[sel],
                    inst.flow_class[sel])


def _distances(rows: int, cols: int) -> np.ndarray:
    """Per PE, the cumulative sums of its sorted distances to all PEs: ``[p, n - 1]`` = the least hops to n PEs."""
    return np.cumsum(_sorted_distances(rows, cols), axis=1)


def _g(dist: np.ndarray, n: int) -> float:
    return float(dist[:, n - 1].min()) if n else 0.0


def _star_sum(dist: np.ndarray, hub: np.ndarray) -> float:
    """Unit-weight star bound of the hubs whose leaves are tiles labelled ``hub`` (one entry per tile)."""
    return sum(_g(dist, int(n)) for n in np.bincount(hub) if n)


def _blocks(inst: Instance) -> tuple[list[tuple[np.ndarray, np.ndarray, float, float]], np.ndarray]:
    """(every coupled block as (A hub of each tile, B hub of each tile, wa, wb), hubs renumbered from 0 per
    block; the hubs of those blocks). A hub may be a B hub of one block and an A hub of another (a reduction
    root that broadcasts on); each of its flows is in at most one block. The linear program takes one weight
    per family, so a block of mixed weights is not coupled, and neither is any block linked to it through
    shared hubs: those hubs keep their whole stars, which cover their flows in every block."""
    T = inst.num_tiles
    src, dst, w = inst.src.astype(np.int64), inst.dst.astype(np.int64), inst.weight
    n = T + inst.num_hubs
    into = (src >= T) & (dst < T)
    out = (src < T) & (dst >= T)
    a, wa = _heaviest(dst[into], src[into], w[into], T)
    b, wb = _heaviest(src[out], dst[out], w[out], T)
    tiles = np.flatnonzero((a >= 0) & (b >= 0) & (a != b))
    label = _components(a[tiles], n + b[tiles], 2 * n)  # a hub's A role and B role are distinct nodes
    linked = _components(a[tiles], b[tiles], n)  # blocks joined by a hub that serves in both
    mixed = [lab for lab in np.unique(label) if np.ptp(wa[tiles[label == lab]]) or np.ptp(wb[tiles[label == lab]])]
    skipped = np.isin(linked, linked[np.isin(label, mixed)])
    blocks, hubs = [], []
    for lab in np.unique(label[~skipped]):
        t = tiles[label == lab]
        blocks.append((np.unique(a[t], return_inverse=True)[1], np.unique(b[t], return_inverse=True)[1],
                       float(wa[t[0]]), float(wb[t[0]])))
        hubs.append(np.concatenate([a[t], b[t]]))
    return blocks, np.unique(np.concatenate(hubs)) if hubs else np.zeros(0, np.int64)


def _heaviest(tile: np.ndarray, hub: np.ndarray, weight: np.ndarray, T: int) -> tuple[np.ndarray, np.ndarray]:
    """Per tile, the hub of its heaviest flow among ``(tile, hub, weight)`` (ties: the lower hub) and that
    flow's weight; -1 and 0 for a tile with none."""
    order = np.lexsort((hub, -weight, tile))
    tile, hub, weight = tile[order], hub[order], weight[order]
    first = np.flatnonzero(np.concatenate([[True], tile[1:] != tile[:-1]])) if len(tile) else np.zeros(0, np.int64)
    h, wt = np.full(T, -1), np.zeros(T)
    h[tile[first]], wt[tile[first]] = hub[first], weight[first]
    return h, wt


def _components(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    """Component label of each (a, b) edge in the graph on ``n`` hub nodes (union-find, path halving)."""
    parent = np.arange(n)

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = int(parent[x])
        return x

    for x, y in zip(a.tolist(), b.tolist()):
        rx, ry = find(x), find(y)
        if rx != ry:
            parent[max(rx, ry)] = min(rx, ry)
    return np.array([find(x) for x in a.tolist()], dtype=np.int64)


def _even(count: np.ndarray) -> tuple[bool, bool]:
    """(every column meets every row equally, every row meets every column equally) of a rows x cols count."""
    return bool((count == count[:1, :]).all() and count.all()), bool((count == count[:, :1]).all() and count.all())


def _block_bound(dist: np.ndarray, a: np.ndarray, b: np.ndarray, wa: float, wb: float) -> float:
    """The block's linear program (module docstring); its star bounds when neither family meets the other evenly."""
    from ortools.linear_solver import pywraplp  # heavy: imported when used, not to parse a command line

    count = np.zeros((a.max() + 1, b.max() + 1), dtype=np.int64)
    np.add.at(count, (a, b), 1)
    cols_even, rows_even = _even(count)
    G_a, G_b, g = _star_sum(dist, a), _star_sum(dist, b), _g(dist, len(a))
    if not (cols_even or rows_even):
        return wa * G_a + wb * G_b
    s = pywraplp.Solver.CreateSolver("GLOP")
    X, Y = s.NumVar(G_a, s.infinity(), "X"), s.NumVar(G_b, s.infinity(), "Y")
    if cols_even:  # columns reach every row: M over the A hubs
        M = s.NumVar(0, s.infinity(), "M")
        s.Add(X + Y >= float(count[0].sum()) * M)
        s.Add(X + float(count.sum(axis=1).max()) * M >= g)
    if rows_even:  # rows reach every column: M' over the B hubs
        Mb = s.NumVar(0, s.infinity(), "Mb")
        s.Add(X + Y >= float(count[:, 0].sum()) * Mb)
        s.Add(Y + float(count.sum(axis=0).max()) * Mb >= g)
    s.Minimize(wa * X + wb * Y)
    if s.Solve() != pywraplp.Solver.OPTIMAL:
        return wa * G_a + wb * G_b
    return float(s.Objective().Value())
