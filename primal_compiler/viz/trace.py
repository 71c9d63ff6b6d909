"""Chrome / Perfetto trace-event JSON of a replay (open in ui.perfetto.dev or chrome://tracing).

One process per CT (``pid`` = CT, named "CT n (layer)") plus one for the
controller (``pid`` = num_cts); within a CT one thread per unit class
(RRAM-ACIM, SRAM-DCIM, DMAC/ACT, network, power, other: the opcode
descriptor's ``unit``, :data:`UNIT_TRACK`). A record whose unit is a PE macro
and which names a destination (CONFIG) runs that macro there: issued by the
controller, it shows on the CT it writes. Events are complete events
(``"ph": "X"``, ``ts`` and ``dur`` in microseconds). A thread's events never
overlap: records that overlap in time on one thread merge into one span (the
union of their busy intervals), and when the stream would give more than
``max_events`` spans, spans closer than a gap merge too, the smallest gap that
meets the cap (found by bisection). A span's name is its most frequent opcode
("+" when it merged several opcodes); ``args`` count its records per opcode.
"""

from __future__ import annotations

import json

import numpy as np

from primal_compiler.isa.descriptors import descriptor
from primal_compiler.isa.opcodes import CONTROLLER, NONE16, Opcode
from primal_compiler.viz.data import VizData

MAX_EVENTS = 200_000
UNITS = ("RRAM-ACIM", "SRAM-DCIM", "DMAC/ACT", "network", "power", "other")
UNIT_TRACK = {"rram": "RRAM-ACIM", "sram": "SRAM-DCIM", "dmac": "DMAC/ACT", "router": "network", "power": "power",
              "controller": "other", "none": "other"}
"""The thread (one of ``UNITS``) of each ``Descriptor.unit``."""
_PE_MACROS = ("rram", "sram", "dmac")


def tracks(d: VizData) -> tuple[np.ndarray, np.ndarray]:
    """(pid, tid) of every record: CT (CONFIG: the CT it writes) or the controller, and its unit class;
    KeyError naming an opcode without a descriptor."""
    table = [descriptor(op) for op in Opcode]
    unit = np.array([UNITS.index(UNIT_TRACK[x.unit]) for x in table], dtype=np.int64)
    at_dst = np.array([x.unit in _PE_MACROS and "dst_ct" in x.fields for x in table])
    r = d.stream.records
    ct = r["ct"].astype(np.int64)
    dst = r["dst_ct"].astype(np.int64)
    into_ct = at_dst[r["op"]] & (ct == CONTROLLER) & (dst != NONE16) & (dst != CONTROLLER)
    ct = np.where(into_ct, dst, ct)
    pid = np.where(ct == CONTROLLER, d.num_cts, ct)
    return pid, unit[r["op"]]


def _spans(track, begin, end, gap: int):
    """Group id of each (sorted) item when items of one track closer than ``gap`` merge."""
    big = int(end.max()) + gap + 2
    b, e = begin + track * big, end + track * big
    reach = np.maximum.accumulate(e)
    new = np.ones(len(b), dtype=bool)
    new[1:] = b[1:] > reach[:-1] + gap
    return np.cumsum(new) - 1


def spans(d: VizData, max_events: int = MAX_EVENTS) -> dict:
    """Merged spans: ``pid``, ``tid``, ``begin``/``end`` cycles, ``counts`` (span x opcode), and facts."""
    rp = d.rp
    pid, tid = tracks(d)
    track = pid * len(UNITS) + tid
    start, finish = rp.start.astype(np.int64), np.maximum(rp.finish, rp.start + 1).astype(np.int64)
    order = np.lexsort((start, track))
    track, start, finish = track[order], start[order], finish[order]
    op = d.stream.records["op"][order].astype(np.int64)
    gap, grp = 0, _spans(track, start, finish, 0) if len(op) else np.zeros(0, np.int64)
    if len(grp) and grp[-1] + 1 > max_events:
        lo, hi = 0, int(finish.max()) + 1
        while lo < hi:
            mid = (lo + hi) // 2
            if _spans(track, start, finish, mid)[-1] + 1 <= max_events:
                hi = mid
            else:
                lo = mid + 1
        gap, grp = lo, _spans(track, start, finish, lo)
    n = int(grp[-1]) + 1 if len(grp) else 0
    first = np.flatnonzero(np.r_[True, grp[1:] != grp[:-1]]) if n else np.zeros(0, np.int64)
    nops = len(Opcode)
    return {"pid": track[first] // len(UNITS), "tid": track[first] % len(UNITS), "begin": start[first],
            "end": np.maximum.reduceat(finish, first) if n else first,
            "counts": np.bincount(grp * nops + op, minlength=n * nops).reshape(n, nops),
            "facts": {"records": len(op), "spans": n, "merge_gap_cycles": gap}}


def event_lines(d: VizData, sp: dict) -> list[str]:
    """One JSON text per span (formatted directly: json.dumps of 10^5 dicts would dominate the render time)."""
    counts = sp["counts"]
    n = len(counts)
    if not n:
        return []
    us = 1e6 / d.clock_hz
    names = [o.name for o in Opcode]
    row, col = np.nonzero(counts)
    args: list[list[str]] = [[] for _ in range(n)]
    for r, c, k in zip(row.tolist(), col.tolist(), counts[row, col].tolist()):
        args[r].append(f'"{names[c]}":{k}')
    main = counts.argmax(axis=1).tolist()
    mixed = ((counts > 0).sum(axis=1) > 1).tolist()
    ts = np.round(sp["begin"] * us, 4).tolist()
    dur = np.round(np.maximum((sp["end"] - sp["begin"]) * us, 1e-3), 4).tolist()
    pid, tid = sp["pid"].tolist(), sp["tid"].tolist()
    return [f'{{"name":"{names[main[i]]}{"+" if mixed[i] else ""}","cat":"{UNITS[tid[i]]}","ph":"X",'
            f'"pid":{pid[i]},"tid":{tid[i]},"ts":{ts[i]},"dur":{dur[i]},"args":{{{",".join(args[i])}}}}}'
            for i in range(n)]


def metadata(d: VizData, pids: set[int]) -> list[dict]:
    out = []
    for pid in sorted(pids):
        name = "controller (NMC)" if pid == d.num_cts else f"CT {pid} ({d.layer_name(pid)})"
        out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        for tid, unit in enumerate(UNITS):
            out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": unit}})
    return out


def trace_text(d: VizData, max_events: int = MAX_EVENTS) -> str:
    """The trace file's JSON text: metadata for every CT and the controller, then the spans."""
    sp = spans(d, max_events)
    pids = set(range(d.num_cts + 1))  # every CT gets a track, records or not, and the controller
    head = [json.dumps(m, separators=(",", ":")) for m in metadata(d, pids)]
    other = {"model": d.meta.get("model"), "pipeline": d.meta.get("pipeline"), "clock_hz": d.clock_hz, **sp["facts"]}
    return ('{"traceEvents":[' + ",".join(head + event_lines(d, sp)) + '],"displayTimeUnit":"ns","otherData":'
            + json.dumps(other) + "}")


def trace(d: VizData, max_events: int = MAX_EVENTS) -> dict:
    return json.loads(trace_text(d, max_events))


def render(d: VizData, out, max_events: int = MAX_EVENTS) -> list[str]:
    (out / "trace.json").write_text(trace_text(d, max_events))
    return ["trace.json"]
