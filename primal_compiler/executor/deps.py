"""Dependencies of a stream: read-after-write, write-after-read and write-after-write on element ranges.

Every record's footprints come from the opcode descriptor table
(:mod:`primal_compiler.isa.descriptors`): which locations, and which element
range of each, it reads and writes. Per location, in stream order, the
builder keeps the **live writes** (whose values a later read may still see)
and the **live reads** (that a later write must not overtake):

- a read depends on every live write its range overlaps (RAW): a buffer
  assembled from slices makes its reader wait for every slice;
- a write depends on every live read its range overlaps (WAR), and on every
  live write it covers (WAW); the reads and writes it covers stop being live
  (whatever later touches them also touches this write, which is ordered
  after them). A write that only partly overlaps a live write is a sibling
  slice: both stay live, unordered, and a later reader waits for both.

A slice's range runs from its offset to the end of the buffer (router
moves carry only their offsets), so a slice written at a lower offset after
one at a higher offset orders after it; codegen writes slices in ascending
order. Nothing is lost by the over-wide ranges: a reader still waits for
every writer whose elements it may read. The builder is complete in the sense
the oracle test checks (``tests/executor/test_dep_oracle.py``): every record
whose value another consumes, as the functional replay logs it element by
element, is an ancestor of the consumer.

A read no earlier record can satisfy is an error, naming the record, its CT,
PE and buffer, except for state with a defined initial value (a KV chunk:
empty; the mask register: no slot masked). The controller's tokens are a
buffer (``TOKEN``, one per sequence): a sequence's ARGMAX writes it and its
next EMBED reads it, so sequences do not wait for each other's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.arrays import distinct
from primal_compiler.errors import InputError
from primal_compiler.executor.transfers import group_members
from primal_compiler.isa.descriptors import DESCRIPTORS, END, Access, At, Buffer, Extent, Pseudo
from primal_compiler.isa.opcodes import (
    ARG_ENUM_MASK, CONTROLLER, NONE16, BufKind, DmacOp, HiddenBuf, Opcode, buf_name, hidden,
)
from primal_compiler.jit import njit

if TYPE_CHECKING:
    from primal_compiler.isa.stream import Stream

_INITIAL = (int(BufKind.KV_K), int(BufKind.KV_V), int(Pseudo.MASK) >> 12)
"""Buffer kinds (high 4 bits) whose unwritten state is defined, so reading it unwritten is legal."""


@dataclass(frozen=True)
class Footprints:
    """One row per (record, location) access; ``write`` false for a read."""

    rec: np.ndarray  # int64
    ct: np.ndarray  # int64 (CONTROLLER for the controller)
    pe: np.ndarray  # int64 (0 at the controller)
    tag: np.ndarray  # int64 buffer tag or Pseudo tag
    lo: np.ndarray  # int64 first element
    hi: np.ndarray  # int64 one past the last element
    write: np.ndarray  # bool

    @property
    def key(self) -> np.ndarray:
        return self.keys(slice(None))

    def keys(self, rows) -> np.ndarray:
        """The location keys ``ct << 32 | pe << 16 | tag`` of rows ``rows`` (an index array or a slice)."""
        return (self.ct[rows] << 32) | (self.pe[rows] << 16) | self.tag[rows]


def _selected(r: np.ndarray, rec: np.ndarray, a: Access) -> np.ndarray:
    keep = np.ones(len(rec), dtype=bool)
    flags = r["flags"][rec]
    if a.flags:
        keep &= (flags & a.flags) == a.flags
    if a.without:
        keep &= (flags & a.without) == 0
    if a.args:
        op = int(r["op"][rec[0]]) if len(rec) else 0
        keep &= np.isin(r["arg"][rec] & ARG_ENUM_MASK.get(Opcode(op), 0xFFFFFFFF), a.args)
    return rec[keep]


def _tag(r: np.ndarray, rec: np.ndarray, b: Buffer) -> np.ndarray:
    arg = r["arg"][rec].astype(np.int64)
    if b == Buffer.SRC_BUF:
        return r["src_buf"][rec].astype(np.int64)
    if b == Buffer.DST_BUF:
        return r["dst_buf"][rec].astype(np.int64)
    if b == Buffer.SRAM_SLOT:
        return (int(BufKind.SRAM) << 12) | (arg & 0xFFF)
    if b == Buffer.KV_CHUNK:
        kind = np.where((arg & 0xFF) == DmacOp.QK, int(BufKind.KV_K), int(BufKind.KV_V))
        return (kind << 12) | ((arg >> 8) & 0xFFF)
    if b == Buffer.NORM_TOTAL:
        return np.full(len(rec), hidden(HiddenBuf.TOTAL), dtype=np.int64)
    return np.full(len(rec), int(Pseudo.MASK), dtype=np.int64)  # MASK_REGISTER


def _extent(r: np.ndarray, rec: np.ndarray, e: Extent) -> tuple[np.ndarray, np.ndarray]:
    arg = r["arg"][rec].astype(np.int64)
    end = np.full(len(rec), END, dtype=np.int64)
    if e == Extent.WHOLE:
        return np.zeros(len(rec), dtype=np.int64), end
    if e == Extent.MOVE_SRC:
        return (arg >> 16) * 8, end
    if e == Extent.MOVE_DST:
        return (arg & 0xFFFF) * 8, end
    if e == Extent.REDUCE_SRC:
        return ((arg >> 4) & 0x3FFF) * 8, end
    if e == Extent.REDUCE_DST:
        return (arg >> 18) * 8, end
    if e == Extent.KV_SRC:
        return ((arg >> 16) & 0xFF) * 8, end
    if e == Extent.TOKEN_SLOTS:
        return arg & 0xFFFF, (arg & 0xFFFF) + r["count"][rec].astype(np.int64)
    return arg & 0xFFFF, (arg & 0xFFFF) + 1  # SLOT_BIT (CONFIG's adapter id sits above the slot)


def footprints(stream: Stream) -> Footprints:
    """Every access of every record, as the descriptor table defines it."""
    r = stream.records
    op = r["op"]
    parts = []
    for opcode, d in DESCRIPTORS.items():
        every = np.flatnonzero(op == opcode)
        if not len(every):
            continue
        for a, is_write in [(a, False) for a in d.reads] + [(a, True) for a in d.writes]:
            rec = _selected(r, every, a)
            if a.buffer in (Buffer.SRC_BUF, Buffer.DST_BUF):
                rec = rec[r["src_buf" if a.buffer == Buffer.SRC_BUF else "dst_buf"][rec] != NONE16]
            tag, (lo, hi) = _tag(r, rec, a.buffer), _extent(r, rec, a.extent)
            if a.at == At.MEMBERS:
                which, ct, pe = group_members(stream, rec)
                idx = np.searchsorted(rec, which)
                rec, tag, lo, hi = which, tag[idx], lo[idx], hi[idx]
            else:
                field = ("ct", "pe") if a.at == At.SOURCE else ("dst_ct", "dst_pe")
                ct, pe = r[field[0]][rec], r[field[1]][rec]
            parts.append([rec, ct, pe, tag, lo, hi, np.full(len(rec), is_write)])
    cols = []
    for i in range(7):  # a column at a time, its parts dropped once joined: the parts and one column are held
        cols.append(np.concatenate([p[i] for p in parts]).astype(np.int64 if i < 6 else bool, copy=False)
                    if parts else np.zeros(0, np.int64 if i < 6 else bool))
        for p in parts:
            p[i] = None
    rec, ct, pe, tag, lo, hi = cols[:6]
    pe = np.where(ct == CONTROLLER, 0, pe)
    return Footprints(rec, ct, pe, tag, lo, hi, cols[6])


@njit(nogil=True)
def _sweep(loc, rec, lo, hi, wr, initial, width):  # pragma: no cover - compiled
    """(consumer, producer) edges (int32 records) and the first unsatisfiable read (-1 none) of accesses sorted by
    location."""
    m = len(loc)
    cap = max(16, 2 * m)
    out_c = np.empty(cap, dtype=np.int32)
    out_p = np.empty(cap, dtype=np.int32)
    n = 0
    w_rec = np.empty(width, dtype=np.int64)
    w_lo = np.empty(width, dtype=np.int64)
    w_hi = np.empty(width, dtype=np.int64)
    r_rec = np.empty(width, dtype=np.int64)
    r_lo = np.empty(width, dtype=np.int64)
    r_hi = np.empty(width, dtype=np.int64)
    nw = 0
    nr = 0
    bad = -1
    for i in range(m):
        if i == 0 or loc[i] != loc[i - 1]:
            nw = 0
            nr = 0
        a, b, me = lo[i], hi[i], rec[i]
        if n + nw + nr + 2 > cap:
            cap = 2 * cap + nw + nr
            c2 = np.empty(cap, dtype=np.int32)
            p2 = np.empty(cap, dtype=np.int32)
            c2[:n] = out_c[:n]
            p2[:n] = out_p[:n]
            out_c, out_p = c2, p2
        if not wr[i]:
            found = False
            for j in range(nw):
                if w_lo[j] < b and a < w_hi[j]:
                    found = True
                    if w_rec[j] != me:
                        out_c[n] = me
                        out_p[n] = w_rec[j]
                        n += 1
            if not found and not initial[i] and bad < 0:
                bad = i
            r_rec[nr], r_lo[nr], r_hi[nr] = me, a, b
            nr += 1
            continue
        k = 0
        for j in range(nr):
            if r_lo[j] < b and a < r_hi[j]:
                if r_rec[j] != me:
                    out_c[n] = me
                    out_p[n] = r_rec[j]
                    n += 1
                if a <= r_lo[j] and r_hi[j] <= b:
                    continue
            r_rec[k], r_lo[k], r_hi[k] = r_rec[j], r_lo[j], r_hi[j]
            k += 1
        nr = k
        k = 0
        for j in range(nw):
            if a <= w_lo[j] and w_hi[j] <= b:
                if w_rec[j] != me:
                    out_c[n] = me
                    out_p[n] = w_rec[j]
                    n += 1
                continue
            w_rec[k], w_lo[k], w_hi[k] = w_rec[j], w_lo[j], w_hi[j]
            k += 1
        nw = k
        w_rec[nw], w_lo[nw], w_hi[nw] = me, a, b
        nw += 1
    return out_c[:n], out_p[:n], bad


def predecessors(stream: Stream, where: str = "program", f: Footprints | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(ptr, pred): predecessors of record i are pred[ptr[i]:ptr[i+1]], each < i, sorted, distinct
    (``f``: the stream's :func:`footprints`, when the caller has them).

    InputError naming ``where``, the record, its CT, PE and buffer when a record reads a location
    (other than one with a defined initial state) that no earlier record wrote.
    """
    n = len(stream.records)
    if n >= 2**31:  # the sweep keeps its edges' records in 32 bits
        raise InputError(where, f"{n:,} records: the dependency sweep holds at most 2**31 - 1")
    f = footprints(stream) if f is None else f
    key = f.key
    order = np.lexsort((f.write, f.rec, key))
    key = key[order]
    loc = np.cumsum(np.concatenate([[False], key[1:] != key[:-1]]), dtype=np.int64)[: len(key)]  # location run
    del key
    width = int(np.bincount(loc).max()) if len(loc) else 1
    initial = np.isin(f.tag[order] >> 12, _INITIAL)
    cons, prod, bad = _sweep(loc, f.rec[order], f.lo[order], f.hi[order], f.write[order], initial, width)
    del loc, initial
    if bad >= 0:
        i = order[bad]
        rec = int(f.rec[i])
        ct = "the controller" if f.ct[i] == CONTROLLER else f"CT {f.ct[i]} PE {f.pe[i]}"
        op = Opcode(stream.records["op"][rec]).name
        raise InputError(where, f"record {rec} ({op}) reads {buf_name(int(f.tag[i]))} at {ct}, "
                                f"which no earlier record wrote")
    pair = distinct(cons.astype(np.int64) * (n + 1) + prod)
    del cons, prod
    cons, prod = pair // (n + 1), pair % (n + 1)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.add.at(ptr, cons + 1, 1)
    return np.cumsum(ptr), prod.astype(np.int64)
