"""The critical path of a replay: the chain of constraints behind a record's finish, and where its time went.

A record starts at the latest of the constraints of the timing recurrence
(:mod:`.kernel`); walking back from a **target** record, every record on the
path is explained by the one constraint that set its start, tried in this
order (the first that holds wins, so the path is deterministic):

1. ``PRED``: a dependency predecessor finished when it started (the highest-numbered such);
2. ``UNIT``: the previous record on its unit finished when it started;
3. its dispatch: the sequencer (below);
4. ``CT_BUSY`` (a ``PG_OFF``): the last earlier record on its CT to finish;
5. ``POWER_ORDER`` (a ``PG_ON``/``PG_OFF``): the record before it in the stream started when it started;
6. ``WAKE``: the ``PG_ON`` of a CT it touches finished when it started;
7. ``LINK``: it waited for an earlier transfer's reservation of a link, the one the schedule
   recorded as binding (:class:`.replay.LinkWait`).

A ``SYNC`` starts at the latest finish before it (``HORIZON``) or else at its
dispatch. A dispatch is set by the sequencer's previous record finishing,
when the controller executed it or it is a ``SYNC`` (``BLOCKING``), else by
the last ``SYNC`` before it (``BARRIER``), else by the sequencer's previous
dispatch plus its issue interval (``SEQUENCER``).

**Attribution.** Each record's own ``[start, finish)`` counts under its
opcode's ``path_class`` (:data:`primal_compiler.isa.descriptors.DESCRIPTORS`;
router records carrying ``Flag.D2D`` count as ``DIE_TO_DIE``). The gaps
count under the constraint that caused them: ``BLOCKING`` and ``SEQUENCER``
gaps (the issue interval, or the wait for the previous dispatch) as
``CONTROL``; a ``LINK`` wait, from the earlier transfer's start to this
record's start, as ``MESH_TRANSFER`` on a PE-mesh link and ``DIE_TO_DIE`` on
a die-to-die or controller link. Under cut-through a transfer waits inside
its own span (its heads held in routers): that part, along its leg that
waited longest, counts by the kind of link each wait was for. A span counts
once: where a link wait overlaps time already explained (a transfer that
reaches the shared link late), only the unexplained part counts.

**Guarantee.** The walk stops at the window's ``begin``; its ``by_class``
cycles are non-negative and sum exactly to ``finish[target] - begin``. A
start no constraint explains (the recurrence and this module disagree) is an
InputError naming the record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.executor import trees
from primal_compiler.executor.ancestry import argmax_records
from primal_compiler.executor.replay import Replay, touched, blocking
from primal_compiler.isa.descriptors import DESCRIPTORS, PathClass
from primal_compiler.isa.opcodes import SHARD_FNS, ActFn, Flag, Opcode
from primal_compiler.jit import njit

_SYNC, _PG_ON, _PG_OFF = int(Opcode.SYNC), int(Opcode.PG_ON), int(Opcode.PG_OFF)
_SELF, _START, _DISPATCH = 0, 1, 2  # walk states: charge the record's own time, explain its start, its dispatch
_MESH, _D2D, _CONTROL = int(PathClass.MESH_TRANSFER), int(PathClass.DIE_TO_DIE), int(PathClass.CONTROL)

CLASS_KEYS = tuple(c.name.lower() for c in PathClass)
"""JSON keys of the classes, in PathClass order."""

LABELS = {"rram_mvm": "RRAM MVM", "sram_mvm": "SRAM MVM", "dmac_attention": "DMAC attention", "reduce": "reduce",
          "activation": "activation", "mesh_transfer": "mesh transfer", "die_to_die": "die-to-die",
          "wakeup": "wake-up", "reconfiguration": "reconfiguration", "control": "issue/control",
          "norm_residual": "norm, residual, argmax"}
"""Text labels of :data:`CLASS_KEYS`."""


class Via(IntEnum):
    """How a record on the path set the start (or dispatch) of the record before it on the path."""

    PRED = 0  # a dependency predecessor: finished at its start
    UNIT = 1  # the previous record on its unit: finished at its start
    BLOCKING = 2  # its sequencer's previous record, a controller ARGMAX/EMBED or a SYNC: held back its dispatch
    BARRIER = 3  # the last SYNC before it: released its dispatch
    SEQUENCER = 4  # its sequencer's previous record: dispatched one issue interval (plus a program reload) before it
    HORIZON = 5  # (it is a SYNC) the latest finish before it
    CT_BUSY = 6  # (it is a PG_OFF) the latest finish on its CT
    POWER_ORDER = 7  # (it is a PG_ON/PG_OFF) the record just before it: started at its start
    WAKE = 8  # the PG_ON of a CT it touches: finished at its start
    LINK = 9  # the earlier transfer it queued behind on a link


_PRED, _UNIT, _BLOCKING, _BARRIER, _SEQUENCER, _HORIZON, _CT_BUSY, _POWER_ORDER, _WAKE, _LINK = (int(v) for v in Via)


@dataclass(frozen=True)
class Path:
    """One walk: ``records[0]`` is the target, ``records[k]`` set the start or dispatch of ``records[k - 1]``
    by constraint ``via[k]`` (``via[0] = -1``); ``by_class[c]`` cycles of ``[begin, end)`` per PathClass."""

    records: np.ndarray  # int64, descending
    via: np.ndarray  # int64 Via
    begin: int
    end: int
    by_class: np.ndarray  # int64 per PathClass, sums to end - begin


@njit(nogil=True)
def _sources(upto, op, unit, seq, nseq, ct_a, ct_b, finish, num_units, num_cts):  # pragma: no cover - compiled
    """Per record below ``upto``, the candidate that set each constraint of the recurrence (-1 none):
    previous record on its sequencer, last SYNC before it, previous record on its unit and the wait record
    (SYNC: latest finish before it; PG_OFF: latest finish on its CT; others: latest PG_ON of its CTs).
    The link constraint comes from the schedule itself (``Replay.link_wait``)."""
    seq_prev = np.full(upto, -1, dtype=np.int64)
    floor_src = np.full(upto, -1, dtype=np.int64)
    unit_src = np.full(upto, -1, dtype=np.int64)
    wait_src = np.full(upto, -1, dtype=np.int64)
    last_seq = np.full(nseq, -1, dtype=np.int64)
    last_unit = np.full(num_units, -1, dtype=np.int64)
    last_on = np.full(num_cts, -1, dtype=np.int64)
    busy_src = np.full(num_cts, -1, dtype=np.int64)
    busy_val = np.zeros(num_cts, dtype=np.int64)
    last_sync = -1
    hz_src = -1
    hz_val = 0
    for i in range(upto):
        s = seq[i]
        seq_prev[i] = last_seq[s]
        last_seq[s] = i
        floor_src[i] = last_sync
        o = op[i]
        if o == _SYNC:
            wait_src[i] = hz_src
            last_sync = i
            continue
        u = unit[i]
        if u >= 0:
            unit_src[i] = last_unit[u]
            last_unit[u] = i
        a = ct_a[i]
        b = ct_b[i]
        if o == _PG_OFF:
            wait_src[i] = busy_src[a]
        elif o != _PG_ON:
            for c in (a, b):
                if c >= 0 and last_on[c] >= 0 and (wait_src[i] < 0 or finish[last_on[c]] > finish[wait_src[i]]):
                    wait_src[i] = last_on[c]
        if o == _PG_ON:
            last_on[a] = i
        f = finish[i]
        for c in (a, b):
            if c >= 0 and f >= busy_val[c]:
                busy_val[c] = f
                busy_src[c] = i
        if f >= hz_val:
            hz_val = f
            hz_src = i
    return seq_prev, floor_src, unit_src, wait_src


@njit(nogil=True)
def _walk(target, begin, op, block, seq, issue, reload, pred_ptr, pred, dispatch, start, finish, cls, seq_prev, floor_src,
          unit_src, wait_src, link_src, link_val, link_mesh, held_mesh, held_other,
          num_classes):  # pragma: no cover - compiled
    """(records, via, cycles per class, the record whose start or dispatch nothing explains or -1)."""
    recs = np.empty(target + 1, dtype=np.int64)
    via = np.empty(target + 1, dtype=np.int64)
    by = np.zeros(num_classes, dtype=np.int64)
    recs[0] = target
    via[0] = -1
    m = 1
    i = target
    state = _SELF
    cursor = finish[target]
    while cursor > begin:
        if state == _SELF:  # its own span; the part its heads waited in routers goes to that link's kind
            new = max(begin, min(cursor, start[i]))
            span = cursor - new
            w_mesh = min(span, held_mesh[i])
            w_other = min(span - w_mesh, held_other[i])
            by[_MESH] += w_mesh
            by[_D2D] += w_other
            by[cls[i]] += span - w_mesh - w_other
            cursor = new
            state = _START
            continue
        nxt, kind, to, gap_from, gap_cls = -1, -1, _SELF, 0, -1
        if state == _START:
            s = start[i]
            o = op[i]
            w = wait_src[i]
            if o == _SYNC:
                if w >= 0 and finish[w] == s:
                    nxt, kind = w, _HORIZON
                elif dispatch[i] == s:
                    state = _DISPATCH
                    continue
            else:
                for p in range(pred_ptr[i], pred_ptr[i + 1]):
                    if finish[pred[p]] == s and pred[p] > nxt:
                        nxt, kind = pred[p], _PRED
                u = unit_src[i]
                power = o == _PG_ON or o == _PG_OFF
                if nxt >= 0:
                    pass
                elif u >= 0 and finish[u] == s:
                    nxt, kind = u, _UNIT
                elif dispatch[i] == s:
                    state = _DISPATCH
                    continue
                elif o == _PG_OFF and w >= 0 and finish[w] == s:
                    nxt, kind = w, _CT_BUSY
                elif power and i > 0 and start[i - 1] == s:
                    nxt, kind, to = i - 1, _POWER_ORDER, _START
                elif not power and w >= 0 and finish[w] == s:
                    nxt, kind = w, _WAKE
                elif link_src[i] >= 0 and link_val[i] == s:
                    nxt, kind, to = link_src[i], _LINK, _START
                    gap_from, gap_cls = start[nxt], _MESH if link_mesh[i] else _D2D
        else:
            d = dispatch[i]
            p = seq_prev[i]
            k = floor_src[i]
            step = issue[seq[i]]
            if p >= 0 and (block[p] or op[p] == _SYNC) and finish[p] + step == d:
                nxt, kind, gap_from, gap_cls = p, _BLOCKING, finish[p], _CONTROL
            elif k >= 0 and start[k] == d:
                nxt, kind = k, _BARRIER
            elif p >= 0 and (dispatch[p] + step == d or (reload[i] > 0 and dispatch[p] + step + reload[i] <= d)):
                nxt, kind, to, gap_from, gap_cls = p, _SEQUENCER, _DISPATCH, dispatch[p], _CONTROL
        if nxt < 0:
            return recs[:m], via[:m], by, i
        if gap_cls >= 0:
            new = max(begin, min(cursor, gap_from))
            by[gap_cls] += cursor - new
            cursor = new
        recs[m] = nxt
        via[m] = kind
        m += 1
        i = nxt
        state = to
    return recs[:m], via[:m], by, -1


def held_in_routers(rp: Replay, upto: int) -> tuple[np.ndarray, np.ndarray]:
    """(cycles waiting before PE-mesh links, before other links) per record below ``upto``, along the leg
    whose heads waited longest to enter its links, plus, on PE-mesh links, what a leg waited at its
    destination to eject beyond that (together the wait the schedule adds to its finish; zero in-order).
    A leg is the path from a row where one ends up its parents (:func:`.trees.legs`) to its root."""
    tr, wait = rp.transfers, rp.link_wait.wait
    rows = int(tr.link_ptr[upto])
    if not rows:
        return np.zeros(upto, np.int64), np.zeros(upto, np.int64)
    wait, link = wait[:rows].astype(np.int64), tr.link[:rows]
    up, ends = trees.legs(tr.link_ptr[: upto + 1], tr.link_offset[:rows], tr.tree_at[:upto], tr.tree)
    rec = np.repeat(np.arange(upto), np.diff(tr.link_ptr[: upto + 1]))
    inc = wait - np.where(up < 0, 0, wait[np.maximum(up, 0)])
    mesh = link < tr.mesh_links
    last = np.flatnonzero(ends)
    order = np.lexsort((wait[last], rec[last]))  # by record, then by the leg's total wait
    r_sorted, l_sorted = rec[last][order], last[order]
    top = np.r_[r_sorted[1:] != r_sorted[:-1], True]  # each record's last: the leg that waited longest
    pick = np.zeros(rows, dtype=bool)
    at = l_sorted[top]
    while len(at):  # up that leg to its root
        pick[at] = True
        at = up[at]
        at = at[at >= 0]
    out = []
    for kind in (mesh, ~mesh):
        out.append(np.bincount(rec[pick & kind], weights=inc[pick & kind], minlength=upto).astype(np.int64))
    entered = np.zeros(upto, dtype=np.int64)
    entered[r_sorted[top]] = wait[l_sorted[top]]
    out[0] += np.maximum(rp.link_wait.ejected[:upto] - entered, 0)  # at a PE-mesh router's input buffer and port
    return out[0], out[1]


NORM_RESIDUAL_FNS = (*SHARD_FNS, ActFn.RESIDUAL_ADD, ActFn.ARGMAX)
"""The ACT functions counted as NORM_RESIDUAL rather than ACTIVATION (the nonlinearities, RoPE, bias, embedding)."""


def record_classes(rp: Replay) -> np.ndarray:
    """int64 PathClass of every record: its opcode's, DIE_TO_DIE for router records flagged D2D, NORM_RESIDUAL
    for an ACT of :data:`NORM_RESIDUAL_FNS`."""
    table = np.zeros(256, dtype=np.int64)
    router = np.zeros(256, dtype=bool)
    for op, d in DESCRIPTORS.items():
        table[int(op)] = int(d.path_class)
        router[int(op)] = d.unit == "router"
    r = rp.stream.records
    cls = table[r["op"]]
    cls[router[r["op"]] & ((r["flags"] & Flag.D2D) != 0)] = int(PathClass.DIE_TO_DIE)
    act = (r["op"] == Opcode.ACT) & np.isin(r["arg"] & 0xFF, NORM_RESIDUAL_FNS)
    cls[act] = int(PathClass.NORM_RESIDUAL)
    return cls


def walks(rp: Replay, windows: Sequence[tuple[int, int]]) -> list[Path]:
    """The critical path of each ``(target record, begin cycle)`` window, explaining ``[begin, finish[target])``.

    InputError when a target is not a record, a begin lies after its target's finish, or the replay
    holds a start no constraint of the recurrence explains.
    """
    n = len(rp.start)
    for target, begin in windows:
        if not 0 <= target < n or begin > rp.finish[target]:
            raise InputError("critical path", f"window (record {target}, begin {begin}) is not within the replay")
    upto = max((t for t, _ in windows), default=-1) + 1
    r, c, lw = rp.stream.records, rp.control, rp.link_wait
    op = r["op"].astype(np.int64)
    a, b = touched(r)
    src = _sources(upto, op, rp.unit, c.seq, len(c.issue_cycles), a, b, rp.finish, rp.ctx.num_units, rp.topo.num_cts)
    src += (lw.by[:upto], lw.bound[:upto], lw.mesh[:upto]) + held_in_routers(rp, upto)
    cls, block = record_classes(rp), blocking(r, c.mode)
    out = []
    for target, begin in windows:
        recs, via, by, bad = _walk(int(target), int(begin), op, block, c.seq, c.issue_cycles, c.reload, rp.pred_ptr,
                                   rp.pred, rp.dispatch, rp.start, rp.finish, cls, *src, len(PathClass))
        if bad >= 0:
            raise InputError("critical path", f"record {bad} ({Opcode(op[bad]).name}) starts at cycle "
                                              f"{rp.start[bad]} (dispatched at {rp.dispatch[bad]}) but no constraint "
                                              f"of the timing recurrence explains it")
        out.append(Path(recs, via, int(begin), int(rp.finish[target]), by))
    return out


def _section(rp: Replay, name: str) -> np.ndarray:
    try:
        return rp.section(name)
    except KeyError:
        return np.zeros(0, dtype=np.int64)


def request_windows(rp: Replay, request: int = 0) -> tuple[tuple[int, int], tuple[int, int], int]:
    """(TTFT window, decode window, decode steps) of ``request``, as ``metrics`` defines TTFT and ITL.

    TTFT: the prefill's last-finishing controller ARGMAX, from the start of the request's first record.
    Decode: the last-finishing decode ARGMAX, from the finish of the prefill ARGMAX of the same pass (the
    one writing the same TOKEN buffer: the batch, or one sequence when pipelined), over that pass's steps.
    KeyError when the request lacks a prefill or decode ending in a controller ARGMAX.
    """
    sink = argmax_records(rp.stream)
    prefill, decode = (_section(rp, f"{k}:{request}") for k in ("prefill", "decode"))
    pre_tok, dec_tok = prefill[sink[prefill]], decode[sink[decode]]
    if not len(pre_tok) or not len(dec_tok):
        raise KeyError(f"request {request}: prefill and decode must each end with a controller ARGMAX")
    first = np.concatenate([_section(rp, f"adapter:{request}"), prefill])
    token, last = (int(t[np.lexsort((t, rp.finish[t]))[-1]]) for t in (pre_tok, dec_tok))
    tag = rp.stream.records["dst_buf"]
    mine = pre_tok[tag[pre_tok] == tag[last]]
    start = int(mine[0]) if len(mine) else token
    steps = int((tag[dec_tok] == tag[last]).sum())
    return (token, int(rp.start[first].min())), (last, int(rp.finish[start])), steps


def _summary(rp: Replay, path: Path, per: int) -> dict:
    by = {k: rp.seconds(int(v)) / per for k, v in zip(CLASS_KEYS, path.by_class)}
    return {"total_s": rp.seconds(path.end - path.begin) / per, "by_class_s": by,
            "records": len(path.records), "bound_by": CLASS_KEYS[int(np.argmax(path.by_class))]}


def last_step(rp: Replay, decode: tuple[int, int]) -> tuple[int, int]:
    """The window of the last decode step of the pass that finishes last: from the finish of that pass's
    previous ARGMAX (its prefill ARGMAX after one step) to its last ARGMAX finish."""
    last, begin = decode
    tag = rp.stream.records["dst_buf"]
    sink = argmax_records(rp.stream)
    mine = np.flatnonzero(sink & (tag == tag[last]) & (rp.finish < rp.finish[last]))
    return last, max(begin, int(rp.finish[mine].max())) if len(mine) else begin


def critical_path(rp: Replay, request: int = 0, generate: int | None = None) -> dict:
    """``{"ttft": ..., "itl": ...}`` of ``request``: each ``total_s``, ``by_class_s`` (summing to it),
    ``records`` on the path and the class ``bound_by`` (largest share). ITL is the decode window of the
    pass that finishes last (from its prefill ARGMAX to its last decode ARGMAX) divided by its ``steps``;
    a generation of ``generate`` tokens past the replayed steps (:mod:`.steady`, which the metrics check)
    adds its last step's path once per repeat, divided by ``generate``. With one pass (batch 1, or
    pipelining off) ITL's ``total_s`` is the metrics' ``itl_s``. ``rp`` must be a full replay, not one read
    from a :class:`~primal_compiler.executor.cache.ReplayCache` (it has no dependency edges)."""
    if rp.from_cache:
        raise ValueError("the critical path needs a full replay; this one was read from the replay cache")
    ttft, decode, steps = request_windows(rp, request)
    repeats = max(0, (generate or steps) - steps)
    paths = walks(rp, [ttft, decode] + ([last_step(rp, decode)] if repeats else []))
    itl = paths[1]
    if repeats:  # each repeat runs the settled step's path again
        settled = paths[2]
        itl = Path(itl.records, itl.via, 0, itl.end - itl.begin + repeats * (settled.end - settled.begin),
                   itl.by_class + repeats * settled.by_class)
    return {"ttft": _summary(rp, paths[0], 1),
            "itl": {**_summary(rp, itl, steps + repeats), "steps": steps + repeats, "replayed_steps": steps}}
