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
free, its CTs being awake (``PG_ON`` finished), and each link it uses being
free when its head reaches it (links serve transfers in stream order, so two
transfers sharing a link in the same interval serialize). It finishes
``busy`` cycles later. Power records keep their place in the stream: a
``PG_ON`` or ``PG_OFF`` starts no earlier than the record before it started
(``srpg`` places a wake-up just ahead of the work it prepares for), and a
``PG_OFF`` also waits for everything earlier on its CT.

The recurrence is sequential by nature; it runs over plain integer columns
prepared by the vectorized stages, so its cost is one pass over records,
predecessors and (record, link) rows.
"""

from __future__ import annotations

import numpy as np

from primal_compiler.isa.opcodes import Opcode
from primal_compiler.jit import njit

_SYNC, _PG_ON, _PG_OFF = int(Opcode.SYNC), int(Opcode.PG_ON), int(Opcode.PG_OFF)


@njit(nogil=True)
def schedule(op, busy, unit, pred_ptr, pred, link_ptr, link, link_off, hold_mesh, hold_other, ct_a, ct_b, blocking,
             seq, issue_cycles, reload, num_units, num_links, num_cts, mesh_links):  # pragma: no cover - compiled
    """(dispatch, start, finish, first record touching a gated CT or -1, distinct mesh links and other links per record).

    ``seq[i]`` is the sequencer of record i, ``issue_cycles[s]`` the dispatch interval of sequencer s;
    ``reload[i] > 0``: record i opens a phase whose program the NMC loads first (that many cycles on
    its one port, once the CT's sequencer is done with the previous phase).

    Links ``< mesh_links`` are PE-mesh links; a link listed twice by one record counts once.
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
        for q in range(link_ptr[i], link_ptr[i + 1]):
            t = max(t, link_free[link[q]] - link_off[q])
        f = t + busy[i]
        start[i] = t
        finish[i] = f
        if u >= 0:
            unit_free[u] = f
        for q in range(link_ptr[i], link_ptr[i + 1]):
            lk = link[q]
            hold = hold_mesh[i] if lk < mesh_links else hold_other[i]
            link_free[lk] = max(link_free[lk], t + link_off[q] + hold)
            if seen[lk] != i:
                seen[lk] = i
                if lk < mesh_links:
                    n_mesh[i] += 1
                else:
                    n_other[i] += 1
        if o == _PG_ON:
            ct_wake[a] = f
        for c in (a, b):
            if c >= 0:
                ct_busy[c] = max(ct_busy[c], f)
        horizon = max(horizon, f)
        if blocking[i]:
            seq_free[s] = max(seq_free[s], f + issue_cycles[s])
    return dispatch, start, finish, bad, n_mesh, n_other
