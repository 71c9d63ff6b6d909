"""A placement instance: tiles to put on a mesh, hubs, and the flows between them.

Endpoints ``0..T-1`` are tiles (one PE each, exclusive); ``T..T+H-1`` are hubs:
router-scratchpad intermediates (reduction roots, broadcast sources, attention
holders) that any PE may host, several per PE. Given tile positions, hubs go
either to the CT port PE (0, 0) (policy ``port``, the naive layout) or to the
bytes-weighted median of the tiles they exchange data with (policy
``median``), the exact minimiser of their star cost. Hubs joined by
``row_ties`` share one mesh row: their common row is the weighted median of
all their tiles' rows, the exact minimiser of those stars' vertical cost
under the tie (columns stay free). Cost is bytes x XY hops
summed over flows; every function here is vectorized over a population of
placements ``slots[P, T]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

HUB_POLICIES = ("median", "port")


@dataclass(frozen=True, eq=False)
class Instance:
    """One CT's placement problem; arrays are read-only by convention."""

    rows: int
    cols: int
    num_tiles: int
    num_hubs: int
    src: np.ndarray  # int32 endpoint of each flow
    dst: np.ndarray  # int32
    weight: np.ndarray  # float64 bytes per flow
    flow_class: np.ndarray  # int8, see traffic.FlowClass
    hub_names: tuple[str, ...] = ()
    row_ties: tuple[tuple[int, int], ...] = ()  # hub pairs (0..H-1) that must sit in one mesh row
    hub_plan: list = field(default_factory=list, init=False, repr=False, compare=False)  # derived: _hub_plan
    tie_plan: tuple = field(default=(), init=False, repr=False, compare=False)  # derived: _tie_plan
    relay_plan: list = field(default_factory=list, init=False, repr=False, compare=False)  # derived: _relay_plan

    def __post_init__(self) -> None:
        if self.num_tiles > self.rows * self.cols:
            raise ValueError(f"{self.num_tiles} tiles do not fit a {self.rows}x{self.cols} mesh")
        n = self.num_tiles + self.num_hubs
        for a in (self.src, self.dst):
            if len(a) and (a.min() < 0 or a.max() >= n):
                raise ValueError("flow endpoint out of range")
        if any(not (0 <= a < self.num_hubs and 0 <= b < self.num_hubs) for a, b in self.row_ties):
            raise ValueError("row tie of a hub out of range")
        object.__setattr__(self, "hub_plan", _hub_plan(self))
        object.__setattr__(self, "tie_plan", _tie_plan(self))
        object.__setattr__(self, "relay_plan", _relay_plan(self))

    @property
    def num_slots(self) -> int:
        return self.rows * self.cols


def _hub_tile_flows(inst: Instance) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hub, tile, bytes) of every flow between a hub and a tile, sorted by hub then tile."""
    T = inst.num_tiles
    hub_side = np.concatenate([inst.src, inst.dst])
    other = np.concatenate([inst.dst, inst.src])
    ww = np.concatenate([inst.weight, inst.weight])
    keep = (hub_side >= T) & (other < T)
    hub_side, other, ww = hub_side[keep] - T, other[keep], ww[keep]
    order = np.lexsort((other, hub_side))
    return hub_side[order], other[order], ww[order]


def _tie_plan(inst: Instance) -> tuple:
    """(tied hubs, component of each, padded tiles (K, D), weights (K, D)) of the row ties' components."""
    if not inst.row_ties:
        return ()
    parent = list(range(inst.num_hubs))

    def root(h: int) -> int:
        while parent[h] != h:
            parent[h] = parent[parent[h]]
            h = parent[h]
        return h

    for a, b in inst.row_ties:
        parent[max(root(a), root(b))] = min(root(a), root(b))
    tied = np.array(sorted({h for pair in inst.row_ties for h in pair}), dtype=np.int64)
    roots = np.array([root(int(h)) for h in tied])
    comps, comp = np.unique(roots, return_inverse=True)
    hub, tile, w = _hub_tile_flows(inst)
    if not np.isin(tied, hub).all():
        raise ValueError(f"row-tied hub {int(tied[~np.isin(tied, hub)][0])} exchanges data with no tile")
    members = [np.isin(hub, tied[comp == k]) for k in range(len(comps))]
    D = max(int(m.sum()) for m in members)
    nb = np.zeros((len(comps), D), dtype=np.int64)
    wt = np.zeros((len(comps), D))
    for k, m in enumerate(members):
        nb[k, : m.sum()], wt[k, : m.sum()] = tile[m], w[m]
    return tied, comp, nb, wt


def _hub_plan(inst: Instance) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Padded neighbour lists of hubs, bucketed by degree: (hub ids, nbr tiles, weights)."""
    H = inst.num_hubs
    hub_side, other, ww = _hub_tile_flows(inst)
    deg = np.bincount(hub_side, minlength=H)
    starts = np.concatenate([[0], np.cumsum(deg)])
    plan = []
    hubs_sorted = np.argsort(deg, kind="stable")
    hubs_sorted = hubs_sorted[deg[hubs_sorted] > 0]
    i = 0
    while i < len(hubs_sorted):
        d = deg[hubs_sorted[i]]
        j = i
        while j < len(hubs_sorted) and deg[hubs_sorted[j]] <= 2 * d:
            j += 1
        ids = hubs_sorted[i:j]
        D = deg[ids].max()
        nb = np.zeros((len(ids), D), dtype=np.int64)
        wt = np.zeros((len(ids), D))
        for r, h in enumerate(ids):
            s, e = starts[h], starts[h + 1]
            nb[r, : e - s] = other[s:e]
            wt[r, : e - s] = ww[s:e]
        plan.append((ids, nb, wt))
        i = j
    return plan


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Lower weighted median along the last axis of ``values`` (P, K, D) with weights (K, D)."""
    order = np.argsort(values, axis=-1, kind="stable")
    v = np.take_along_axis(values, order, axis=-1)
    w = np.broadcast_to(weights, values.shape)
    cw = np.cumsum(np.take_along_axis(w, order, axis=-1), axis=-1)
    idx = np.argmax(cw * 2 >= cw[..., -1:], axis=-1)
    return np.take_along_axis(v, idx[..., None], axis=-1)[..., 0]


def hub_xy(inst: Instance, tx: np.ndarray, ty: np.ndarray, policy: str = "median") -> tuple[np.ndarray, np.ndarray]:
    """Hub coordinates (P, H) for tile coordinates (P, T)."""
    P = tx.shape[0]
    hx = np.zeros((P, inst.num_hubs), dtype=np.int64)
    hy = np.zeros((P, inst.num_hubs), dtype=np.int64)
    if policy == "port":
        return hx, hy
    if policy != "median":
        raise ValueError(f"unknown hub policy {policy!r}; choose from {HUB_POLICIES}")
    for ids, nb, wt in inst.hub_plan:
        hx[:, ids] = _weighted_median(tx[:, nb], wt)
        hy[:, ids] = _weighted_median(ty[:, nb], wt)
    if inst.tie_plan:
        tied, comp, nb, wt = inst.tie_plan
        hy[:, tied] = _weighted_median(ty[:, nb], wt)[:, comp]
    for ids, nb, wt in inst.relay_plan:
        hx[:, ids] = _weighted_median(hx[:, nb], wt)
        hy[:, ids] = _weighted_median(hy[:, nb], wt)
    return hx, hy


def _relay_plan(inst: Instance) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Hubs that exchange data with hubs only (relays) go, in index order, to the weighted median of their
    neighbours placed before them: hubs with tile flows and relays of lower index (a relay with none stays at
    PE 0). Levels of relays whose neighbours are all placed by earlier levels, as padded (ids, neighbour hubs,
    weights); a padded entry repeats a real neighbour with weight 0, which changes no median."""
    T, H = inst.num_tiles, inst.num_hubs
    hub_side, _, _ = _hub_tile_flows(inst)
    relay = np.ones(H, dtype=bool)
    relay[hub_side] = False
    src, dst = inst.src.astype(np.int64) - T, inst.dst.astype(np.int64) - T
    depth = np.full(H, -1)
    rows: list[tuple[int, np.ndarray, np.ndarray]] = []
    for h in np.flatnonzero(relay):
        nbrs = np.concatenate([dst[src == h], src[dst == h]])
        w = np.concatenate([inst.weight[src == h], inst.weight[dst == h]])
        ok = (nbrs >= 0) & ~relay[np.maximum(nbrs, 0)] | (nbrs < h) & (nbrs >= 0) & relay[np.maximum(nbrs, 0)]
        if ok.any():
            depth[h] = 1 + max((int(depth[n]) for n in nbrs[ok] if relay[n]), default=-1)
            rows.append((int(h), nbrs[ok], w[ok]))
    plan = []
    for level in sorted({int(depth[h]) for h, _, _ in rows}):
        mine = [r for r in rows if depth[r[0]] == level]
        D = max(len(r[1]) for r in mine)
        nb = np.array([np.pad(r[1], (0, D - len(r[1])), mode="edge") for r in mine], dtype=np.int64)
        wt = np.array([np.pad(r[2], (0, D - len(r[2]))) for r in mine])
        plan.append((np.array([r[0] for r in mine], dtype=np.int64), nb, wt))
    return plan


def placed_hub_xy(inst: Instance, slots: np.ndarray, policy: str = "median") -> tuple[np.ndarray, np.ndarray]:
    """Hub coordinates (H,) for one placement ``slots`` (T,), as new arrays."""
    hx, hy = hub_xy(inst, (slots % inst.cols)[None, :], (slots // inst.cols)[None, :], policy)
    return hx[0], hy[0]


def endpoint_xy(inst: Instance, slots: np.ndarray, policy: str = "median") -> tuple[np.ndarray, np.ndarray]:
    """Coordinates (P, T+H) of every endpoint for placements ``slots`` (P, T)."""
    slots = np.atleast_2d(slots)
    tx, ty = slots % inst.cols, slots // inst.cols
    hx, hy = hub_xy(inst, tx, ty, policy)
    return np.concatenate([tx, hx], axis=1), np.concatenate([ty, hy], axis=1)


def flow_hops(inst: Instance, slots: np.ndarray, policy: str = "median") -> np.ndarray:
    """XY hop count (P, F) of every flow."""
    x, y = endpoint_xy(inst, slots, policy)
    return np.abs(x[:, inst.src] - x[:, inst.dst]) + np.abs(y[:, inst.src] - y[:, inst.dst])


def evaluate(inst: Instance, slots: np.ndarray, policy: str = "median") -> tuple[np.ndarray, np.ndarray]:
    """(byte-hops, max hops) of each placement in ``slots`` (P, T)."""
    hops = flow_hops(inst, slots, policy)
    if hops.shape[1] == 0:
        zero = np.zeros(hops.shape[0])
        return zero, zero
    return hops @ inst.weight, hops.max(axis=1).astype(np.float64)


def hub_slots(inst: Instance, slots: np.ndarray, policy: str = "median") -> np.ndarray:
    """PE index of every hub for one placement (T,)."""
    x, y = endpoint_xy(inst, slots[None, :], policy)
    return (y[0, inst.num_tiles :] * inst.cols + x[0, inst.num_tiles :]).astype(np.int32)
