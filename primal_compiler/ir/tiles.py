"""The tile table: one row per weight tile, stored as numpy columns.

Every base weight matrix is cut into RRAM-ACIM crossbar tiles (one row per
bit slice when weights are wider than a cell); every LoRA factor into
SRAM-DCIM tiles. Passes fill the placement columns (``ct``, ``seq``, ``pe``)
and never change the weight columns. Columns all have the same length and
plain numeric dtypes (no object arrays).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from enum import IntEnum

import numpy as np

from primal_compiler.ir.model import Role

ROLE_CODES: tuple[Role, ...] = tuple(Role)
ROLE_INDEX: dict[Role, int] = {r: i for i, r in enumerate(ROLE_CODES)}


class Macro(IntEnum):
    RRAM = 0
    SRAM = 1


class Part(IntEnum):
    BASE = 0
    LORA_A = 1
    LORA_B = 2


COLUMNS: dict[str, type] = {
    "layer": np.int32,  # decoder layer; num_layers for the LM head
    "role": np.int8,  # index into ROLE_CODES
    "part": np.int8,  # Part
    "macro": np.int8,  # Macro
    "brow": np.int32,  # block row (input block)
    "bcol": np.int32,  # block column (output block)
    "slice": np.int8,  # bit slice of the weights held by this tile
    "rows": np.int32,  # used macro rows
    "cols": np.int32,  # used macro columns (weights)
    "bytes": np.int64,  # weight bytes stored
    "host": np.int64,  # SRAM tiles: row of the RRAM tile whose PE hosts them, or their own row (a PE of their own)
    "ct": np.int32,  # compute tile, -1 until blocked
    "seq": np.int32,  # position in its CT's canonical sequence (RRAM tiles), -1 otherwise
    "pe": np.int32,  # PE index row*mesh_cols+col within the CT, -1 until placed
    "zero": np.int8,  # 1: every weight of the tile is zero (LoRA block masked), 0: not, -1: unknown
}


@dataclass(frozen=True, eq=False)
class TileTable:
    """Column store of tiles; construct with :meth:`from_columns` to get dtype checks."""

    layer: np.ndarray
    role: np.ndarray
    part: np.ndarray
    macro: np.ndarray
    brow: np.ndarray
    bcol: np.ndarray
    slice: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    bytes: np.ndarray
    host: np.ndarray
    ct: np.ndarray
    seq: np.ndarray
    pe: np.ndarray
    zero: np.ndarray

    @classmethod
    def from_columns(cls, **cols: np.ndarray) -> TileTable:
        n = len(next(iter(cols.values())))
        out = {}
        for name, dtype in COLUMNS.items():
            value = cols.get(name)
            if value is None:
                value = np.full(n, -1, dtype=dtype)
            value = np.ascontiguousarray(value, dtype=dtype)
            if value.shape != (n,):
                raise ValueError(f"tile column {name} has shape {value.shape}, expected ({n},)")
            out[name] = value
        return cls(**out)

    @classmethod
    def concat(cls, tables: list[TileTable]) -> TileTable:
        """Tables stacked in order; ``host`` indices are rebased to the result."""
        offsets = np.cumsum([0] + [len(t) for t in tables[:-1]])
        cols = {}
        for name in COLUMNS:
            parts = [getattr(t, name) for t in tables]
            if name == "host":
                parts = [np.where(p >= 0, p + off, -1) for p, off in zip(parts, offsets)]
            cols[name] = np.concatenate(parts) if parts else np.empty(0, COLUMNS[name])
        return cls.from_columns(**cols)

    def __len__(self) -> int:
        return len(self.layer)

    def with_columns(self, **cols: np.ndarray) -> TileTable:
        for name, value in cols.items():
            if name not in COLUMNS:
                raise KeyError(f"unknown tile column {name}")
            if len(value) != len(self):
                raise ValueError(f"tile column {name}: length {len(value)} != {len(self)}")
        return replace(self, **{k: np.ascontiguousarray(v, dtype=COLUMNS[k]) for k, v in cols.items()})

    def columns(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.columns().values())


def lora_macros(macro: np.ndarray, ct: np.ndarray, pe: np.ndarray, host: np.ndarray, num_cts: int,
                pes: int) -> np.ndarray:
    """Per CT: SRAM-DCIM macros holding LoRA weights, the PEs of its SRAM tiles (placed tile columns)."""
    sram = np.flatnonzero(macro == Macro.SRAM)
    held = np.unique(ct[host[sram]].astype(np.int64) * pes + pe[sram])
    return np.bincount(held // pes, minlength=num_cts).astype(np.int64)
