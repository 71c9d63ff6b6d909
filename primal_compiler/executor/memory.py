"""Scratchpad occupancy over the replay: every buffer instance's bytes, when it is live, and each PE's peak.

Buffer instances and their bytes are :mod:`.buffers`' (a location within one
pass: buffers are transient, a pass's controller ARGMAX ends them;
``docs/executor.md``, Memory). An instance is live from the start of the
first record that writes it to the finish of the last record that touches
it, in the replay's time. A PE's occupancy at any moment is the KV chunks the
kv-ring allocated on it (for the whole context, all the time) plus every live
instance there; its peak is compared with ``router.scratchpad_bytes``.

The independent check is the functional replay: on every fixture family the
element count of every instance equals the shape of the array the functional
machine held for that location in that pass (``tests/executor/test_memory.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, TYPE_CHECKING

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.executor.allocation import Allocation
from primal_compiler.executor.buffers import Instances, kv_bytes, pe_keys
from primal_compiler.ir.precision import Precision
from primal_compiler.isa.opcodes import Opcode, buf_name

if TYPE_CHECKING:
    from primal_compiler.isa.stream import Stream

PHASES = ("prefill", "decode")
"""The stream phases whose peak occupancy a replay reports on its own."""


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
        return pe_keys(self.inst_loc, self.pes)

    @property
    def pes_over(self) -> int:
        return int((self.peak_bytes > self.capacity_bytes).sum())

    def live_at(self, pe_key: int, cycle: int) -> np.ndarray:
        """Instances live on PE ``pe_key`` at ``cycle``, largest first."""
        at = (self.inst_loc >> 16) == ((pe_key // self.pes) << 16 | pe_key % self.pes)
        live = np.flatnonzero(at & (self.inst_begin <= cycle) & (self.inst_end > cycle))
        return live[np.argsort(-self.inst_bytes[live], kind="stable")]


def precision(meta: dict) -> dict:
    """The widths of a program's model (``model_ir.precision``; a hand-written stream has none) as
    :class:`~.buffers.Sizing` reads them, absent widths at their defaults (the loader's reading)."""
    return asdict(Precision(**meta["model_ir"]["precision"]))


def program_kv_bytes(meta: dict, arrays: dict, pes: int, num: int) -> np.ndarray:
    """KV bytes on each PE from a program file's KV map (none without one)."""
    kv = meta.get("kv") or {}
    if "kv_ct" not in arrays or not kv:
        return np.zeros(num, dtype=np.int64)
    chunk = int(kv["chunk_tokens"]) * int(kv["head_dim"]) * int(kv["kv_bytes"])
    return kv_bytes(chunk, arrays["kv_ct"], arrays["kv_pe"], pes, num)


def occupancy(stream: Stream, inst: Instances, start: np.ndarray, finish: np.ndarray, ctx, meta: dict,
              arrays: dict) -> Memory:
    """Every buffer instance's bytes and lifetime, and every PE's peak occupancy (see the module docstring), of the
    stream's :func:`.buffers.instances` ``inst`` (sized by a :class:`.buffers.Sizing` with :func:`precision`)."""
    pes, num = ctx.topo.pes, ctx.topo.num_cts * ctx.topo.pes
    rec, wr, cut = inst.rec, inst.write, inst.cut
    never = np.iinfo(np.int64).max
    begin = _per(np.minimum, np.where(wr, start[rec], never), cut)
    first = _per(np.minimum, np.where(wr, rec, never), cut)
    end = _per(np.maximum, finish[rec], cut)
    written = first < never
    size = inst.bytes
    pe_key = pe_keys(inst.loc, pes)
    kv = program_kv_bytes(meta, arrays, pes, num)
    sel = np.flatnonzero(written & (size > 0))
    events = _events(pe_key[sel], begin[sel], end[sel], size[sel])
    capacity = ctx.target.router.scratchpad_bytes
    peak, when, over = _sweep(events, kv, num, capacity)
    phases = {}
    phase = _phase_of(stream, first[sel])[events[3]]
    for code, name in enumerate(PHASES):
        mine = phase == code
        p, _, _ = _sweep(tuple(column[mine] for column in events), kv, num, capacity)
        phases[name] = int(p.max()) if len(p) else 0
    overflow = None if over is None else (int(sel[over[0]]), over[1])
    return Memory(capacity, kv, peak, when, phases, inst.loc, size, first, begin, end, overflow, pes)


def _per(ufunc, values: np.ndarray, cut: np.ndarray) -> np.ndarray:
    """``ufunc`` reduced over each run of ``values`` starting at ``cut``."""
    return ufunc.reduceat(values, cut) if len(cut) else np.zeros(0, dtype=np.int64)


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
    """The report's ``memory`` object: capacity, peaks, PEs over capacity, the worst PE's largest buffers, and
    the compiler's allocation (:mod:`.allocation`: its largest PE, its PEs over capacity)."""
    worst = int(np.argmax(mem.peak_bytes)) if len(mem.peak_bytes) else 0
    out: dict[str, Any] = {"capacity_bytes": mem.capacity_bytes, "peak_bytes": int(mem.peak_bytes.max(initial=0)),
           "peak_prefill_bytes": mem.phase_peak.get("prefill", 0), "peak_decode_bytes": mem.phase_peak.get("decode", 0),
           "kv_bytes_max": int(mem.kv_bytes.max(initial=0)), "pes_over_capacity": mem.pes_over,
           "fits": mem.overflow is None}
    alloc = Allocation.of(mem.inst_loc, mem.inst_bytes, mem.kv_bytes, mem.pes, mem.capacity_bytes)
    out["allocated_bytes"], out["allocated_pes_over"] = alloc.peak_bytes, alloc.pes_over
    live = mem.live_at(worst, int(mem.peak_cycle[worst]))[:3]
    if len(live):
        out["worst"] = {"ct": worst // mem.pes, "pe": worst % mem.pes, "bytes": int(mem.peak_bytes[worst]),
                        "largest": [{"buffer": buf_name(int(mem.inst_loc[j] & 0xFFFF)), "bytes": int(mem.inst_bytes[j]),
                                     "record": int(mem.inst_first[j]),
                                     "op": Opcode(records["op"][mem.inst_first[j]]).name} for j in live]}
    return out
