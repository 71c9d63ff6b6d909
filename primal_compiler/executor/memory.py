"""Scratchpad occupancy over the replay: every buffer's bytes, when it is live, and each PE's peak.

A **buffer instance** is a scratchpad location (CT, PE, buffer tag) within
one pass: buffers are transient, a pass's controller ARGMAX ends them
(``docs/executor.md``, Memory). Its elements are the largest element end
any record's footprint reaches there (``isa/descriptors.py`` gives where an
access starts; :func:`access_elements` how many elements it covers, from the
record's own fields). Its bytes are elements times the storage width of its
kind (:data:`STORAGE_BITS`). It is live from the start of the first record
that writes it to the finish of the last record that touches it, in the
replay's time. A PE's occupancy at any moment is the KV chunks the kv-ring
allocated on it (for the whole context, all the time) plus every live
instance there; its peak is compared with ``router.scratchpad_bytes``.
Controller buffers, SRAM weight slots and the mask register are not
scratchpad bytes and are not counted.

The independent check is the functional replay: on every fixture family the
element count of every instance equals the shape of the array the functional
machine held for that location in that pass (``tests/executor/test_memory.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, TYPE_CHECKING

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.executor.deps import Footprints
from primal_compiler.ir.model import Precision
from primal_compiler.isa.descriptors import END
from primal_compiler.isa.opcodes import CONTROLLER, BufKind, Opcode, ReduceOp, buf_name, step_ends

if TYPE_CHECKING:
    from primal_compiler.isa.stream import Stream

PHASES = ("prefill", "decode")
"""The stream phases whose peak occupancy a replay reports on its own."""

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
kv-ring's allocation)."""


@dataclass(frozen=True, eq=False)
class Memory:
    """Occupancy of every PE's scratchpad (arrays indexed ``ct * pes + pe``)."""

    capacity_bytes: int
    kv_bytes: np.ndarray  # int64 KV chunks allocated on each PE
    peak_bytes: np.ndarray  # int64 largest occupancy of each PE over the whole replay, KV included
    peak_cycle: np.ndarray  # int64 when it was first reached (0 for a PE holding only KV)
    phase_peak: dict[str, int]  # largest occupancy over PEs of the instances each phase (prefill, decode) starts
    inst_loc: np.ndarray  # int64 location key of each buffer instance
    inst_bytes: np.ndarray  # int64
    inst_first: np.ndarray  # int64 first record writing it
    inst_begin: np.ndarray  # int64 cycles
    inst_end: np.ndarray
    overflow: tuple[int, int] | None  # (instance, occupancy) of the earliest write that overflows, if any
    pes: int

    @property
    def inst_pe(self) -> np.ndarray:
        """The PE (``ct * pes + pe``) of each buffer instance."""
        return _pe_keys(self.inst_loc, self.pes)

    @property
    def pes_over(self) -> int:
        return int((self.peak_bytes > self.capacity_bytes).sum())

    def live_at(self, pe_key: int, cycle: int) -> np.ndarray:
        """Instances live on PE ``pe_key`` at ``cycle``, largest first."""
        at = (self.inst_loc >> 16) == ((pe_key // self.pes) << 16 | pe_key % self.pes)
        live = np.flatnonzero(at & (self.inst_begin <= cycle) & (self.inst_end > cycle))
        return live[np.argsort(-self.inst_bytes[live], kind="stable")]


def _widths(precision: dict, dmac_bits: int) -> np.ndarray:
    """Storage bytes per element of each buffer kind (0: not a scratchpad buffer)."""
    out = np.zeros(16, dtype=np.int64)
    for kind, field in STORAGE_BITS.items():
        bits = dmac_bits if field == "dmac_bits" else int(precision[field])
        out[int(kind)] = -(-bits // 8)
    return out


def access_elements(records: np.ndarray, f: Footprints, ctx, precision: dict) -> np.ndarray:
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
    act, psum = int(precision["activation_bits"]) / 8, int(precision["psum_bits"]) / 8
    dmac, kv = ctx.target.router.dmac_bits / 8, int(precision["kv_bits"]) / 8
    width = np.full(len(op), act)
    width[op == Opcode.KV_APPEND] = kv
    red = op == Opcode.REDUCE
    width[red & ((arg & 0xF) == ReduceOp.SUM)] = psum
    width[red & ((arg & 0xF) == ReduceOp.SOFTMAX_MERGE)] = dmac
    width[(op == Opcode.UNICAST) & (kind == BufKind.SCORE)] = kv
    out = np.zeros(len(op), dtype=np.int64)
    router = np.isin(op, (Opcode.BCAST, Opcode.UNICAST, Opcode.REDUCE, Opcode.KV_APPEND))
    out[router] = np.round(nbytes[router] / width[router]).astype(np.int64)
    out[op == Opcode.ACT] = count[op == Opcode.ACT]
    key = f.ct * ctx.topo.pes + np.where(f.ct == CONTROLLER, 0, f.pe)
    for smac, rows, cols in ((Opcode.SMAC_RRAM, ctx.rram_rows, ctx.rram_cols),
                             (Opcode.SMAC_SRAM, ctx.sram_rows, ctx.sram_cols)):
        sel = np.flatnonzero(op == smac)
        shape = np.where(f.write[sel], cols[key[sel]], rows[key[sel]])
        out[sel] = count[sel] * shape
    return out


def _pe_keys(loc: np.ndarray, pes: int) -> np.ndarray:
    """``ct * pes + pe`` of footprint location keys (``ct << 32 | pe << 16 | tag``)."""
    return (loc >> 32) * pes + ((loc >> 16) & 0xFFFF)


def occupancy(stream: Stream, f: Footprints, start: np.ndarray, finish: np.ndarray, ctx, meta: dict, arrays: dict) -> Memory:
    """Every buffer instance's bytes and lifetime, and every PE's peak occupancy (see the module docstring)."""
    records = stream.records
    pes, num = ctx.topo.pes, ctx.topo.num_cts * ctx.topo.pes
    precision = asdict(Precision(**meta["model_ir"]["precision"]))  # the loader's reading: absent widths default
    widths = _widths(precision, ctx.target.router.dmac_bits)
    kind = f.tag >> 12
    keep = (f.ct != CONTROLLER) & (f.tag < 0xF000)  # a pseudo-buffer's kind is 15
    keep &= widths[kind] > 0
    rows = np.flatnonzero(keep)
    elements = access_elements(records, _take(f, rows), ctx, precision)
    lo = f.lo[rows]
    end_el = np.where(lo >= END, 0, lo + elements)
    passes = np.concatenate([[0], np.cumsum(step_ends(records))[:-1]]).astype(np.int64)
    rec, loc = f.rec[rows], f.key[rows]
    order = np.lexsort((passes[rec], loc))  # instances contiguous: by location, then pass
    rec, loc, end_el, wr = rec[order], loc[order], end_el[order], f.write[rows][order]
    pas = passes[rec]
    cut = np.flatnonzero(np.concatenate([[True], (loc[1:] != loc[:-1]) | (pas[1:] != pas[:-1])]))
    never = np.iinfo(np.int64).max
    size = _per(np.maximum, end_el, cut) * widths[(loc[cut] & 0xFFFF) >> 12]
    begin = _per(np.minimum, np.where(wr, start[rec], never), cut)
    first = _per(np.minimum, np.where(wr, rec, never), cut)
    end = _per(np.maximum, finish[rec], cut)
    written = first < never
    inst_loc = loc[cut]
    pe_key = _pe_keys(inst_loc, pes)
    kv_bytes = _kv_bytes(meta, arrays, pes, num)
    sel = np.flatnonzero(written & (size > 0))
    events = _events(pe_key[sel], begin[sel], end[sel], size[sel])
    capacity = ctx.target.router.scratchpad_bytes
    peak, when, over = _sweep(events, kv_bytes, num, capacity)
    phases = {}
    phase = _phase_of(stream, first[sel])[events[3]]
    for code, name in enumerate(PHASES):
        mine = phase == code
        p, _, _ = _sweep(tuple(column[mine] for column in events), kv_bytes, num, capacity)
        phases[name] = int(p.max()) if len(p) else 0
    overflow = None if over is None else (int(sel[over[0]]), over[1])
    return Memory(ctx.target.router.scratchpad_bytes, kv_bytes, peak, when, phases, inst_loc, size, first, begin, end,
                  overflow, pes)


def _per(ufunc, values: np.ndarray, cut: np.ndarray) -> np.ndarray:
    """``ufunc`` reduced over each run of ``values`` starting at ``cut``."""
    return ufunc.reduceat(values, cut) if len(cut) else np.zeros(0, dtype=np.int64)


def _take(f: Footprints, rows: np.ndarray) -> Footprints:
    return Footprints(*(getattr(f, k)[rows] for k in ("rec", "ct", "pe", "tag", "lo", "hi", "write")))


def _kv_bytes(meta: dict, arrays: dict, pes: int, num: int) -> np.ndarray:
    out = np.zeros(num, dtype=np.int64)
    kv = meta.get("kv") or {}
    if "kv_ct" in arrays and kv:
        chunk = int(kv["chunk_tokens"]) * int(kv["head_dim"]) * int(kv["kv_bytes"])
        np.add.at(out, arrays["kv_ct"].astype(np.int64) * pes + arrays["kv_pe"].astype(np.int64), chunk)
    return out


def _phase_of(stream: Stream, rec: np.ndarray) -> np.ndarray:
    """The index in :data:`PHASES` of the section kind of records ``rec`` (-1: another kind, or no section)."""
    secs = sorted(stream.sections, key=lambda s: s.start)
    if not secs:
        return np.full(len(rec), -1, dtype=np.int8)
    starts, stops = np.array([s.start for s in secs]), np.array([s.stop for s in secs])
    kinds = np.array([PHASES.index(k) if k in PHASES else -1 for k in (s.name.split(":")[0] for s in secs)] + [-1],
                     dtype=np.int8)
    i = np.searchsorted(starts, rec, side="right") - 1
    inside = (i >= 0) & (rec < stops[np.maximum(i, 0)])
    return kinds[np.where(inside, i, -1)]


def _events(pe, begin, end, size) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(PE, cycle, bytes, instance) of every allocation (+size at ``begin``) and free (-size at ``end``), sorted
    by PE, then cycle, frees before allocations at the same cycle: sorted once, the sweeps of a subset of
    the instances take its rows in this order."""
    m = len(pe)
    t = np.concatenate([begin, end])
    delta = np.concatenate([size, -size])
    who = np.concatenate([np.arange(m), np.arange(m)])
    p = np.concatenate([pe, pe])
    span = int(t.max(initial=0)) + 1
    if m and min(int(t.min()), int(p.min())) >= 0 and int(p.max()) < np.iinfo(np.int64).max // span:
        order = np.lexsort((delta, p.astype(np.int64) * span + t.astype(np.int64)))  # (PE, cycle) in one key
    else:
        order = np.lexsort((delta, t, p))
    return p[order], t[order], delta[order], who[order]


def _sweep(events, kv_bytes, num, capacity):
    """(peak occupancy per PE, the cycle it is first reached, (instance, occupancy) of the earliest allocation
    that exceeds ``capacity`` or None) over :func:`_events` rows."""
    p, t, delta, who = events
    peak, when = kv_bytes.copy(), np.zeros(num, dtype=np.int64)
    if not len(p):
        return peak, when, None
    run = np.cumsum(delta)
    starts = np.flatnonzero(np.concatenate([[True], p[1:] != p[:-1]]))
    base = np.repeat(run[starts] - delta[starts], np.diff(np.concatenate([starts, [len(p)]])))
    level = run - base + kv_bytes[p]
    peak[p[starts]] = np.maximum(peak[p[starts]], np.maximum.reduceat(level, starts))  # p sorted: one run per PE
    top = np.flatnonzero(level == peak[p])
    top = top[np.concatenate([[True], p[top][1:] != p[top][:-1]])]  # the first time each PE reaches its peak
    when[p[top]] = t[top]
    bad = np.flatnonzero((level > capacity) & (delta > 0))
    if not len(bad):
        return peak, when, None
    i = bad[np.argmin(t[bad])]
    return peak, when, (int(who[i]), int(level[i]))


def check(mem: Memory, records: np.ndarray, where: str) -> None:
    """InputError naming the record, CT, PE and buffer of the earliest write that overflows a scratchpad."""
    if mem.overflow is None:
        return
    i, level = mem.overflow
    loc, rec = int(mem.inst_loc[i]), int(mem.inst_first[i])
    ct, pe, tag = loc >> 32, (loc >> 16) & 0xFFFF, loc & 0xFFFF
    op = Opcode(records["op"][rec]).name
    kv = int(mem.kv_bytes[ct * mem.pes + pe])
    raise InputError(where, f"record {rec} ({op}) writes {buf_name(tag)} ({int(mem.inst_bytes[i]):,} B) at CT {ct} "
                            f"PE {pe}: its scratchpad then holds {level:,} B ({kv:,} B of KV) of "
                            f"{mem.capacity_bytes:,} B")


def summary(mem: Memory, records: np.ndarray) -> dict:
    """The report's ``memory`` object: capacity, peaks, PEs over capacity and the worst PE's largest buffers."""
    worst = int(np.argmax(mem.peak_bytes)) if len(mem.peak_bytes) else 0
    out: dict[str, Any] = {"capacity_bytes": mem.capacity_bytes, "peak_bytes": int(mem.peak_bytes.max(initial=0)),
           "peak_prefill_bytes": mem.phase_peak.get("prefill", 0), "peak_decode_bytes": mem.phase_peak.get("decode", 0),
           "kv_bytes_max": int(mem.kv_bytes.max(initial=0)), "pes_over_capacity": mem.pes_over,
           "fits": mem.overflow is None}
    live = mem.live_at(worst, int(mem.peak_cycle[worst]))[:3]
    if len(live):
        out["worst"] = {"ct": worst // mem.pes, "pe": worst % mem.pes, "bytes": int(mem.peak_bytes[worst]),
                        "largest": [{"buffer": buf_name(int(mem.inst_loc[j] & 0xFFFF)), "bytes": int(mem.inst_bytes[j]),
                                     "record": int(mem.inst_first[j]),
                                     "op": Opcode(records["op"][mem.inst_first[j]]).name} for j in live]}
    return out
