"""Read-after-write dependencies of a stream, as a CSR list of predecessors per record.

A location is (CT, PE, buffer tag); the controller is one location set
(CONTROLLER, 0, tag). Reads: ``src_buf`` at the source (``REDUCE``: at every
member), the SRAM slot a ``SMAC_SRAM`` fires, the K or V chunk a ``DMAC``
reads (``arg`` bits 8-31), and the destination of an ``ACCUMULATE`` record.
Writes: ``dst_buf`` at the destination (``BCAST``: at every member; compute
records: at their own PE; ``CONFIG``: the SRAM slot). A record depends on the
last earlier record that wrote any location it reads.
"""

from __future__ import annotations

import numpy as np

from primal_compiler.executor.transfers import group_members
from primal_compiler.isa.opcodes import CONTROLLER, NONE16, BufKind, DmacOp, Flag, Opcode, buf

_AT_SELF = (Opcode.SMAC_RRAM, Opcode.SMAC_SRAM, Opcode.DMAC, Opcode.ACT)
_AT_DST = (Opcode.REDUCE, Opcode.UNICAST, Opcode.KV_APPEND, Opcode.CONFIG)
_READ_SRC = (Opcode.BCAST, Opcode.UNICAST, Opcode.KV_APPEND) + _AT_SELF


def _key(ct, pe, tag) -> np.ndarray:
    ct = np.asarray(ct, dtype=np.int64)
    pe = np.where(ct == CONTROLLER, 0, np.asarray(pe, dtype=np.int64))
    return (ct << 32) | (pe << 16) | np.asarray(tag, dtype=np.int64)


def accesses(stream) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((read record, read key), (write record, write key)) of every record."""
    r = stream.records
    op = r["op"]
    reads, writes = [], []
    has_src = r["src_buf"] != NONE16
    rec = np.flatnonzero(np.isin(op, _READ_SRC) & has_src)
    reads.append((rec, _key(r["ct"][rec], r["pe"][rec], r["src_buf"][rec])))
    red = np.flatnonzero((op == Opcode.REDUCE) & has_src)
    which, mct, mpe = group_members(stream, red)
    reads.append((which, _key(mct, mpe, r["src_buf"][which])))
    rec = np.flatnonzero(op == Opcode.SMAC_SRAM)
    reads.append((rec, _key(r["ct"][rec], r["pe"][rec], buf(BufKind.SRAM, 0) + (r["arg"][rec] & 0xFFF))))
    rec = np.flatnonzero(op == Opcode.DMAC)
    kind = np.where((r["arg"][rec] & 0xFF) == DmacOp.QK, BufKind.KV_K, BufKind.KV_V).astype(np.int64)
    reads.append((rec, _key(r["ct"][rec], r["pe"][rec], (kind << 12) | ((r["arg"][rec] >> 8) & 0xFFF))))
    acc = (r["flags"] & Flag.ACCUMULATE) != 0
    rec = np.flatnonzero(acc & np.isin(op, _AT_DST) & (r["dst_buf"] != NONE16))
    reads.append((rec, _key(r["dst_ct"][rec], r["dst_pe"][rec], r["dst_buf"][rec])))
    rec = np.flatnonzero(acc & np.isin(op, _AT_SELF) & (r["dst_buf"] != NONE16))
    reads.append((rec, _key(r["ct"][rec], r["pe"][rec], r["dst_buf"][rec])))
    has_dst = r["dst_buf"] != NONE16
    rec = np.flatnonzero(np.isin(op, _AT_SELF) & has_dst)
    writes.append((rec, _key(r["ct"][rec], r["pe"][rec], r["dst_buf"][rec])))
    rec = np.flatnonzero(np.isin(op, _AT_DST) & has_dst)
    writes.append((rec, _key(r["dst_ct"][rec], r["dst_pe"][rec], r["dst_buf"][rec])))
    bc = np.flatnonzero((op == Opcode.BCAST) & has_dst)
    which, mct, mpe = group_members(stream, bc)
    writes.append((which, _key(mct, mpe, r["dst_buf"][which])))
    cat = lambda parts: tuple(np.concatenate([p[i] for p in parts]).astype(np.int64) for i in (0, 1))  # noqa: E731
    return cat(reads), cat(writes)


def predecessors(stream) -> tuple[np.ndarray, np.ndarray]:
    """(ptr, pred): predecessors of record i are pred[ptr[i]:ptr[i+1]], each < i."""
    n = len(stream.records)
    (r_rec, r_key), (w_rec, w_key) = accesses(stream)
    _, inv = np.unique(np.concatenate([r_key, w_key]), return_inverse=True)
    r_id, w_id = inv[: len(r_key)], inv[len(r_key):]
    w_comb = w_id * (n + 1) + w_rec
    order = np.argsort(w_comb, kind="stable")
    w_comb, w_rec = w_comb[order], w_rec[order]
    pos = np.searchsorted(w_comb, r_id * (n + 1) + r_rec, side="left") - 1
    ok = pos >= 0
    ok[ok] = w_comb[pos[ok]] // (n + 1) == r_id[ok]
    rec, pred = r_rec[ok], w_rec[pos[ok]]
    order = np.lexsort((pred, rec))
    rec, pred = rec[order], pred[order]
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.add.at(ptr, rec + 1, 1)
    return np.cumsum(ptr), pred
