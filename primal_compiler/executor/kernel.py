"""The timing recurrence of a replay, compiled with numba (its cache also follows :mod:`.flow` and :mod:`.linkstate`).

**Dispatch.** Each sequencer dispatches its records in stream order, one every ``issue_cycles[s]``:
under distributed control one per CT (the records that CT issues) plus the controller's; under central
control the NMC alone. A record that opens a phase whose program the NMC must reload
(:mod:`.control`) waits for that load on the NMC's one port. A ``SYNC`` waits until every earlier
record finished, and no sequencer dispatches a later record before it. A record the controller
executes itself (``ACT`` at ``CONTROLLER``) holds back its sequencer until it finishes.

**Start and finish.** A record starts at the latest of its dispatch, the finish of every record it
depends on (:mod:`.deps`), its unit being free and its CTs being awake, and finishes ``busy``
cycles later plus, under cut-through, the largest wait any of its legs accumulated in routers. A
``PG_ON``/``PG_OFF`` starts no earlier than the record before it started; a ``PG_OFF`` also waits
for everything earlier on its CT.

**Links** (``router.link_schedule``). ``"cut-through"`` (the default): a started transfer's legs
move hop by hop as events of :mod:`.flow`, in time order, through links with work-conserving
calendars and FIFO input buffers with credits; a record's finish is its start plus ``busy`` plus the
largest wait a leg accumulated in routers, known once its legs are delivered. The schedule runs the
events only as far as it needs a finish (a dependence, a unit, a blocking record) or, before a
``SYNC``, a ``PG_OFF`` and at the end, until none is left. Heads waiting for one link are served by
``router.arbitration``: ``age`` (``age=True``: the earliest start first, then stream order) or
program order. A reduction reserves its tree's windows when it starts (:func:`.flow.run`, ``REDUCE``).
``"in-order"`` (the executor before cut-through): a transfer starts when every link of its route is
free at the offset its head reaches it, and each link keeps only the end of its latest reservation.
"""

from __future__ import annotations

import numpy as np

from primal_compiler.executor import flow, linkstate, trees
from primal_compiler.executor.flow import run
from primal_compiler.executor.linkstate import BIG_WIDTH, BUF_WIDTH, CAL_WIDTH, DELIVERED, DRY, REDUCE, new_pool, start_legs
from primal_compiler.executor.trees import SPAN
from primal_compiler.isa.opcodes import Opcode
from primal_compiler.jit import njit

_SYNC, _PG_ON, _PG_OFF, _REDUCE = int(Opcode.SYNC), int(Opcode.PG_ON), int(Opcode.PG_OFF), int(Opcode.REDUCE)


@njit(nogil=True, depends=(trees,))
def in_order_links(i, t, lo, hi, link, link_off, span, hold, mesh_links, link_free, holder, link_by, link_bound,
                   link_mesh):  # pragma: no cover - compiled
    """Start of record ``i`` no earlier than ``t`` with every link row ``lo:hi`` free when its head gets
    there, and reserve them (module docstring; ``span``: a reduction's tree rows, each link held until its last
    member's head has passed, :data:`.trees.SPAN` after the first; empty for any other record); records the
    binding link's holder for the critical path."""
    for q in range(lo, hi):
        lk = link[q]
        v = link_free[lk] - link_off[q]
        if holder[lk] >= 0 and (link_by[i] < 0 or v > link_bound[i]):
            link_by[i] = holder[lk]
            link_bound[i] = v
            link_mesh[i] = lk < mesh_links
        t = max(t, v)
    for q in range(lo, hi):
        lk = link[q]
        e = t + link_off[q] + (hold[0] if lk < mesh_links else hold[1]) + (span[q - lo, SPAN] if len(span) else 0)
        if e >= link_free[lk]:
            link_free[lk] = e
            holder[lk] = i
    return t


@njit(nogil=True, depends=(flow, linkstate, trees))
def schedule(op, busy, unit, pred_ptr, pred, link_ptr, link, link_off, tree_at, tree, hold_mesh, hold_other, ct_a, ct_b, blocking,
             seq, issue_cycles, reload, num_units, num_links, num_cts, mesh_links, cut_through, hop_cycles, other_cycles,
             buffer_flits, age, inj, ej, inj_rows, ej_rows, inj_ports, ej_ports):  # pragma: no cover - compiled
    """(dispatch, start, finish, first record touching a gated CT or -1, distinct mesh and other links per
    record, per link row the wait its leg's head has accumulated in routers up to entering that link, and
    per record the in-order link constraint on its start: the earlier transfer whose reservation bounds
    it or -1, that bound, and whether the link is a PE-mesh link).

    ``seq[i]`` is the sequencer of record i, ``issue_cycles[s]`` the dispatch interval of sequencer s;
    ``reload[i] > 0``: record i opens a phase whose program the NMC loads first (that many cycles on
    its one port, once the CT's sequencer is done with the previous phase).

    Links ``< mesh_links`` are PE-mesh links; a link listed twice by one record counts once. ``tree_at``/``tree``:
    the merged legs of :mod:`.trees`, multicast trees and reductions' rows (a record's first tree row, -1 where
    its rows are legs).
    ``cut_through``: ``router.link_schedule = "cut-through"``, else in-order; ``hop_cycles`` and
    ``other_cycles``: head latency of a PE-mesh link and of any other link; ``buffer_flits``: flits of a
    PE-mesh link's input buffer (cut-through); ``age``: ``router.arbitration = "age"``. A ``REDUCE``
    is a reduction tree. ``inj[l]``/``ej[l]``: the first of the ``inj_ports``/``ej_ports`` port rows of
    PE-mesh link l's source and destination PE (:func:`.topology.local_ports`), ``inj_rows``/``ej_rows``
    rows in all (cut-through only). Then the first transfer never delivered (its packets deadlocked in
    the buffers) or -1, and per record the largest wait of a leg that ejects from a PE-mesh link, its
    wait at the destination's input buffer and ejection port included (0 for the others): a record
    finishes at its start plus ``busy`` plus the larger of that and its rows' waits.
    """
    n = len(op)
    dispatch = np.empty(n, dtype=np.int64)
    start = np.empty(n, dtype=np.int64)
    finish = np.empty(n, dtype=np.int64)
    unit_rec = np.full(num_units, -1, dtype=np.int64)  # the latest record on each unit
    link_free = np.zeros(num_links, dtype=np.int64)
    ct_wake = np.zeros(num_cts, dtype=np.int64)
    ct_busy = np.zeros(num_cts, dtype=np.int64)
    gated = np.zeros(num_cts, dtype=np.bool_)
    rows = num_links + inj_rows + ej_rows  # calendars: the links, then the local ports
    seen = np.full(rows, -1, dtype=np.int64)
    counted = np.full(num_links, -1, dtype=np.int64)
    enter = np.zeros(rows, dtype=np.int64)
    # calendars, one after another: every row's CAL_WIDTH columns, a die-to-die or controller link's BIG_WIDTH
    width = np.full(rows if cut_through else 0, CAL_WIDTH, dtype=np.int64)
    width[mesh_links:num_links] = BIG_WIDTH
    cal_at = np.zeros(len(width) + 1, dtype=np.int64)
    cal_at[1:] = np.cumsum(width)
    cal = np.zeros(cal_at[-1], dtype=np.int64)
    buf = np.zeros((mesh_links if cut_through else 0, BUF_WIDTH), dtype=np.int64)  # PE-mesh links only
    holder = np.full(num_links, -1, dtype=np.int64)
    widest = 0
    for i in range(n):
        widest = max(widest, link_ptr[i + 1] - link_ptr[i])
    wait = np.zeros(len(link), dtype=np.int32)
    hold = np.zeros(2, dtype=np.int64)
    link_by = np.full(n, -1, dtype=np.int64)
    link_bound = np.zeros(n, dtype=np.int64)
    link_mesh = np.zeros(n, dtype=np.bool_)
    n_mesh = np.zeros(n, dtype=np.int64)
    n_other = np.zeros(n, dtype=np.int64)
    seq_free = np.zeros(len(issue_cycles), dtype=np.int64)
    heap = [(np.int64(0), np.int64(0), np.int64(0), np.int64(0), np.int64(0))]
    heap.pop()
    left = np.zeros(n, dtype=np.int64)  # legs of a started transfer not yet delivered
    ejected = np.zeros(n, dtype=np.int64)  # per record: its legs' largest wait counting the wait to eject
    cfg = np.array([mesh_links, buffer_flits, hop_cycles, other_cycles, num_links, num_links + inj_rows, inj_ports,
                    ej_ports], dtype=np.int64)
    st = (heap, new_pool(), np.full(len(buf), -1, dtype=np.int64), cal, cal_at, buf, seen, enter, wait, link, link_off,
          link_ptr, tree_at, tree, inj, ej, cfg, hold_mesh, hold_other, start, busy, finish, left, ejected, np.zeros(rows, dtype=np.int64),
          np.empty(3 * widest, dtype=np.int64), np.empty(3 * widest, dtype=np.int64), np.empty(3 * widest, dtype=np.int64))
    pending = np.empty(n, dtype=np.int64)  # started transfers whose CTs and horizon are not yet updated
    n_pending = 0
    port_free = 0
    floor = 0
    horizon = 0
    bad = -1
    stuck = -1
    for i in range(n + 1):
        o = op[i] if i < n else _SYNC
        if o == _SYNC or o == _PG_OFF:  # everything earlier must be known: run the links dry
            run(DRY, 0, 0, *st)
            for k in range(n_pending):
                j = pending[k]
                if left[j] > 0 and stuck < 0:
                    stuck = j
                horizon = max(horizon, finish[j])
                for c in (ct_a[j], ct_b[j]):
                    if c >= 0:
                        ct_busy[c] = max(ct_busy[c], finish[j])
            n_pending = 0
        if i == n:
            break
        s = seq[i]
        t = max(seq_free[s], floor)
        if reload[i] > 0:
            port_free = max(port_free, seq_free[s]) + reload[i]
            t = max(t, port_free)
        dispatch[i] = t
        seq_free[s] = t + issue_cycles[s]
        if o == _SYNC:
            t = max(t, horizon)
            start[i] = t
            finish[i] = t
            floor = t
            seq_free[s] = max(seq_free[s], t + issue_cycles[s])
            continue
        for p in range(pred_ptr[i], pred_ptr[i + 1]):
            j = pred[p]
            if left[j] > 0 and run(DELIVERED, j, 0, *st) == 0 and stuck < 0:
                stuck = j
            t = max(t, finish[j])
        u = unit[i]
        if u >= 0 and unit_rec[u] >= 0:
            j = unit_rec[u]
            if left[j] > 0 and run(DELIVERED, j, 0, *st) == 0 and stuck < 0:
                stuck = j
            t = max(t, finish[j])
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
        start[i] = t
        finish[i] = t + busy[i]
        if cut_through and o == _REDUCE:
            delay = run(REDUCE, i, t, *st)
        elif cut_through:
            start_legs(i, t, t if age else i, lo, hi, link_off, heap, left, tree_at[i], tree)
        else:
            span = tree[tree_at[i]:tree_at[i] + hi - lo] if o == _REDUCE and tree_at[i] >= 0 else tree[:0]
            t = in_order_links(i, t, lo, hi, link, link_off, span, hold, mesh_links, link_free, holder, link_by,
                               link_bound, link_mesh)
            start[i] = t
        for q in range(lo, hi):  # distinct links, for the energy of each bit crossing them once
            lk = link[q]
            if counted[lk] != i:
                counted[lk] = i
                if lk < mesh_links:
                    n_mesh[i] += 1
                else:
                    n_other[i] += 1
        if u >= 0:
            unit_rec[u] = i
        if left[i] > 0:  # its legs are under way: finish known once they are delivered
            pending[n_pending] = i
            n_pending += 1
            if blocking[i] and run(DELIVERED, i, 0, *st) == 0 and stuck < 0:
                stuck = i
        else:
            finish[i] = t + busy[i] + delay
            if o == _PG_ON:
                ct_wake[a] = finish[i]
            for c in (a, b):
                if c >= 0:
                    ct_busy[c] = max(ct_busy[c], finish[i])
            horizon = max(horizon, finish[i])
        if blocking[i]:
            seq_free[s] = max(seq_free[s], finish[i] + issue_cycles[s])
    return dispatch, start, finish, bad, n_mesh, n_other, wait, link_by, link_bound, link_mesh, stuck, ejected
