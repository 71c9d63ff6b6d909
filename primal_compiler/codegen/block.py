"""A block of records with its own group table, built row by row or column-wise, then shifted.

Blocks are generated once per layer template and replicated for every layer
that uses it by :func:`shifted` (CT ids and layer moved, groups renumbered),
so a model's emit time grows with its distinct layers, not its depth.
"""

from __future__ import annotations

import numpy as np

from primal_compiler.isa.opcodes import CONTROLLER, NONE16, NONE32, RECORD, empty

_FIELDS: tuple[str, ...] = RECORD.names or ()


class Block:
    def __init__(self) -> None:
        self._rows: list[dict] = []
        self._parts: list[np.ndarray] = []
        self.group_sizes: list[np.ndarray] = []
        self.group_ct: list[np.ndarray] = []
        self.group_pe: list[np.ndarray] = []
        self.num_groups = 0

    def add(self, **fields) -> None:
        """One record (fields not given keep their unused value)."""
        self._rows.append(fields)

    def add_group(self, cts, pes) -> int:
        """A new group of members (ct, pe); its block-local id."""
        cts, pes = np.asarray(cts, np.int64).ravel(), np.asarray(pes, np.int64).ravel()
        self.group_sizes.append(np.array([len(cts)]))
        self.group_ct.append(cts)
        self.group_pe.append(pes)
        self.num_groups += 1
        return self.num_groups - 1

    def add_groups(self, sizes: np.ndarray, cts: np.ndarray, pes: np.ndarray) -> np.ndarray:
        """Many groups at once (members in consecutive runs); their block-local ids."""
        self.group_sizes.append(np.asarray(sizes, np.int64))
        self.group_ct.append(np.asarray(cts, np.int64))
        self.group_pe.append(np.asarray(pes, np.int64))
        ids = np.arange(self.num_groups, self.num_groups + len(sizes))
        self.num_groups += len(sizes)
        return ids

    def add_columns(self, n: int, **fields) -> None:
        """``n`` records from scalar or length-``n`` array fields."""
        self._flush()
        rec = empty(n)
        for name, value in fields.items():
            rec[name] = value
        self._parts.append(rec)

    def _flush(self) -> None:
        if self._rows:
            rec = empty(len(self._rows))
            for name in _FIELDS:
                vals = [r.get(name) for r in self._rows]
                if any(v is not None for v in vals):
                    col = rec[name]
                    rec[name] = [col[i] if v is None else v for i, v in enumerate(vals)]
            self._parts.append(rec)
            self._rows = []

    def extend(self, other: Block) -> None:
        """Append ``other`` (its groups renumbered after ours)."""
        rec = other.records()
        has = rec["group"] != NONE32
        rec["group"][has] += self.num_groups
        self._flush()
        self._parts.append(rec)
        self.add_groups(other.sizes(), other.members()[0], other.members()[1])

    def records(self) -> np.ndarray:
        """A new array of every record so far, in order."""
        self._flush()
        out = empty(sum(len(p) for p in self._parts))  # filled part by part: one record dtype, no promotion
        at = 0
        for part in self._parts:
            out[at : at + len(part)] = part
            at += len(part)
        return out

    def sizes(self) -> np.ndarray:
        return np.concatenate(self.group_sizes) if self.group_sizes else np.zeros(0, np.int64)

    def members(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.group_ct:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(self.group_ct), np.concatenate(self.group_pe)

    def __len__(self) -> int:
        return sum(len(p) for p in self._parts) + len(self._rows)


def shifted(records: np.ndarray, ct_shift: int, layer: int | None, group_shift: int = 0) -> np.ndarray:
    """Copy of ``records`` with CT fields moved by ``ct_shift`` (controller kept), groups renumbered, layer set."""
    out = records.copy()
    has = out["group"] != NONE32
    out["group"][has] += group_shift
    for name in ("ct", "dst_ct"):
        col = out[name]
        move = (col != CONTROLLER) & (col != NONE16)
        col[move] = col[move] + ct_shift
    if layer is not None:
        out["layer"] = layer
    return out
