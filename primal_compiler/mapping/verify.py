"""IR verification between passes (``--verify``): structural invariants of tiles and layout."""

from __future__ import annotations

import numpy as np

from primal_compiler.ir.tiles import Macro


def verify_tiles(program) -> None:
    """Raise AssertionError when a tile-table or placement invariant is broken."""
    t = program.tiles
    sram = t.macro == Macro.SRAM
    rows = np.arange(len(t))
    assert (t.host[sram] >= 0).all(), "SRAM tile without a host"
    own = sram & (t.host == rows)
    assert (t.macro[t.host[sram & ~own]] == Macro.RRAM).all(), "SRAM tile hosted by another SRAM tile"
    assert np.unique(t.host[sram]).size == sram.sum(), "two SRAM tiles share a PE's SRAM macro"
    layout = program.layout
    if layout is None:
        return
    owners = ~sram | own  # RRAM tiles and self-hosted SRAM tiles: one PE each
    assert (t.ct[owners] >= 0).all() and (t.ct < layout.num_cts).all(), "tile outside the CTs"
    placed = owners & (t.pe >= 0)
    if placed.any():
        assert placed.sum() == owners.sum(), "some PE-owning tiles unplaced"
        assert (t.pe[placed] < layout.rows * layout.cols).all(), "PE off the mesh"
        key = t.ct[placed].astype(np.int64) * layout.rows * layout.cols + t.pe[placed]
        assert np.unique(key).size == key.size, "two tiles on one PE"
