"""Column bands: which tiles own which PEs, and the GA keeping every tile in its band."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from primal_compiler.ir.model import Role
from primal_compiler.ir.tiles import ROLE_INDEX
from primal_compiler.mapping.bands import UNUSED, build_bands, tile_bands
from primal_compiler.mapping.ga import GaConfig, run_ga

from .instances import random_instance

Q, K, V, UP = (ROLE_INDEX[r] for r in (Role.Q, Role.K, Role.V, Role.UP))


def test_bands_are_numbered_by_each_roles_first_tile_and_others_are_free():
    roles = np.array([K, K, Q, UP, -1, V, Q])
    assert tile_bands(roles).tolist() == [1, 1, 2, 0, 0, 3, 2]
    assert tile_bands(np.array([UP, UP, -1])).tolist() == [0, 0, 0]


def test_bands_take_whole_columns_top_to_bottom_in_band_order():
    b = build_bands(4, 4, np.array([1, 1, 1, 1, 1, 2, 2, 0, 0]), 1)
    # band 1: column 0 and the top of column 1; band 2 continues down column 1; the rest is free
    assert b.groups[:, 0].tolist()[:8] == [0, 4, 8, 12, 1, 5, 9, 13]
    pe = b.pe_band.reshape(4, 4)
    assert pe.tolist() == [[1, 1, 0, 0], [1, 2, 0, 0], [1, 2, 0, 0], [1, 0, 0, 0]]


def test_groups_of_g_leave_one_partial_group_per_band_reserved_for_its_last_tiles():
    b = build_bands(4, 4, np.array([1, 1, 1, 2, 2, 0]), 2)
    # band 1 = PEs 0, 4, 8; band 2 = 12, 1 (the next column); the free PEs follow in column-major order
    assert b.groups.tolist() == [[0, 4], [8, -1], [12, 1], [5, 9], [13, 2], [6, 10], [14, 3], [7, 11], [15, -1]]
    assert b.group_band.tolist() == [1, 1, 2, 0, 0, 0, 0, 0, 0]
    assert b.reserved.tolist() == [-1, 1, -1, -1, -1, -1, -1, -1, UNUSED]  # tile group 1 = Q's third tile
    assert b.tile_group.tolist() == [0, 0, 1, 2, 2, 3] and b.tile_pos.tolist() == [0, 1, 0, 0, 1, 0]
    assert b.tile_group_band.tolist() == [1, 1, 2, 0]


def test_the_free_remainder_takes_the_free_partial_group_when_the_whole_groups_are_one_short():
    b = build_bands(2, 2, np.array([1, 0, 0, 0]), 2)  # Q = PE 0; three free tiles on PEs 2, 1, 3
    assert b.groups.tolist() == [[0, -1], [2, 1], [3, -1]]
    assert b.reserved.tolist() == [0, -1, 2] and b.tile_group.tolist() == [0, 1, 1, 2]
    with pytest.raises(ValueError, match="5 tiles do not fit the 2x2 mesh"):
        build_bands(2, 2, np.zeros(5, np.int64), 1)


def test_a_full_mesh_with_bands_gets_a_placement_for_every_group_size():
    inst = random_instance(5, 4, 4, 16, 3)
    for bands in [(1, 1, 1, 2, 2, 2, 2, 2) + (0,) * 8, (1, 1, 1) + (0,) * 13]:  # the second: free groups one short
        for g in (1, 2, 4):
            res = run_ga(inst, GaConfig(generations=3, population=6, group_size=g, bands=bands))
            assert sorted(res.slots.tolist()) == list(range(16))
            assert build_bands(4, 4, np.array(bands), g).pe_band[res.slots].tolist() == list(bands)


@pytest.mark.parametrize("group_size", [1, 2])
def test_every_placement_the_ga_returns_keeps_each_tile_in_its_band(group_size):
    inst = random_instance(3, 4, 4, 10, 3)
    bands = (1, 1, 1, 1, 1, 2, 2, 2, 0, 0)
    res = run_ga(inst, GaConfig(generations=6, population=10, group_size=group_size, bands=bands))
    pe_band = build_bands(4, 4, np.array(bands), group_size).pe_band
    assert pe_band[res.slots].tolist() == list(bands)
    assert len(set(res.slots.tolist())) == 10
    free = run_ga(inst, GaConfig(generations=6, population=10, group_size=group_size))
    assert pe_band[free.slots].tolist() != list(bands)  # unconstrained, the same search leaves the bands


def test_a_pin_inside_the_band_is_kept_and_one_outside_is_refused():
    inst = random_instance(3, 4, 4, 10, 3)
    bands = (1, 1, 1, 1, 1, 2, 2, 2, 0, 0)
    res = run_ga(inst, GaConfig(generations=4, population=8, group_size=1, bands=bands, pins=((6, 13),)))
    assert int(res.slots[6]) == 13
    with pytest.raises(ValueError, match="outside the tile's column band"):
        run_ga(inst, GaConfig(generations=4, population=8, group_size=1, bands=bands, pins=((6, 0),)))


def test_a_pin_that_moves_a_bands_partial_group_is_refused():
    inst = random_instance(3, 4, 4, 10, 3)
    bands = (1, 1, 1, 1, 1, 2, 2, 2, 0, 0)  # g=2: Q's fifth tile is alone in the group kept for it
    with pytest.raises(ValueError, match="moves the last, partial group of column band 1"):
        run_ga(inst, GaConfig(generations=4, population=8, group_size=2, bands=bands, pins=((4, 0),)))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.sampled_from([1, 2, 4]), st.data())
def test_bands_partition_the_mesh_into_column_major_runs(rows, cols, g, data):
    S = rows * cols
    band = np.array(data.draw(st.lists(st.integers(0, 4), min_size=0, max_size=S)), dtype=np.int64)
    b = build_bands(rows, cols, band, g)
    for k in range(1, int(band.max(initial=0)) + 1):
        pes = np.flatnonzero(b.pe_band == k)
        assert len(pes) == (band == k).sum()  # exactly as many PEs as tiles
        order = np.sort((pes % cols) * rows + pes // cols)  # column-major positions: one run
        assert len(order) == 0 or order[-1] - order[0] == len(order) - 1
    on = b.groups[b.groups >= 0]
    assert sorted(on.tolist()) == list(range(S))  # slot groups cover every PE once
    assert (b.pe_band[b.groups[:, 0]] == b.group_band).all()
    used = b.reserved != UNUSED
    for k in range(int(band.max(initial=0)) + 1):  # each band's tile groups fit its usable slot groups
        assert (b.tile_group_band == k).sum() <= (used & (b.group_band == k)).sum()
    kept = b.reserved >= 0
    sizes = np.bincount(b.tile_group, minlength=len(b.tile_group_band))
    assert ((b.groups[kept] >= 0).sum(axis=1) >= sizes[b.reserved[kept]]).all()  # a kept group holds its tiles
