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
