"""Selective power gating (SRPG) and pipelined LoRA reconfiguration on an instruction stream.

A stream starts with every CT powered. :func:`touches` lists which CTs each
record needs awake (issuer, destination, group members). :func:`gate`
keeps each CT awake only over its *windows*: per phase (a section, or with
``per_step`` each step of it, so CTs are re-gated between the tokens of a
generation) and per layer of the records that touch it, from the start of the previous layer's records (the
wake-up lead, so a CT wakes while its predecessor computes) to its last
touch; overlapping windows merge. It gates every CT at the start of the
stream and inserts PG_ON before and PG_OFF after each window. Gated CTs keep
SRAM weights and scratchpads (the KV cache). :func:`pipeline_configs` moves
the CONFIG and MASK records of layer n >= 1 from a request's adapter section
to just after the first record of layer n - 1 in its prefill, so only layer
0's adapter load stays ahead of the barrier; a program that rewrites its LoRA
weights at every pass (codegen's ``lora_residency = per-token``) gets each
pass's writes pipelined the same way within the pass, its barrier dropped.
"""

from __future__ import annotations

import numpy as np

from primal_compiler.arrays import distinct
from primal_compiler.isa.opcodes import ALL_PES, CONTROLLER, NONE16, NONE32, REPROGRAM, Opcode, empty, step_ends
from primal_compiler.isa.stream import Section, Stream


def touches(stream: Stream) -> tuple[np.ndarray, np.ndarray]:
    """(record index, CT) pairs, unique, of every CT a record uses."""
    rec = stream.records
    idx = [np.flatnonzero(rec["ct"] != CONTROLLER)]
    cts = [rec["ct"][idx[0]]]
    d = np.flatnonzero((rec["dst_ct"] != NONE16) & (rec["dst_ct"] != CONTROLLER))
    idx.append(d)
    cts.append(rec["dst_ct"][d])
    g_rec = np.flatnonzero(rec["group"] != NONE32)
    g = rec["group"][g_rec].astype(np.int64)
    sizes = stream.group_ptr[g + 1] - stream.group_ptr[g]
    owner = np.repeat(g_rec, sizes)
    first = np.repeat(stream.group_ptr[g] - np.cumsum(np.concatenate([[0], sizes[:-1]])), sizes)
    members = first + np.arange(len(owner))
    idx.append(owner)
    cts.append(stream.group_ct[members])
    pair = distinct(np.concatenate(idx).astype(np.int64) << 16 | np.concatenate(cts).astype(np.int64))
    return pair >> 16, pair & 0xFFFF


def _section_of(stream: Stream) -> np.ndarray:
    sec = np.empty(len(stream), dtype=np.int64)
    for k, s in enumerate(stream.sections):
        sec[s.start : s.stop] = k
    return sec


def phases(stream: Stream, per_step: bool) -> np.ndarray:
    """Phase of every record, numbered in stream order: its section, and with ``per_step`` its step within
    the section (a step ends with the controller ARGMAX of its last pass: one per sequence when codegen
    pipelines a batch, so the passes of one step share a phase)."""
    sec = _section_of(stream)
    if not per_step:
        return sec
    ends = step_ends(stream.records)
    step = np.zeros(len(stream), dtype=np.int64)
    for s in stream.sections:
        mine = ends[s.start : s.stop]
        passes = max(1, len(np.unique(stream.records["dst_buf"][s.start : s.stop][mine])))
        before = np.concatenate([[0], np.cumsum(mine)[:-1]])  # ARGMAXes before each record of the section
        step[s.start : s.stop] = before // passes
    _, dense = np.unique(sec * (int(step.max(initial=0)) + 1) + step, return_inverse=True)
    return dense.astype(np.int64)


def _reorder(stream: Stream, key: np.ndarray, extra: np.ndarray | None = None, extra_key=None) -> Stream:
    """Stream sorted by ``key`` (stable), with ``extra`` records merged in at ``extra_key``; sections follow keys."""
    rec = stream.records
    keys = key.astype(np.float64)
    if extra is not None:
        rec = np.concatenate([rec, extra])
        keys = np.concatenate([keys, extra_key])
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    sections = tuple(
        Section(s.name, int(np.searchsorted(sorted_keys, s.start - 0.6)), int(np.searchsorted(sorted_keys, s.stop - 0.6)))
        for s in stream.sections
    )
    return Stream(rec[order], stream.group_ptr, stream.group_ct, stream.group_pe, sections)


def pipeline_configs(stream: Stream) -> Stream:
    """CONFIG/MASK of layer n >= 1 of each adapter section moved into the prefill after layer n-1 starts; a
    pass's reprogramming (its CONFIGs before a ``REPROGRAM`` barrier) pipelined into the pass the same way,
    its barrier dropped."""
    stream = _pipeline_passes(stream)
    rec = stream.records
    key = np.arange(len(stream), dtype=np.float64)
    by_name = {s.name: s for s in stream.sections}
    for s in stream.sections:
        if not s.name.startswith("adapter:"):
            continue
        pre = by_name.get("prefill:" + s.name.split(":", 1)[1])
        part = rec[s.start : s.stop]
        layer = part["layer"].astype(np.int64)
        move = np.isin(part["op"], (Opcode.CONFIG, Opcode.MASK)) & (layer >= 1) & (layer != NONE16)
        if pre is None or not move.any():
            continue
        layers, first = np.unique(rec["layer"][pre.start : pre.stop].astype(np.int64), return_index=True)
        want = layer[move] - 1
        at = np.minimum(np.searchsorted(layers, want), len(layers) - 1)
        anchor = np.where(layers[at] == want, pre.start + first[at], pre.start)
        key[s.start + np.flatnonzero(move)] = anchor + 0.5
    return _reorder(stream, key)


def _pipeline_passes(stream: Stream) -> Stream:
    """Each pass's CONFIGs of layer n >= 1 moved after the first record of layer n - 1 of the same pass (the
    records after its ``REPROGRAM`` barrier, up to the next), layer 0's left ahead; the barriers dropped."""
    rec = stream.records
    barrier = (rec["op"] == Opcode.SYNC) & (rec["arg"] == REPROGRAM)
    if not barrier.any():
        return stream
    in_adapter = np.zeros(len(stream), dtype=bool)
    for s in stream.sections:
        in_adapter[s.start : s.stop] |= s.name.startswith("adapter:")
    config = (rec["op"] == Opcode.CONFIG) & ~in_adapter
    after = np.cumsum(barrier)  # barriers at or before each record: a pass's records follow its barrier
    pas = after + config  # a pass's CONFIGs precede its barrier
    layer = rec["layer"].astype(np.int64)
    slots = int(layer[layer != NONE16].max(initial=0)) + 2
    body = np.flatnonzero(~config & ~barrier & (layer != NONE16))
    slot, first = np.unique(pas[body] * slots + layer[body], return_index=True)
    cfg = np.flatnonzero(config & (layer >= 1) & (layer != NONE16))
    want = pas[cfg] * slots + layer[cfg] - 1
    at = np.minimum(np.searchsorted(slot, want), max(len(slot) - 1, 0))
    found = (slot[at] == want) if len(slot) else np.zeros(len(cfg), bool)
    key = (np.cumsum(~barrier) - 1).astype(np.float64)  # positions once the barriers are gone
    key[cfg[found]] = key[body[first[at[found]]]] + 0.5
    return _reorder(_without(stream, barrier), key[~barrier])


def _without(stream: Stream, drop: np.ndarray) -> Stream:
    """``stream`` without the records ``drop`` marks (none of them in a multicast group); sections shrink."""
    kept_before = np.concatenate([[0], np.cumsum(~drop)])
    sections = tuple(Section(s.name, int(kept_before[s.start]), int(kept_before[s.stop])) for s in stream.sections)
    return Stream(stream.records[~drop], stream.group_ptr, stream.group_ct, stream.group_pe, sections)


def windows(stream: Stream, num_layers: int, per_step: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Awake windows (CT, first record, last record), merged, sorted by CT then start: per phase
    (:func:`phases`) and layer of the records that touch a CT, from the first record of the phase's
    previous layer."""
    idx, ct = touches(stream)
    rec = stream.records
    sec = phases(stream, per_step)
    layer = rec["layer"].astype(np.int64)
    layer = np.where(layer == NONE16, num_layers + 1, layer)
    slot = sec * (num_layers + 2) + layer
    # first record of each (section, layer): the wake-up lead of the next layer
    slot_first = np.full((int(sec.max(initial=0)) + 1) * (num_layers + 2), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(slot_first, slot, np.arange(len(stream)))
    slot_first[slot_first == np.iinfo(np.int64).max] = -1
    key = ct * (slot.max(initial=0) + 1) + slot[idx]
    uniq, inv = np.unique(key, return_inverse=True)
    lo = np.full(len(uniq), np.iinfo(np.int64).max)
    hi = np.full(len(uniq), -1)
    np.minimum.at(lo, inv, idx)
    np.maximum.at(hi, inv, idx)
    w_ct = uniq // (slot.max(initial=0) + 1)
    w_slot = uniq % (slot.max(initial=0) + 1)
    w_layer, w_sec = w_slot % (num_layers + 2), w_slot // (num_layers + 2)
    starts = np.full(int(sec.max(initial=0)) + 1, len(stream), dtype=np.int64)
    np.minimum.at(starts, sec, np.arange(len(stream)))
    prev = np.where((w_layer >= 1) & (w_layer <= num_layers), slot_first[np.maximum(w_slot - 1, 0)], -1)
    lead = np.where(prev >= 0, prev, np.where(w_layer <= num_layers, starts[w_sec], lo))
    lo = np.minimum(lo, lead)
    return _merge(w_ct, lo, hi)


def _merge(ct: np.ndarray, lo: np.ndarray, hi: np.ndarray):
    order = np.lexsort((lo, ct))
    ct, lo, hi = ct[order], lo[order], hi[order]
    out_ct: list[int] = []
    out_lo: list[int] = []
    out_hi: list[int] = []
    for c, a, b in zip(ct.tolist(), lo.tolist(), hi.tolist()):
        if out_ct and out_ct[-1] == c and a <= out_hi[-1] + 1:
            out_hi[-1] = max(out_hi[-1], b)
        else:
            out_ct.append(c)
            out_lo.append(a)
            out_hi.append(b)
    return np.array(out_ct, np.int64), np.array(out_lo, np.int64), np.array(out_hi, np.int64)


def gate(stream: Stream, num_cts: int, num_layers: int, per_step: bool = True) -> tuple[Stream, dict[str, np.ndarray]]:
    """Stream with PG_OFF/PG_ON around every CT's windows (:func:`windows`), and the schedule in final
    record indices."""
    w_ct, lo, hi = windows(stream, num_layers, per_step)
    n_on = len(w_ct)
    extra = empty(num_cts + 2 * n_on)
    extra["op"][:num_cts] = Opcode.PG_OFF
    extra["ct"][:num_cts] = np.arange(num_cts)
    extra["op"][num_cts : num_cts + n_on] = Opcode.PG_ON
    extra["op"][num_cts + n_on :] = Opcode.PG_OFF
    extra["ct"][num_cts:] = np.concatenate([w_ct, w_ct])
    extra["pe"] = ALL_PES
    extra_key = np.concatenate([np.full(num_cts, -0.5), lo - 0.25, hi + 0.25])
    out = _reorder(stream, np.arange(len(stream), dtype=np.float64), extra, extra_key)
    op, cts = out.records["op"], out.records["ct"].astype(np.int64)
    on = np.flatnonzero(op == Opcode.PG_ON)
    off = np.flatnonzero(op == Opcode.PG_OFF)[num_cts:]
    on, off = on[np.lexsort((on, cts[on]))], off[np.lexsort((off, cts[off]))]
    return out, {"pg_ct": cts[on], "pg_on": on, "pg_off": off}
