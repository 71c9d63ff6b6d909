"""Large-neighbourhood search over hub positions, started from a polished placement.

The GA and its assignment polish stop in a placement where no single
re-assignment with the hubs at their medians helps (:func:`.lap.lap_polish`).
Each LNS round leaves that valley: it **destroys** the placement of a random
``KICK_FRACTION`` of the hubs (each moved by up to ``KICK_STEP`` PEs in x and
y, inside the mesh) and of every tile that exchanges data with one of them,
then **repairs** those tiles by an optimal linear assignment onto the PEs
they held and the free PEs, with every hub fixed (the kicked ones where the
kick put them); the hubs then go back to their medians and the repair is
repeated while it lowers the cost, at most ``REPAIR_ROUNDS`` times. A round's
placement is kept only when it lowers byte-hops and keeps max hops within
the start's, so the search never ends above its start in either (a lower
cost bought with longer flows would be sold back by the max-hop trade that
follows).

Pinned tiles keep their PE; with ``regions`` every tile stays in its region
(the column bands); row-tied hubs are re-tied by the median step. Every draw
comes from ``numpy.random.default_rng(seed)``, so the result is a function of
the inputs, the seed and the number of rounds, unless a ``deadline``
(``time.perf_counter`` value, 0 = none) ends the search first; a ``goal``
(byte-hops, e.g. a proven gap above the lower bound) ends it as soon as the
placement reaches it, which depends on the inputs only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from primal_compiler.mapping.instance import Instance, evaluate, placed_hub_xy
from primal_compiler.mapping.lap import FORBIDDEN, Regions, tile_hub_weights

KICK_FRACTION = 0.15
"""Share of the hubs each round moves: 0.05-0.3 gave the same gains on Llama-2-13B's templates (docs/mapping.md)."""
KICK_STEP = 3
"""Largest move of a kicked hub per axis, in PEs; 2-8 gave the same gains."""
REPAIR_ROUNDS = 3
"""Assignment + median rounds per repair, at most."""


def lns_search(inst: Instance, slots: np.ndarray, pins: dict[int, int], rounds: int, seed: int,
               regions: Regions = None, deadline: float = 0.0, goal: float = -1.0,
               progress: Callable[[int, float], None] | None = None) -> tuple[np.ndarray, int, int]:
    """(best placement found, rounds run, rounds accepted) after at most ``rounds`` destroy-and-repair rounds
    (module docstring), fewer once byte-hops reach ``goal``; ``progress(round, byte-hops)`` follows each round.

    Hubs sit at their medians (the ``median`` policy); the returned placement's byte-hops and max hops
    are each at most those of ``slots``.
    """
    if inst.num_hubs == 0 or rounds <= 0:
        return slots, 0, 0
    rng = np.random.default_rng(seed)
    W, _ = tile_hub_weights(inst)
    movable = np.ones(inst.num_tiles, dtype=bool)
    movable[list(pins)] = False
    touches = (W > 0) & movable[:, None]
    if not touches.any():  # every hub's tiles are pinned: no round can move anything
        return slots, 0, 0
    cost, mx = evaluate(inst, slots[None, :])
    best, accepted, ran = (float(cost[0]), float(mx[0])), 0, 0
    cap = best[1]
    for ran in range(1, rounds + 1):
        if (deadline and time.perf_counter() > deadline) or best[0] <= goal:
            ran -= 1
            break
        kicked = rng.random(inst.num_hubs) < KICK_FRACTION
        hx, hy = placed_hub_xy(inst, slots)
        shift = rng.integers(-KICK_STEP, KICK_STEP + 1, size=(2, int(kicked.sum())))
        hx[kicked] = np.clip(hx[kicked] + shift[0], 0, inst.cols - 1)
        hy[kicked] = np.clip(hy[kicked] + shift[1], 0, inst.rows - 1)
        tiles = np.flatnonzero(touches[:, kicked].any(axis=1))
        if len(tiles):
            cand = _repair(inst, W, slots, tiles, hx, hy, regions)
            c, m = evaluate(inst, cand[None, :])
            if float(c[0]) < best[0] and float(m[0]) <= cap:
                best, slots, accepted = (float(c[0]), float(m[0])), cand, accepted + 1
        if progress is not None:
            progress(ran, best[0])
    return slots, ran, accepted


def _repair(inst: Instance, W: np.ndarray, slots: np.ndarray, tiles: np.ndarray, hx: np.ndarray,
            hy: np.ndarray, regions: Regions) -> np.ndarray:
    """Re-assign ``tiles`` over their PEs and the free ones, alternating with hub medians while it helps."""
    from scipy.optimize import linear_sum_assignment  # heavy: imported when used, not to parse a command line

    free = np.setdiff1d(np.arange(inst.num_slots), slots)
    pes = np.concatenate([slots[tiles], free])
    px, py = pes % inst.cols, pes // inst.cols
    ruled_out = None if regions is None else regions[0][tiles][:, None] != regions[1][pes][None, :]
    out, kept = slots, None
    for _ in range(REPAIR_ROUNDS):
        C = W[tiles] @ (np.abs(hx[:, None] - px[None, :]) + np.abs(hy[:, None] - py[None, :]))
        if ruled_out is not None:
            C[ruled_out] = FORBIDDEN
        _, col = linear_sum_assignment(C)  # every tile keeps a PE of its region: its own is among ``pes``
        cand = out.copy()
        cand[tiles] = pes[col]
        c, m = evaluate(inst, cand[None, :])
        if kept is not None and (float(c[0]), float(m[0])) >= kept:
            break
        out, kept = cand, (float(c[0]), float(m[0]))
        hx, hy = placed_hub_xy(inst, out)
    return out
