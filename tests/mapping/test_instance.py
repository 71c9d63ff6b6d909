"""Placement instances: hubs at weighted medians, and row-tied hubs sharing the median of all their tiles."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.mapping.instance import Instance, evaluate, hub_xy

# 4x4 mesh, tiles 0..2, hubs 3, 4: tile 0 -> hub 0; tiles 1, 2 -> hub 1; hub 0 -> hub 1 carries 5 bytes
SRC, DST = np.array([0, 1, 2, 3], np.int32), np.array([3, 4, 4, 4], np.int32)
W = np.array([1.0, 1.0, 1.0, 5.0])
SLOTS = np.array([[0, 15, 11]])  # (row 0, col 0), (3, 3), (2, 3)


def _inst(ties=()) -> Instance:
    return Instance(4, 4, 3, 2, SRC, DST, W, np.zeros(4, np.int8), row_ties=ties)


def test_untied_hubs_sit_at_their_own_weighted_medians():
    hx, hy = hub_xy(_inst(), SLOTS % 4, SLOTS // 4)
    assert hx.tolist() == [[0, 3]] and hy.tolist() == [[0, 2]]  # hub 1: lower median of rows 2 and 3
    assert evaluate(_inst(), SLOTS)[0].tolist() == [0 + 1 + 0 + 5 * (3 + 2)]


def test_row_tied_hubs_share_the_median_row_of_all_their_tiles():
    hx, hy = hub_xy(_inst(((0, 1),)), SLOTS % 4, SLOTS // 4)
    assert hx.tolist() == [[0, 3]] and hy.tolist() == [[2, 2]]  # median of rows 0, 3, 2; columns stay free
    assert evaluate(_inst(((0, 1),)), SLOTS)[0].tolist() == [2 + 1 + 0 + 5 * 3]


@pytest.mark.parametrize("ties, message", [(((0, 2),), "out of range"), (((0, 1),), "hub 1 exchanges data with no tile")])
def test_ties_that_cannot_hold_are_refused(ties, message):
    src, dst = (SRC, DST) if "range" in message else (SRC[:1], DST[:1])
    with pytest.raises(ValueError, match=message):
        Instance(4, 4, 3, 2, src, dst, W[: len(src)], np.zeros(len(src), np.int8), row_ties=ties)


def _relays_one_by_one(inst: Instance, hx: np.ndarray, hy: np.ndarray) -> None:
    """The rule for hubs without tile flows, hub by hub in index order: each goes to the lower weighted
    median of its neighbours placed so far (every hub with tile flows, every relay before it)."""
    T = inst.num_tiles
    placed = np.zeros(inst.num_hubs, dtype=bool)
    placed[np.concatenate([inst.src[inst.src >= T][inst.dst[inst.src >= T] < T],
                           inst.dst[inst.dst >= T][inst.src[inst.dst >= T] < T]]) - T] = True
    for h in np.flatnonzero(~placed):
        out, into = inst.src == T + h, inst.dst == T + h
        nbrs = np.concatenate([inst.dst[out], inst.src[into]]) - T
        w = np.concatenate([inst.weight[out], inst.weight[into]])
        ok = (nbrs >= 0) & placed[np.maximum(nbrs, 0)]
        for col in (hx, hy):
            if ok.any():
                for p in range(len(col)):
                    order = np.argsort(col[p, nbrs[ok]], kind="stable")
                    v, cw = col[p, nbrs[ok]][order], np.cumsum(w[ok][order])
                    col[p, h] = v[np.argmax(2 * cw >= cw[-1])]
        placed[h] = True


@pytest.mark.parametrize("seed", range(8))
def test_relay_hubs_follow_the_one_by_one_rule(seed):
    rng = np.random.default_rng(seed)
    T, H = 12, 10
    src, dst = [], []
    for t in range(T):  # hubs 0-4 talk to tiles
        src.append(T + int(rng.integers(0, 5))), dst.append(t)
    for _ in range(14):  # hubs 5-9 talk only to hubs: to earlier and later relays, to themselves
        a, b = int(rng.integers(5, 10)), int(rng.integers(0, 10))
        src.append(T + a), dst.append(T + b)
    inst = Instance(5, 5, T, H, np.array(src, np.int32), np.array(dst, np.int32),
                    rng.integers(1, 9, len(src)).astype(float), np.zeros(len(src), np.int8))
    slots = np.stack([rng.permutation(25)[:T] for _ in range(6)])
    hx, hy = hub_xy(inst, slots % 5, slots // 5)
    ref_x, ref_y = hub_xy(inst, slots % 5, slots // 5)
    relays = np.setdiff1d(np.arange(H), np.asarray(src)[np.asarray(dst) < T] - T)  # every hub without tile flows
    ref_x[:, relays] = 0
    ref_y[:, relays] = 0
    _relays_one_by_one(inst, ref_x, ref_y)
    assert np.array_equal(hx, ref_x) and np.array_equal(hy, ref_y)
