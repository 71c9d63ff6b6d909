"""The compiler's scratchpad allocation: every buffer at its largest, beside the KV cache, on every PE.

Each location (CT, PE, buffer tag) gets, for the whole program, the bytes of
its largest instance (:mod:`.buffers`); a PE's allocation is its KV chunks
plus all its locations. It is a static allocation, as a compiler for a
machine without a run-time allocator makes it: every instance of a location
uses that location's bytes, and locations never share bytes, so a PE's
occupancy in a replay (:mod:`.memory`) is at most its allocation whatever
the timing (``tests/executor/test_allocation.py`` checks it on every fixture
family). A program whose allocation fits every scratchpad fits the machine;
one that does not is refused under ``--memory strict`` before any replay,
naming the PE, its largest buffers and the bytes (:func:`overflow`;
``codegen/fit.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.executor.buffers import Sizing, instances, kv_bytes, pe_keys, tile_shapes
from primal_compiler.executor.deps import footprints
from primal_compiler.isa.opcodes import buf_name

if TYPE_CHECKING:
    from primal_compiler.ir.program import Program
    from primal_compiler.isa.stream import Stream
    from primal_compiler.target.spec import PrimalTarget


@dataclass(frozen=True, eq=False)
class Allocation:
    """Bytes allocated on every PE (arrays indexed ``ct * pes + pe``) and on every location."""

    capacity_bytes: int
    pes: int
    kv_bytes: np.ndarray  # int64 KV chunks of each PE
    pe_bytes: np.ndarray  # int64 KV plus every location of each PE
    loc: np.ndarray  # int64 location key ``ct << 32 | pe << 16 | tag``, sorted
    loc_bytes: np.ndarray  # int64 its largest instance

    @classmethod
    def of(cls, loc: np.ndarray, nbytes: np.ndarray, kv: np.ndarray, pes: int, capacity: int) -> Allocation:
        """The allocation of buffer instances at locations ``loc`` of ``nbytes`` each, with ``kv`` per PE."""
        keys, inv = np.unique(loc, return_inverse=True)
        top = np.zeros(len(keys), dtype=np.int64)
        np.maximum.at(top, inv, nbytes)
        total = kv.astype(np.int64).copy()
        np.add.at(total, pe_keys(keys, pes), top)
        return cls(capacity, pes, kv, total, keys, top)

    @property
    def peak_bytes(self) -> int:
        return int(self.pe_bytes.max(initial=0))

    @property
    def pes_over(self) -> int:
        return int((self.pe_bytes > self.capacity_bytes).sum())

    @property
    def fits(self) -> bool:
        return self.pes_over == 0

    @property
    def worst(self) -> int:
        """The PE (``ct * pes + pe``) with the largest allocation."""
        return int(np.argmax(self.pe_bytes)) if len(self.pe_bytes) else 0

    def largest(self, pe_key: int, n: int = 3) -> list[tuple[str, int]]:
        """(buffer name, bytes) of PE ``pe_key``'s ``n`` largest locations, largest first."""
        mine = np.flatnonzero(pe_keys(self.loc, self.pes) == pe_key)
        mine = mine[np.argsort(-self.loc_bytes[mine], kind="stable")][:n]
        return [(buf_name(int(self.loc[i] & 0xFFFF)), int(self.loc_bytes[i])) for i in mine]


def allocate(stream: Stream, s: Sizing, kv: np.ndarray, capacity: int,
             part: np.ndarray | None = None) -> tuple[Allocation, Allocation | None]:
    """The allocation of ``stream``'s buffers (module docstring), ``kv`` bytes per PE beside them, and with
    ``part`` (a mask over records) also that of the instances whose first record ``part`` holds."""
    inst = instances(stream, footprints(stream), s)
    whole = Allocation.of(inst.loc, inst.bytes, kv, s.pes, capacity)
    if part is None:
        return whole, None
    mine = part[inst.rec[inst.cut]]
    return whole, Allocation.of(inst.loc[mine], inst.bytes[mine], kv, s.pes, capacity)


def of_program(program: Program, target: PrimalTarget, stream: Stream,
               part: np.ndarray | None = None) -> tuple[Allocation, Allocation | None]:
    """:func:`allocate` of ``stream`` on ``program``'s placement and KV map, against ``target``'s
    ``router.scratchpad_bytes``."""
    pes, num_cts = target.ct.pes, program.need_layout().num_cts
    num = num_cts * pes
    rram_rows, rram_cols, sram_rows, sram_cols = tile_shapes(program.need_tiles().columns(), num_cts, pes)
    sizing = Sizing(pes, rram_rows, rram_cols, sram_rows, sram_cols, target.router.dmac_bits,
                    asdict(program.model.precision))
    k = program.need_kv()
    kv = kv_bytes(k.chunk_tokens * k.head_dim * k.kv_bytes, k.ct, k.pe, pes, num)
    return allocate(stream, sizing, kv, target.router.scratchpad_bytes, part)


def overflow(a: Allocation) -> str:
    """Where the allocation overflows most: the PE, its bytes against the capacity, its largest buffers."""
    w = a.worst
    parts = ", ".join(f"{name} {size:,} B" for name, size in a.largest(w))
    kv = int(a.kv_bytes[w])
    return (f"CT {w // a.pes} PE {w % a.pes} needs {int(a.pe_bytes[w]):,} B of its {a.capacity_bytes:,} B "
            f"scratchpad ({parts}{f', KV {kv:,} B' if kv else ''}); {a.pes_over:,} PEs over")


def summary(a: Allocation) -> dict:
    """The ``allocation`` object of a report: capacity, the largest PE's bytes, PEs over capacity."""
    w = a.worst
    return {"capacity_bytes": a.capacity_bytes, "peak_bytes": a.peak_bytes, "pes_over_capacity": a.pes_over,
            "fits": a.fits, "worst": {"ct": w // a.pes, "pe": w % a.pes, "bytes": int(a.pe_bytes[w]),
                                      "largest": [{"buffer": n, "bytes": b} for n, b in a.largest(w)]}}
