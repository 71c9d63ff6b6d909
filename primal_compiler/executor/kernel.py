"""The timing recurrence of a replay, compiled with numba.

Records are dispatched by **sequencers**, each in stream order: under
distributed control every CT's sequencer dispatches the records that CT
issues (``ct``) and the controller's sequencer the controller's records;
under central control one sequencer (the NMC) dispatches every record. A
sequencer dispatches one record every ``issue_cycles[s]``; a record that
opens a phase whose program the NMC must reload (:mod:`.control`) waits for
that load, on the NMC's one port. A ``SYNC`` waits
until every earlier record finished and no sequencer dispatches a later
record before it. A record the controller executes itself (``ACT`` at
``CONTROLLER``: embedding lookup, argmax) holds back its sequencer until it
finishes. A record starts at the latest of: its dispatch, the finish of
every record it depends on (:mod:`.deps`: RAW, WAR, WAW), its unit being
free and its CTs being awake (``PG_ON`` finished). It finishes ``busy``
cycles later (plus, under cut-through, its legs' waits in routers). Power
records keep their place in the stream: a ``PG_ON`` or ``PG_OFF`` starts no
earlier than the record before it started (``srpg`` places a wake-up just
ahead of the work it prepares for), and a ``PG_OFF`` also waits for
everything earlier on its CT.

Links follow ``router.link_schedule`` (:mod:`.links`): under cut-through a
transfer starts at once and its heads wait in routers, hop by hop, and the
record finishes ``busy`` cycles after its start plus the largest wait any of
its legs accumulated; in-order, it starts only when every link of its route
is free when its head gets there.

The recurrence is sequential by nature; it runs over plain integer columns
prepared by the vectorized stages, so its cost is one pass over records,
predecessors and (record, link) rows.
"""

from __future__ import annotations

import numpy as np

from primal_compiler.executor.links import BUF_WIDTH, CAL_WIDTH, cut_through_links, in_order_links, reduction_links
from primal_compiler.isa.opcodes import Opcode
from primal_compiler.jit import njit

_SYNC, _PG_ON, _PG_OFF = int(Opcode.SYNC), int(Opcode.PG_ON), int(Opcode.PG_OFF)


@njit(nogil=True)
def schedule(op, busy, unit, pred_ptr, pred, link_ptr, link, link_off, hold_mesh, hold_other, ct_a, ct_b, blocking,
             seq, issue_cycles, reload, num_units, num_links, num_cts, mesh_links, cut_through, hop_cycles, other_cycles,
             buffer_flits, combine):  # pragma: no cover - compiled
    """(dispatch, start, finish, first record touching a gated CT or -1, distinct mesh links and other links per
    record, per link row the cycles its leg's head has waited in routers up to entering that link (the
    accumulated wait, so it never decreases along a leg), and per record
    the link constraint on its start (in-order only): the earlier transfer whose reservation bounds it or
    -1, that bound, and whether the link is a PE-mesh link).

    ``seq[i]`` is the sequencer of record i, ``issue_cycles[s]`` the dispatch interval of sequencer s;
    ``reload[i] > 0``: record i opens a phase whose program the NMC loads first (that many cycles on
    its one port, once the CT's sequencer is done with the previous phase).

    Links ``< mesh_links`` are PE-mesh links; a link listed twice by one record counts once.
    ``cut_through``: ``router.link_schedule = "cut-through"``, else in-order; ``hop_cycles`` and
    ``other_cycles``: head latency of a PE-mesh link and of any other link; ``buffer_flits``: flits of a
    PE-mesh link's input buffer (cut-through); ``combine[i]``: record i is a reduction tree.
    """
    n = len(op)
    dispatch = np.empty(n, dtype=np.int64)
    start = np.empty(n, dtype=np.int64)
    finish = np.empty(n, dtype=np.int64)
    unit_free = np.zeros(num_units, dtype=np.int64)
    link_free = np.zeros(num_links, dtype=np.int64)
    ct_wake = np.zeros(num_cts, dtype=np.int64)
    ct_busy = np.zeros(num_cts, dtype=np.int64)
    gated = np.zeros(num_cts, dtype=np.bool_)
    seen = np.full(num_links, -1, dtype=np.int64)
    counted = np.full(num_links, -1, dtype=np.int64)
    enter = np.zeros(num_links, dtype=np.int64)
    cal = np.zeros((num_links if cut_through else 0, CAL_WIDTH), dtype=np.int64)
    buf = np.zeros((mesh_links if cut_through else 0, BUF_WIDTH), dtype=np.int64)  # PE-mesh links only
    latency = np.array([hop_cycles, other_cycles], dtype=np.int64)
    holder = np.full(num_links, -1, dtype=np.int64)
    slot = np.zeros(num_links, dtype=np.int64)
    widest = 0
    for i in range(n):
        widest = max(widest, link_ptr[i + 1] - link_ptr[i])
    win = (np.empty(widest, dtype=np.int64), np.empty(widest, dtype=np.int64), np.empty(widest, dtype=np.int64))
    wait = np.zeros(len(link), dtype=np.int32)
    hold = np.zeros(2, dtype=np.int64)
    link_by = np.full(n, -1, dtype=np.int64)
    link_bound = np.zeros(n, dtype=np.int64)
    link_mesh = np.zeros(n, dtype=np.bool_)
    n_mesh = np.zeros(n, dtype=np.int64)
    n_other = np.zeros(n, dtype=np.int64)
    seq_free = np.zeros(len(issue_cycles), dtype=np.int64)
    port_free = 0
    floor = 0
    horizon = 0
    bad = -1
    for i in range(n):
        s = seq[i]
        t = max(seq_free[s], floor)
        if reload[i] > 0:
            port_free = max(port_free, seq_free[s]) + reload[i]
            t = max(t, port_free)
        dispatch[i] = t
        seq_free[s] = t + issue_cycles[s]
        o = op[i]
        if o == _SYNC:
            t = max(t, horizon)
            start[i] = t
            finish[i] = t
            floor = t
            seq_free[s] = max(seq_free[s], t + issue_cycles[s])
            continue
        for p in range(pred_ptr[i], pred_ptr[i + 1]):
            t = max(t, finish[pred[p]])
        u = unit[i]
        if u >= 0:
            t = max(t, unit_free[u])
        a = ct_a[i]
        b = ct_b[i]
        if (o == _PG_OFF or o == _PG_ON) and i > 0:
            t = max(t, start[i - 1])
        if o == _PG_OFF:
            t = max(t, ct_busy[a])
            gated[a] = True
        elif o == _PG_ON:
            gated[a] = False
        else:
            for c in (a, b):
                if c >= 0:
                    if gated[c] and bad < 0:
                        bad = i
                    t = max(t, ct_wake[c])
        lo, hi = link_ptr[i], link_ptr[i + 1]
        hold[0] = hold_mesh[i]
        hold[1] = hold_other[i]
        delay = 0
        if cut_through and combine[i]:
            delay = reduction_links(i, t, lo, hi, link, link_off, hold, mesh_links, cal, seen, slot, win, wait)
        elif cut_through:
            delay = cut_through_links(i, t, lo, hi, link, link_off, hold, latency, buffer_flits, mesh_links, cal, buf,
                                      seen, enter, wait)
        else:
            t = in_order_links(i, t, lo, hi, link, link_off, hold, mesh_links, link_free, holder, link_by, link_bound,
                          link_mesh)
        for q in range(lo, hi):  # distinct links, for the energy of each bit crossing them once
            lk = link[q]
            if counted[lk] != i:
                counted[lk] = i
                if lk < mesh_links:
                    n_mesh[i] += 1
                else:
                    n_other[i] += 1
        f = t + busy[i] + delay
        start[i] = t
        finish[i] = f
        if u >= 0:
            unit_free[u] = f
        if o == _PG_ON:
            ct_wake[a] = f
        for c in (a, b):
            if c >= 0:
                ct_busy[c] = max(ct_busy[c], f)
        horizon = max(horizon, f)
        if blocking[i]:
            seq_free[s] = max(seq_free[s], f + issue_cycles[s])
    return dispatch, start, finish, bad, n_mesh, n_other, wait, link_by, link_bound, link_mesh
