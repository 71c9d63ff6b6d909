"""Invariants of an emitted program, checked vectorized; each raises AssertionError naming a record.

- :func:`check_power`: no record touches a CT while it is gated.
- :func:`check_configs`: every fired SMAC_SRAM follows a CONFIG of its PE and SRAM slot (:func:`last_before`: the
  latest earlier record of the same key, which viz's adapter timeline uses too).
- :func:`check_kv_appends`: within a prefill or decode step, no two KV_APPENDs write the same token slot
  (the same piece of it, when a head split over two roots is appended in two).
- :func:`check_kv_map`: every unit has its own (CT, PE, slot) inside the layer's CTs and capacity.
"""

from __future__ import annotations

import numpy as np

from primal_compiler.arrays import distinct, ranges
from primal_compiler.codegen.kvmap import KvMap
from primal_compiler.codegen.power import touches
from primal_compiler.isa.opcodes import ActFn, Flag, Opcode
from primal_compiler.isa.stream import Stream


def check_power(stream: Stream) -> None:
    rec = stream.records
    ev = np.flatnonzero(np.isin(rec["op"], (Opcode.PG_ON, Opcode.PG_OFF)))
    ev_ct = rec["ct"][ev].astype(np.int64)
    ev_on = rec["op"][ev] == Opcode.PG_ON
    idx, ct = touches(stream)
    keep = ~np.isin(rec["op"][idx], (Opcode.PG_ON, Opcode.PG_OFF))
    idx, ct = idx[keep], ct[keep]
    n = len(stream) + 1
    ev_key = ev_ct * n + ev
    order = np.argsort(ev_key)
    ev_key, ev_on, ev_ct = ev_key[order], ev_on[order], ev_ct[order]
    at = np.searchsorted(ev_key, ct * n + idx) - 1
    has = at >= 0
    has[has] = ev_ct[at[has]] == ct[has]
    awake = np.ones(len(idx), dtype=bool)
    awake[has] = ev_on[at[has]]
    if not awake.all():
        k = int(np.flatnonzero(~awake)[0])
        raise AssertionError(f"record {int(idx[k])} ({Opcode(rec['op'][idx[k]]).name}) touches gated CT {int(ct[k])}")


def last_before(keys: np.ndarray, rows: np.ndarray, query_keys: np.ndarray, query_rows: np.ndarray) -> np.ndarray:
    """Per query, the position in ``rows`` of the latest row before the query's own row with the same key; -1
    where none. Rows are record indices, keys int64 (ranked first, so any key and row fit)."""
    _, dense = np.unique(np.concatenate([keys, query_keys]), return_inverse=True)
    n = int(max(rows.max(initial=-1), query_rows.max(initial=-1))) + 2
    own, asked = dense[: len(keys)], dense[len(keys) :]
    order = np.argsort(own * n + rows, kind="stable")
    at = np.searchsorted((own * n + rows)[order], asked * n + query_rows) - 1
    ok = at >= 0
    ok[ok] = own[order[at[ok]]] == asked[ok]
    return np.where(ok, order[np.maximum(at, 0)], -1)


def check_configs(stream: Stream) -> None:
    rec = stream.records
    cfg = np.flatnonzero(rec["op"] == Opcode.CONFIG)
    smac = np.flatnonzero((rec["op"] == Opcode.SMAC_SRAM) & ((rec["flags"] & Flag.SKIPPED) == 0))
    slot = lambda k: rec["arg"][k].astype(np.int64) & 0xFFFF  # noqa: E731
    cfg_key = (rec["dst_ct"][cfg].astype(np.int64) << 16 | rec["dst_pe"][cfg]) << 16 | slot(cfg)
    smac_key = (rec["ct"][smac].astype(np.int64) << 16 | rec["pe"][smac]) << 16 | slot(smac)
    missing = np.flatnonzero(last_before(cfg_key, cfg, smac_key, smac) < 0)
    if len(missing):
        k = int(smac[missing[0]])
        raise AssertionError(f"record {k} SMAC_SRAM at CT {rec['ct'][k]} PE {rec['pe'][k]} slot {rec['arg'][k]} "
                             "runs before a CONFIG of its slot")


def check_kv_appends(stream: Stream) -> None:
    for s in stream.sections:
        if s.name.startswith("adapter:"):
            continue
        section = stream.records[s.start : s.stop]
        ends = np.flatnonzero((section["op"] == Opcode.ACT) & (section["arg"] == ActFn.ARGMAX)) + 1
        for lo, hi in zip(np.concatenate([[0], ends]), np.concatenate([ends, [len(section)]])):
            _check_phase(section[lo:hi], s.name, s.start + int(lo))


def _check_phase(rec: np.ndarray, name: str, start: int) -> None:
    """One prefill or decode step: a later step may overwrite a slot once the ring wraps."""
    a = np.flatnonzero(rec["op"] == Opcode.KV_APPEND)
    tok0 = (rec["arg"][a] & 0xFFFF).astype(np.int64)
    cnt = rec["count"][a].astype(np.int64)
    owner = np.repeat(np.arange(len(a)), cnt)
    tok = ranges(tok0, cnt)
    where = (rec["layer"][a].astype(np.int64) << 48 | rec["dst_ct"][a].astype(np.int64) << 32
             | rec["dst_pe"][a].astype(np.int64) << 16 | rec["dst_buf"][a] >> 12)
    piece = (rec["arg"][a].astype(np.int64) >> 24)  # the head element a piece starts at (a head split over roots)
    key = np.stack([np.repeat(where, cnt), tok * 256 + np.repeat(piece, cnt)], axis=1)
    _, inverse, counts = np.unique(key, axis=0, return_inverse=True, return_counts=True)
    if (counts > 1).any():
        k = int(a[owner[np.flatnonzero(counts[inverse.reshape(-1)] > 1)[0]]])
        raise AssertionError(f"{name}: record {start + k} KV_APPEND overwrites a live token slot")


def check_kv_map(kv: KvMap, layer_cts: list[np.ndarray]) -> None:
    key = kv.ct.astype(np.int64) << 32 | kv.pe.astype(np.int64) << 16 | kv.slot
    if len(distinct(key)) != len(key):
        raise AssertionError("two KV units share a scratchpad slot")
    if (kv.slot >= kv.chunk_slots).any():
        raise AssertionError("a KV unit is beyond its router's chunk slots")
    layer, _ = kv.unit_layers()
    for n, cts in enumerate(layer_cts):
        if not np.isin(kv.ct[layer == n], cts).all():
            raise AssertionError(f"layer {n} has KV units outside its CTs")
