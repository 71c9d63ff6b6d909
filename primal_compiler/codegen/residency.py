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
A request's adapters already held are used in place; a new one takes an
empty slot, else the least recently used slot of an adapter the request
does not pin. A request on
more adapters than slots pins the first ``slots - 1`` it uses (they stay
resident) and rotates the rest through the last slot, so every decode step
loads the same ``adapters - slots + 1`` adapters at the same passes: the
step is periodic and a long generation repeats it (``executor/steady.py``).
The optimal offline policy (Belady, 1966) loads fewer on a cycle of
adapters (12 instead of 13 for four adapters over two slots in a prefill
and three decode steps) but in a pattern that repeats only every few steps,
which no settled step can stand for. A slot is loaded only when its adapter is not held, so the
program's CONFIG records are exactly the writes the residency needs. A
macro holds at most 32 slots: the mask register has a bit per slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.ir.tiles import Macro
from primal_compiler.isa.opcodes import SRAM_SLOTS

if TYPE_CHECKING:
    from primal_compiler.ir.tiles import TileTable
    from primal_compiler.target.spec import PrimalTarget

EMPTY = -1


def tile_slots(rows: np.ndarray, cols: np.ndarray, target: PrimalTarget, lora_bits: int) -> np.ndarray:
    """Tiles of ``rows`` x ``cols`` (each at least 1) a PE's SRAM-DCIM macro holds (module docstring), at most
    :data:`SRAM_SLOTS`."""
    width = max(1, target.sram.cols_bits // lora_bits)
    return np.minimum(SRAM_SLOTS, (target.sram.rows // rows.astype(np.int64)) * (width // cols.astype(np.int64)))


def sram_slots(tiles: TileTable, target: PrimalTarget, lora_bits: int) -> int:
    """Adapters every PE's SRAM-DCIM macro holds at once: the fewest of any LoRA tile (module docstring); 0
    without LoRA tiles."""
    sram = tiles.macro == Macro.SRAM
    return int(tile_slots(tiles.rows[sram], tiles.cols[sram], target, lora_bits).min()) if sram.any() else 0


@dataclass
class Slots:
    """The adapter in each slot (``EMPTY`` before its first load) and, while a request runs, the adapters it
    pins (:meth:`request`)."""

    count: int
    held: list[int] = field(default_factory=list)
    used: list[int] = field(default_factory=list)  # per slot, when it was last found or loaded
    pinned: tuple[int, ...] = ()
    tick: int = 0

    def __post_init__(self) -> None:
        self.held = [EMPTY] * self.count
        self.used = [-1] * self.count

    def request(self, adapters: tuple[int, ...]) -> tuple[int, ...]:
        """Start a request on ``adapters`` (distinct, in the order its passes first use them): it pins the first
        ``count - 1`` when there are more than ``count``, none otherwise. Returns those to load ahead: the first
        ``count``."""
        self.pinned = adapters[: self.count - 1] if len(adapters) > self.count else ()
        return adapters[: self.count]

    def find(self, adapter: int) -> int | None:
        """The slot holding ``adapter``, marked used now; None when no slot holds it."""
        if adapter not in self.held:
            return None
        return self._use(self.held.index(adapter))

    def _use(self, slot: int) -> int:
        self.tick += 1
        self.used[slot] = self.tick
        return slot

    def load(self, adapter: int, keep: tuple[int, ...] = ()) -> int:
        """The slot ``adapter`` is written into: its own (a rewrite), else an empty one, else the least recently
        used whose adapter is neither pinned nor in ``keep``; it then holds ``adapter``, used now."""
        if adapter in self.held:
            return self._use(self.held.index(adapter))
        free = [s for s in range(self.count) if self.held[s] not in keep and self.held[s] not in self.pinned]
        slot = min(free, key=lambda s: (self.held[s] != EMPTY, self.used[s], s))
        self.held[slot] = adapter
        return self._use(slot)
