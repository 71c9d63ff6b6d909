"""Hop validation: every transfer the stream makes is one the mapping passes costed.

Matrix, LoRA, residual and hand-off legs (every leg not listed below) must
be flows of their CT's template in the mapping (``map_*`` arrays of the
program: the template's flow PEs and the hops the mapping computed for them),
and the hops the executor's route takes must equal the mapping's hops; a
die-to-die leg of those must be a CT pair of the mapping's die-to-die
transfers, with the package hops of the CT grid. Attention and KV legs are checked against
the ``kv-ring`` layout: ``KV_APPEND`` writes a chunk slot of its kind that
``kv-ring`` gave to that router; queries (``QVEC``) go to routers holding K
chunks; scores (``SCORE``) go from a K router to a V router; the
softmax merge (``REDUCE`` into ``OBLK``) starts at V routers. Legs to and from
the controller carry no mapped hops and are not checked. A mismatch raises an
InputError naming the first bad record.
"""

from __future__ import annotations

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.executor.replay import Replay
from primal_compiler.executor.transfers import attention_legs
from primal_compiler.isa.opcodes import CONTROLLER, BufKind, Opcode


def _fail(rp: Replay, where: str, legs: np.ndarray, why: str) -> None:
    tr = rp.transfers
    k = int(legs[0])
    rec = int(tr.rec[k])
    op = Opcode(rp.stream.records["op"][rec]).name
    raise InputError(where, f"hop validation: record {rec} ({op}) leg {tr.src_ct[k]}:{tr.src_pe[k]} -> "
                            f"{tr.dst_ct[k]}:{tr.dst_pe[k]} {why} (and {len(legs) - 1} more legs)")


def _kv_sites(rp: Replay) -> np.ndarray:
    """Sorted keys ``(ct * P + pe) * 2 + kind`` of routers holding K (kind 0) or V (1) chunks."""
    a = rp.arrays
    units = np.arange(len(a["kv_ct"]))
    kind = units % 2
    return np.unique((a["kv_ct"].astype(np.int64) * rp.topo.pes + a["kv_pe"]) * 2 + kind)


def _has(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    pos = np.clip(np.searchsorted(sorted_keys, keys), 0, max(len(sorted_keys) - 1, 0))
    return (sorted_keys[pos] == keys) if len(sorted_keys) else np.zeros(len(keys), dtype=bool)


def validate_hops(rp: Replay, where: str = "program") -> dict[str, int]:
    """Check every leg (see module docstring); returns how many legs each check covered."""
    tr, r, a, P = rp.transfers, rp.stream.records, rp.arrays, rp.topo.pes
    ctl = (tr.src_ct == CONTROLLER) | (tr.dst_ct == CONTROLLER)
    attn = attention_legs(r, tr.rec)
    same = tr.src_ct == tr.dst_ct
    mapped = np.flatnonzero(~ctl & ~attn & same)
    d2d = np.flatnonzero(~ctl & ~attn & ~same)
    # on-CT legs against the CT template's flows
    tpl = a["ct_template"].astype(np.int64)[tr.src_ct[mapped]]
    ptr = a["map_tpl_ptr"]
    fkey = np.repeat(np.arange(len(ptr) - 1), np.diff(ptr)) * P * P + a["map_src_pe"].astype(np.int64) * P + a["map_dst_pe"]
    order = np.argsort(fkey, kind="stable")
    fkey, fhops = fkey[order], a["map_hops"][order]
    lkey = tpl * P * P + tr.src_pe[mapped] * P + tr.dst_pe[mapped]
    pos = np.clip(np.searchsorted(fkey, lkey), 0, len(fkey) - 1)
    found = fkey[pos] == lkey
    if not found.all():
        _fail(rp, where, mapped[~found], "is not a flow the mapping placed in this CT")
    bad = fhops[pos] != tr.routes.mesh_hops[mapped]
    if bad.any():
        _fail(rp, where, mapped[bad], f"takes {tr.routes.mesh_hops[mapped][bad][0]} hops, the mapping costed {fhops[pos][bad][0]}")
    # die-to-die legs against the mapping's CT pairs
    pairs = np.unique(a["map_d2d_src"].astype(np.int64) * 65536 + a["map_d2d_dst"])
    ok = _has(pairs, tr.src_ct[d2d] * 65536 + tr.dst_ct[d2d])
    if not ok.all():
        _fail(rp, where, d2d[~ok], "crosses CTs the mapping never connected")
    sx, sy = rp.topo.ct_xy(tr.src_ct[d2d])
    dx, dy = rp.topo.ct_xy(tr.dst_ct[d2d])
    bad = tr.routes.pkg_hops[d2d] != np.abs(sx - dx) + np.abs(sy - dy)
    if bad.any():
        _fail(rp, where, d2d[bad], "takes a longer package route than the CT grid distance")
    checked_kv = _validate_kv(rp, where, np.flatnonzero(~ctl & attn))
    return {"mapped_legs": len(mapped), "d2d_legs": len(d2d), "kv_legs": checked_kv}


def _validate_kv(rp: Replay, where: str, legs: np.ndarray) -> int:
    tr, r, P = rp.transfers, rp.stream.records, rp.topo.pes
    sites = _kv_sites(rp)
    rec = tr.rec[legs]
    op = r["op"][rec]
    kind = r["dst_buf"][rec].astype(np.int64) >> 12
    at_dst = (tr.dst_ct[legs] * P + tr.dst_pe[legs]) * 2
    at_src = (tr.src_ct[legs] * P + tr.src_pe[legs]) * 2
    rules = [
        ((op == Opcode.KV_APPEND) & (kind == BufKind.KV_K), at_dst, "appends K to a router without K chunks"),
        ((op == Opcode.KV_APPEND) & (kind == BufKind.KV_V), at_dst + 1, "appends V to a router without V chunks"),
        (kind == BufKind.QVEC, at_dst, "sends a query to a router without K chunks"),
        (kind == BufKind.SCORE, at_src, "sends scores from a router without K chunks"),
        (kind == BufKind.SCORE, at_dst + 1, "sends scores to a router without V chunks"),
        (kind == BufKind.OBLK, at_src + 1, "merges attention from a router without V chunks"),
    ]
    for sel, key, why in rules:
        bad = sel & ~_has(sites, key)
        if bad.any():
            _fail(rp, where, legs[bad], why)
    return len(legs)
