"""What every scratchpad buffer of a stream holds, without timing: bytes per element, elements per access,
and the buffer instances (one location in one pass) with their bytes.

A location is (CT, PE, buffer tag); a **buffer instance** is a location within
one pass (a pass ends at the controller's ARGMAX). Its elements are the
largest element end any record's footprint reaches there
(``isa/descriptors.py`` gives where an access starts; :func:`access_elements`
how many elements it covers, from the record's own fields); its bytes are
elements times the storage width of its kind (:data:`STORAGE_BITS`). The
KV chunks a PE holds are the kv-ring's allocation (:func:`kv_bytes`).
Controller buffers, SRAM weight slots and the mask register are not
scratchpad bytes and are not counted. :mod:`.memory` adds the replay's time
(when each instance is live); :mod:`.allocation` the compiler's static
allocation (every location at its largest instance).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.executor.deps import Footprints
from primal_compiler.isa.descriptors import END
from primal_compiler.isa.opcodes import CONTROLLER, STATISTICS, BufKind, HiddenBuf, Opcode, ReduceOp, step_ends
from primal_compiler.ir.tiles import Macro

if TYPE_CHECKING:
    from primal_compiler.isa.stream import Stream

STORAGE_BITS = {
    BufKind.HIDDEN: "activation_bits", BufKind.IN: "activation_bits", BufKind.LORA_R: "activation_bits",
    BufKind.QVEC: "activation_bits", BufKind.PROXY: "activation_bits",
    BufKind.ROOT: "psum_bits", BufKind.PSUM: "psum_bits", BufKind.LORA_A: "psum_bits",
    BufKind.SCORE: "dmac_bits", BufKind.ATTN: "dmac_bits", BufKind.OBLK: "dmac_bits",
}
"""Bits one element of a buffer kind takes in a scratchpad: activations at the model's
``precision.activation_bits``; what a REDUCE of partial sums writes (roots, partial sums, LoRA A outputs) at
``precision.psum_bits``; attention scores, partial outputs and merged blocks at the DMACs'
``router.dmac_bits`` (FP16). Kinds not listed are not scratchpad buffers (KV chunks are counted from the
kv-ring's allocation). A norm's statistics (HIDDEN STATS and TOTAL) are sums, held at ``psum_bits``
(:func:`statistics`)."""


@dataclass(frozen=True, eq=False)
class Sizing:
    """What sizes an access: PEs per CT, the used rows and columns of the RRAM and SRAM tile at every
    ``ct * pes + pe`` (0: none), the DMACs' operand bits and the model's precision fields."""

    pes: int
    rram_rows: np.ndarray
    rram_cols: np.ndarray
    sram_rows: np.ndarray
    sram_cols: np.ndarray
    dmac_bits: int
    precision: dict[str, int]


def tile_shapes(tiles: dict[str, np.ndarray], num_cts: int, pes: int) -> list[np.ndarray]:
    """Used rows and columns of the RRAM and SRAM tile at every (CT, PE): ``[rram_rows, rram_cols, sram_rows,
    sram_cols]`` from the tile table's columns (``macro``, ``ct``, ``pe``, ``host``, ``rows``, ``cols``); all
    zero without a tile table (a hand-written stream has no macro work)."""
    size = num_cts * pes
    if "macro" not in tiles:
        return [np.zeros(size, np.int64) for _ in range(4)]
    out = []
    macro, ct, pe, host = tiles["macro"], tiles["ct"], tiles["pe"], tiles["host"]
    for m in (Macro.RRAM, Macro.SRAM):
        sel = np.flatnonzero((macro == m) & (pe >= 0))
        where = ct[sel] if m == Macro.RRAM else ct[np.maximum(host[sel], 0)]
        key = where.astype(np.int64) * pes + pe[sel]
        rows, cols = np.zeros(size, np.int64), np.zeros(size, np.int64)
        rows[key], cols[key] = tiles["rows"][sel], tiles["cols"][sel]
        out += [rows, cols]
    return out


def program_tiles(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The tile table's columns in a program file's arrays (``tile_ct`` ... as ``ct`` ...)."""
    return {k[5:]: v for k, v in arrays.items() if k.startswith("tile_")}


def widths(precision: dict[str, int], dmac_bits: int) -> np.ndarray:
    """Storage bytes per element of each buffer kind (0: not a scratchpad buffer)."""
    out = np.zeros(16, dtype=np.int64)
    for kind, field in STORAGE_BITS.items():
        bits = dmac_bits if field == "dmac_bits" else int(precision[field])
        out[int(kind)] = -(-bits // 8)
    return out


def access_elements(records: np.ndarray, f: Footprints, s: Sizing) -> np.ndarray:
    """Elements each footprint row covers from where it starts (0 where the record's fields do not say).

    Router records move ``nbytes`` per destination: elements are ``nbytes`` over the width they travel at
    (activations at ``activation_bits``, a REDUCE of partial sums at ``psum_bits``, a softmax merge and
    scores at the DMACs' FP16, a KV append at ``kv_bits``). ``ACT`` covers ``count`` elements; an
    SMAC's input covers ``count`` vectors of its tile's rows and its output ``count`` vectors of its
    columns. A DMAC's buffers are sized by the router records that fill and drain them.
    """
    op, count = records["op"][f.rec].astype(np.int64), records["count"][f.rec].astype(np.int64)
    nbytes, arg = records["nbytes"][f.rec].astype(np.int64), records["arg"][f.rec]
    kind = f.tag >> 12
    act, psum = int(s.precision["activation_bits"]) / 8, int(s.precision["psum_bits"]) / 8
    dmac, kv = s.dmac_bits / 8, int(s.precision["kv_bits"]) / 8
    width = np.full(len(op), act)
    width[op == Opcode.KV_APPEND] = kv
    red = op == Opcode.REDUCE
    width[red & ((arg & 0xF) == ReduceOp.SUM)] = psum
    width[red & ((arg & 0xF) == ReduceOp.SOFTMAX_MERGE)] = dmac
    width[(op == Opcode.UNICAST) & (kind == BufKind.SCORE)] = kv
    stats = statistics(f.tag)
    width[stats] = psum
    out = np.zeros(len(op), dtype=np.int64)
    router = np.isin(op, (Opcode.BCAST, Opcode.UNICAST, Opcode.REDUCE, Opcode.KV_APPEND))
    out[router] = np.round(nbytes[router] / width[router]).astype(np.int64)
    out[op == Opcode.ACT] = count[op == Opcode.ACT]
    shard = np.maximum(arg.astype(np.int64) >> 8, 1)
    per = np.zeros(256, dtype=np.int64)
    for fn, k in STATISTICS.items():
        per[int(fn)] = k
    sel = (op == Opcode.ACT) & stats  # a shard's statistics, written or read: STATISTICS values per vector
    out[sel] = count[sel] // shard[sel] * per[arg[sel] & 0xFF]
    key = f.ct * s.pes + np.where(f.ct == CONTROLLER, 0, f.pe)
    for smac, rows, cols in ((Opcode.SMAC_RRAM, s.rram_rows, s.rram_cols),
                             (Opcode.SMAC_SRAM, s.sram_rows, s.sram_cols)):
        sel = np.flatnonzero(op == smac)
        shape = np.where(f.write[sel], cols[key[sel]], rows[key[sel]])
        out[sel] = count[sel] * shape
    return out


@dataclass(frozen=True, eq=False)
class Instances:
    """Every buffer instance of a stream (rows sorted by location, then pass) and the footprint rows behind
    them: ``cut[k]`` is instance k's first row of ``rec``/``write``."""

    loc: np.ndarray  # int64 location key ``ct << 32 | pe << 16 | tag`` of each instance
    bytes: np.ndarray  # int64
    cut: np.ndarray  # int64 first footprint row of each instance
    rec: np.ndarray  # int64 record of each footprint row
    write: np.ndarray  # bool per footprint row


CHUNK_ROWS = 1 << 20
"""Footprint rows :func:`instances` sizes at once: :func:`access_elements` makes a dozen temporaries per row, so the
whole stream at once (8.2 M rows on the main job) held about 1 GiB of them."""


def instances(stream: Stream, f: Footprints, s: Sizing) -> Instances:
    """The buffer instances of ``stream`` and their bytes (module docstring)."""
    records = stream.records
    w = widths(s.precision, s.dmac_bits)
    keep = (f.ct != CONTROLLER) & (f.tag < 0xF000)  # a pseudo-buffer's kind is 15
    keep &= w[f.tag >> 12] > 0
    rows = np.flatnonzero(keep)
    del keep
    end_el = np.empty(len(rows), dtype=np.int64)
    for a in range(0, len(rows), CHUNK_ROWS):
        part = rows[a : a + CHUNK_ROWS]
        sub = Footprints(*(getattr(f, k)[part] for k in ("rec", "ct", "pe", "tag", "lo", "hi", "write")))
        end_el[a : a + CHUNK_ROWS] = np.where(sub.lo >= END, 0, sub.lo + access_elements(records, sub, s))
    passes = np.concatenate([[0], np.cumsum(step_ends(records))[:-1]]).astype(np.int64)
    rec = f.rec[rows]
    loc = f.keys(rows)
    order = np.lexsort((passes[rec], loc))  # instances contiguous: by location, then pass
    rec, loc, end_el, wr = rec[order], loc[order], end_el[order], f.write[rows[order]]
    del order, rows
    pas = passes[rec]
    cut = np.flatnonzero(np.concatenate([[True], (loc[1:] != loc[:-1]) | (pas[1:] != pas[:-1])]))
    del pas
    tag = loc[cut] & 0xFFFF
    per = np.where(statistics(tag), -(-int(s.precision["psum_bits"]) // 8), w[tag >> 12])
    size = (np.maximum.reduceat(end_el, cut) if len(cut) else np.zeros(0, np.int64)) * per
    return Instances(loc[cut], size.astype(np.int64), cut, rec, wr)


def statistics(tag: np.ndarray) -> np.ndarray:
    """bool per buffer tag: a norm's statistics (HIDDEN STATS or TOTAL), held at ``psum_bits``."""
    return ((tag >> 12) == BufKind.HIDDEN) & np.isin(tag & 0xF, (HiddenBuf.STATS, HiddenBuf.TOTAL))


def pe_keys(loc: np.ndarray, pes: int) -> np.ndarray:
    """``ct * pes + pe`` of location keys (``ct << 32 | pe << 16 | tag``)."""
    return (loc >> 32) * pes + ((loc >> 16) & 0xFFFF)


def kv_bytes(chunk_bytes: int, kv_ct: np.ndarray, kv_pe: np.ndarray, pes: int, num: int) -> np.ndarray:
    """Bytes of KV chunks the kv-ring allocated on each PE (``ct * pes + pe``), ``chunk_bytes`` a chunk."""
    out = np.zeros(num, dtype=np.int64)
    np.add.at(out, kv_ct.astype(np.int64) * pes + kv_pe.astype(np.int64), chunk_bytes)
    return out
