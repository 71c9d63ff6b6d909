"""Which adapter each SRAM-DCIM slot holds while a stream is emitted.

A PE has one SRAM-DCIM macro of ``sram.rows`` rows of ``sram.cols_bits``
bits, ``lora_width = cols_bits // lora_weight_bits`` weights a row (the
seed's 256 x 64 bits: 8 weights of 8 bits). A LoRA tile of ``r`` rows and
``c`` columns leaves room for ``(sram.rows // r) * (lora_width // c)``
tiles of its shape: stacked by rows (a digital macro's rows of another slot
get zero inputs and add nothing) and side by side by column groups (the
seed's column-granular banks). Every PE holds its tiles in the same slots, so
a program has ``slots`` = that figure for its largest tile: a rank-8 LoRA
of 256-row blocks fills the seed's macro (one slot), a rank-4 one two.

:class:`Slots` keeps, while codegen emits, which adapter each slot holds.
Codegen knows every pass the program will run, so it evicts as the optimal
offline policy does (Belady, 1966): a request's adapters already held are
used in place; a new one takes an empty slot, else the slot whose adapter is
next needed furthest ahead (never again first) among those the pass about to
run does not need. A slot is loaded only when its adapter is not held, so
the program's CONFIG records are exactly the writes the residency needs: a
batch cycling through more adapters than slots, which defeats a
least-recently-used policy, keeps ``slots - 1`` of them resident.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.ir.tiles import Macro

if TYPE_CHECKING:
    from primal_compiler.ir.tiles import TileTable
    from primal_compiler.target.spec import PrimalTarget

EMPTY = -1


def sram_slots(tiles: TileTable, target: PrimalTarget, lora_bits: int) -> int:
    """Adapters every PE's SRAM-DCIM macro holds at once (module docstring); 0 without LoRA tiles."""
    sram = tiles.macro == Macro.SRAM
    if not sram.any():
        return 0
    width = max(1, target.sram.cols_bits // lora_bits)
    rows, cols = tiles.rows[sram].astype(np.int64), tiles.cols[sram].astype(np.int64)
    return int(((target.sram.rows // rows) * (width // cols)).min())


@dataclass
class Slots:
    """The adapter in each slot (``EMPTY`` before its first load), given ``uses``: the adapter of every pass of
    the program, in stream order; :meth:`passed` moves past the pass about to run."""

    count: int
    uses: tuple[int, ...]
    held: list[int] = field(default_factory=list)
    cursor: int = 0
    later: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    next_at: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.held = [EMPTY] * self.count
        n = len(self.uses)
        self.later = np.full(n, n, np.int64)  # the next pass on the same adapter, n when none
        for i in range(n - 1, -1, -1):
            a = self.uses[i]
            self.later[i] = self.next_at.get(a, n)
            self.next_at[a] = i

    def find(self, adapter: int) -> int | None:
        """The slot holding ``adapter``; None when no slot holds it."""
        return self.held.index(adapter) if adapter in self.held else None

    def load(self, adapter: int, keep: tuple[int, ...] = ()) -> int:
        """The slot ``adapter`` is written into: its own (a rewrite), else an empty one, else the one whose adapter
        is next needed furthest ahead among those not in ``keep``; it then holds ``adapter``."""
        free = [s for s in range(self.count) if self.held[s] not in keep or self.held[s] == adapter]
        n = len(self.uses)
        slot = min(free, key=lambda s: (self.held[s] != adapter, self.held[s] != EMPTY,
                                        -self.next_at.get(self.held[s], n), s))
        self.held[slot] = adapter
        return slot

    def passed(self) -> None:
        """The pass at the cursor was emitted: its adapter is next needed at its next use."""
        self.next_at[self.uses[self.cursor]] = int(self.later[self.cursor])
        self.cursor += 1
