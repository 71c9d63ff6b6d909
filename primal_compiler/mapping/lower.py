"""Lower a model to its tile table (vectorized, one template per distinct layer).

Base weights become RRAM-ACIM tiles of ``rram_rows x rram_cols`` weights, one
tile per bit slice when the weight is wider than a cell. A LoRA factor
becomes SRAM-DCIM tiles of ``sram_rows x (sram_cols_bits // lora_bits)``
weights: A (in x r) is cut ``in/sram_rows x r/width``; B (r x out) is stored
transposed, ``out/sram_rows x r/width``. Each SRAM tile is hosted by the PE of
an RRAM tile of the same layer (the PE has one SRAM macro), preferring a tile
that already receives the same input (A) or reduces the same outputs (B).
When a layer has more SRAM tiles than RRAM tiles (a small model with a large
rank), the rest are their own hosts (``host`` = their own row): each gets a
PE of its own whose crossbar holds nothing. Identical decoder layers are
lowered once and replicated.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.ir.model import DecoderLayer, Linear, Model, Role
from primal_compiler.ir.tiles import ROLE_INDEX, Macro, Part, TileTable
from primal_compiler.target.table import MAX_PES

if TYPE_CHECKING:
    from primal_compiler.target.spec import PrimalTarget


@dataclass(frozen=True)
class Geometry:
    """Macro geometry and bit widths the lowering needs."""

    rram_rows: int
    rram_cols: int
    bits_per_cell: int
    sram_rows: int
    sram_cols_bits: int
    base_bits: int
    lora_bits: int
    lm_head_bits: int

    @property
    def lora_width(self) -> int:
        return max(1, self.sram_cols_bits // self.lora_bits)


def geometry(model, target: PrimalTarget) -> Geometry:
    """The geometry ``model`` is cut with on ``target``: the target's macros, the model's precision."""
    p = model.precision
    return Geometry(target.rram.rows, target.rram.cols, target.rram.bits_per_cell, target.sram.rows,
                    target.sram.cols_bits, p.base_weight_bits, p.lora_weight_bits, p.lm_head_bits)


PSUM_MAX_BITS = 32
"""Widest partial sum a root keeps: FP32 (what a dot product wider than this is accumulated in)."""


def psum_bits(model: Model, activation_bits: int, base_bits: int, lora_bits: int, lm_head_bits: int) -> int:
    """Bits a column's partial sum needs to stay exact: a dot product of ``n`` products of an ``a``-bit
    activation and a ``w``-bit weight needs ``a + w + ceil(log2 n)`` bits, the widest over the model's
    projections (base weights, LoRA A over the input, LoRA B over the rank, the LM head), at most
    :data:`PSUM_MAX_BITS`. Llama-2-13B's 4-bit projections need 26 (down, 13,824 inputs), its 8-bit LoRA A
    29 (5,120 inputs) and its FP16 LM head 37, so its partial sums are FP32; a designer may keep fewer by
    rounding each tile's sum (24-32 bits is the plausible range)."""
    need = [activation_bits + lm_head_bits + max(0, (model.hidden_size - 1).bit_length())]
    for layer in model.layers:
        for lin in layer.linears:
            need.append(activation_bits + base_bits + max(0, (lin.in_features - 1).bit_length()))
            if lin.lora is not None:
                need.append(activation_bits + lora_bits + max(0, (lin.in_features - 1).bit_length()))
                need.append(activation_bits + lora_bits + max(0, (lin.lora.rank - 1).bit_length()))
    return min(PSUM_MAX_BITS, max(need))


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _base_tiles(layer: int, lin: Linear, geo: Geometry, bits: int) -> TileTable:
    """RRAM tiles of one matrix in canonical order: output block, input block, slice."""
    R, C = _ceil(lin.in_features, geo.rram_rows), _ceil(lin.out_features, geo.rram_cols)
    S = _ceil(bits, geo.bits_per_cell)
    j, i, s = (a.ravel() for a in np.meshgrid(np.arange(C), np.arange(R), np.arange(S), indexing="ij"))
    rows = np.minimum(geo.rram_rows, lin.in_features - i * geo.rram_rows)
    cols = np.minimum(geo.rram_cols, lin.out_features - j * geo.rram_cols)
    slice_bits = np.where(s < S - 1, geo.bits_per_cell, bits - (S - 1) * geo.bits_per_cell)
    n = len(i)
    return TileTable.from_columns(
        layer=np.full(n, layer), role=np.full(n, ROLE_INDEX[lin.role]), part=np.full(n, Part.BASE),
        macro=np.full(n, Macro.RRAM), brow=i, bcol=j, slice=s, rows=rows, cols=cols,
        bytes=(rows * cols * slice_bits + 7) // 8,
    )


def _lora_tiles(layer: int, lin: Linear, geo: Geometry) -> TileTable:
    """SRAM tiles of A then B; ``brow`` is the in (A) or out (B) block, ``bcol`` the rank block."""
    assert lin.lora is not None
    width, rank = geo.lora_width, lin.lora.rank
    K = _ceil(rank, width)
    tables = []
    for part, size in ((Part.LORA_A, lin.in_features), (Part.LORA_B, lin.out_features)):
        blocks = _ceil(size, geo.sram_rows)
        b, k = (a.ravel() for a in np.meshgrid(np.arange(blocks), np.arange(K), indexing="ij"))
        rows = np.minimum(geo.sram_rows, size - b * geo.sram_rows)
        cols = np.minimum(width, rank - k * width)
        n = len(b)
        tables.append(TileTable.from_columns(
            layer=np.full(n, layer), role=np.full(n, ROLE_INDEX[lin.role]), part=np.full(n, part),
            macro=np.full(n, Macro.SRAM), brow=b, bcol=k, slice=np.zeros(n), rows=rows, cols=cols,
            bytes=(rows * cols * geo.lora_bits + 7) // 8,
        ))
    return TileTable.concat(tables)


def _assign_hosts(table: TileTable) -> np.ndarray:
    """Host row for every SRAM tile of one layer table; -1 for RRAM tiles.

    The host is a distinct RRAM tile while one is free, else the SRAM tile itself (a PE of its own).
    """
    host = np.full(len(table), -1, dtype=np.int64)
    rram = np.flatnonzero(table.macro == Macro.RRAM)
    sram = np.flatnonzero(table.macro == Macro.SRAM)
    free = np.ones(len(table), dtype=bool)
    free[sram] = False
    for t in sram:
        same = rram[(table.role[rram] == table.role[t]) & free[rram]]
        if table.part[t] == Part.LORA_A:
            pref = same[table.brow[same] == table.brow[t]]
            key = (table.bcol[pref] - table.brow[t] - table.bcol[t]) % (table.bcol[pref].max(initial=0) + 1)
        else:
            pref = same[table.bcol[same] == table.brow[t]]
            key = (table.brow[pref] - table.brow[t] - table.bcol[t] - 1) % (table.brow[pref].max(initial=0) + 1)
        if len(pref):
            choice = pref[np.lexsort((table.slice[pref], key))[0]]
        elif len(same):
            choice = same[0]
        elif free[rram].any():
            choice = rram[free[rram]][0]
        else:
            choice = t
        host[t] = choice
        free[choice] = False
    return host


def lower_layer(layer: DecoderLayer, geo: Geometry) -> TileTable:
    tables = [_base_tiles(layer.index, lin, geo, geo.base_bits) for lin in layer.linears]
    tables += [_lora_tiles(layer.index, lin, geo) for lin in layer.linears if lin.lora is not None]
    table = TileTable.concat(tables)
    return table.with_columns(host=_assign_hosts(table))


def layer_templates(model: Model) -> tuple[np.ndarray, list[int]]:
    """Template id of each layer, and the first layer of each template."""
    keys: dict[DecoderLayer, int] = {}
    ids = np.empty(model.num_layers, dtype=np.int32)
    firsts: list[int] = []
    for n, layer in enumerate(model.layers):
        key = replace(layer, index=0)
        if key not in keys:
            keys[key] = len(firsts)
            firsts.append(n)
        ids[n] = keys[key]
    return ids, firsts


def _rram_count(lin: Linear, geo: Geometry, bits: int) -> int:
    blocks = _ceil(lin.in_features, geo.rram_rows) * _ceil(lin.out_features, geo.rram_cols)
    return blocks * _ceil(bits, geo.bits_per_cell)


def _sram_count(lin: Linear, geo: Geometry) -> int:
    if lin.lora is None:
        return 0
    blocks = _ceil(lin.in_features, geo.sram_rows) + _ceil(lin.out_features, geo.sram_rows)
    return blocks * _ceil(lin.lora.rank, geo.lora_width)


def check_size(model: Model, geo: Geometry) -> None:
    """Refuse, before any array is made, a lowering that cannot be placed.

    A layer needs a PE per RRAM tile plus one per SRAM tile beyond them (SRAM tiles left without an
    RRAM host get a PE of their own); the model may need at most ``MAX_PES`` PEs (the largest package
    a target may declare).
    """
    ids, firsts = layer_templates(model)
    pes = []
    for f in firsts:
        layer = model.layers[f]
        n = sum(_rram_count(lin, geo, geo.base_bits) for lin in layer.linears)
        lora = sum(_sram_count(lin, geo) for lin in layer.linears)
        pes.append(max(n, lora))
    head = _rram_count(Linear(Role.LM_HEAD, model.hidden_size, model.vocab_size), geo, geo.lm_head_bits)
    total = sum(pes[k] for k in ids.tolist()) + head
    if total > MAX_PES:
        raise InputError(model.name, f"needs {total:,} PEs (one per RRAM tile, and per SRAM tile beyond them), "
                                     f"more than the {MAX_PES:,} PEs of the largest package a target may declare")


def lower_model(model: Model, geo: Geometry) -> TileTable:
    """Tile table of every layer (in layer order) followed by the LM head (layer ``num_layers``).

    Sizes are checked first (:func:`check_size`), so an unplaceable model never allocates its table.
    """
    check_size(model, geo)
    ids, firsts = layer_templates(model)
    templates = [lower_layer(model.layers[f], geo) for f in firsts]
    parts = []
    for n in range(model.num_layers):
        t = templates[ids[n]]
        parts.append(t.with_columns(layer=np.full(len(t), n)))
    head = Linear(Role.LM_HEAD, model.hidden_size, model.vocab_size)
    parts.append(_base_tiles(model.num_layers, head, geo, geo.lm_head_bits))
    return TileTable.concat(parts)
