"""Column bands: the seed's rule "Q, K, V and O each in a column-shaped rectangle" as a placement constraint.

The seed (section 3) constrains each attention matrix to a column-shaped
rectangle of the mesh, W_Q next to W_K. A role's tile count is rarely a
multiple of the mesh's rows (Llama-2-13B's first CT holds 400 Q, 400 K and
220 V tiles on 32 rows), so an exactly filled rectangle is mostly
impossible; the band is the feasible reading: the CT's PEs are taken column
by column, top to bottom, and each attention role owns the next PEs, exactly
as many as it has tiles, in the order of the role's first tile in the CT's
sequence (blocking packs Q, K, V, O in that order). A band is then whole
columns, partial only in its first and last column; the next role's band
starts on the PE after the previous one ends, so W_Q's band touches W_K's.
Every other tile (MLP, LM head, self-hosted SRAM) may use only the PEs no
band holds. A placement that keeps each tile on a PE of its band keeps the
rule (``column_band_<role>`` of :mod:`primal_compiler.mapping.rules`).

For the GA, each region's PEs (in that column-major order) and its tiles
(in sequence order) are cut into groups of ``g``; a band has as many slot
groups as tile groups, the last of each the same size when ``g`` does not
divide the band, and that partial tile group is reserved to that partial
slot group. The other tiles' groups take whole free slot groups; a free
remainder of fewer than ``g`` PEs is left to the polishers, unless the
whole groups are one short: then the free tiles fill all of them (their
count and the free PEs' differ by less than ``g``), so their partial group
is no larger than the remainder and is reserved to it. Every CT whose tiles
fit its mesh therefore has bands.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from primal_compiler.ir.model import Role
from primal_compiler.ir.tiles import ROLE_INDEX

ATTENTION = (Role.Q, Role.K, Role.V, Role.O)
RESERVED_NONE, UNUSED = -1, -2  # values of Bands.reserved besides a tile group


def tile_bands(roles: np.ndarray) -> np.ndarray:
    """Band of each tile: 1, 2, ... for the attention roles in the order of their first tile, 0 for the rest.

    ``roles`` is each tile's role code (-1 for a tile that belongs to no matrix's band, e.g. self-hosted SRAM).
    """
    band = np.zeros(len(roles), dtype=np.int64)
    codes = [ROLE_INDEX[r] for r in ATTENTION]
    present = [c for c in codes if (roles == c).any()]
    present.sort(key=lambda c: int(np.argmax(roles == c)))
    for k, c in enumerate(present):
        band[roles == c] = k + 1
    return band


@dataclass(frozen=True, eq=False)
class Bands:
    """Regions, slot groups and tile groups of one CT under the band constraint; arrays are read-only by convention."""

    pe_band: np.ndarray  # (S,) band of each PE (0 = free)
    groups: np.ndarray  # (Q, g) PEs of each slot group, -1 past the end of a partial group
    group_band: np.ndarray  # (Q,) band of each slot group
    reserved: np.ndarray  # (Q,) the tile group a slot group is kept for, RESERVED_NONE or UNUSED
    tile_band: np.ndarray  # (T,) band of each tile
    tile_group: np.ndarray  # (T,) tile group of each tile: a band's tiles in sequence order, g at a time
    tile_pos: np.ndarray  # (T,) position of each tile inside its group
    tile_group_band: np.ndarray  # (G,) band of each tile group


def build_bands(rows: int, cols: int, tile_band: np.ndarray, g: int) -> Bands:
    """The bands of a CT whose tiles carry ``tile_band``; a ValueError says why they do not fit."""
    S, T = rows * cols, len(tile_band)
    n_bands = int(tile_band.max(initial=0))
    sizes = np.bincount(tile_band, minlength=n_bands + 1)
    if T > S:
        raise ValueError(f"{T} tiles do not fit the {rows}x{cols} mesh")
    k = np.arange(S)
    column_major = (k % rows) * cols + k // rows
    region = np.repeat(np.r_[1:n_bands + 1, 0], np.r_[sizes[1:], S - T + sizes[0]])
    pe_band = np.empty(S, dtype=np.int64)
    pe_band[column_major] = region
    groups, group_band, reserved = [], [], []
    tile_group = np.empty(T, dtype=np.int64)
    tile_pos = np.empty(T, dtype=np.int64)
    tile_group_band: list[int] = []
    for band in [*range(1, n_bands + 1), 0]:
        pes = column_major[region == band]
        tiles = np.flatnonzero(tile_band == band)
        first = len(tile_group_band)
        tile_group[tiles] = first + np.arange(len(tiles)) // g
        tile_pos[tiles] = np.arange(len(tiles)) % g
        tile_group_band += [band] * -(-len(tiles) // g)
        for at in range(0, len(pes), g):
            chunk = pes[at:at + g]
            groups.append(np.pad(chunk, (0, g - len(chunk)), constant_values=-1))
            group_band.append(band)
            if len(chunk) == g:
                reserved.append(RESERVED_NONE)
            elif band or len(pes) // g < -(-len(tiles) // g):
                reserved.append(first + (len(tiles) - 1) // g)  # the partial tile group, no larger (see above)
            else:
                reserved.append(UNUSED)
    return Bands(pe_band, np.array(groups, dtype=np.int64).reshape(-1, g), np.array(group_band, dtype=np.int64),
                 np.array(reserved, dtype=np.int64), tile_band, tile_group, tile_pos,
                 np.array(tile_group_band, dtype=np.int64))
