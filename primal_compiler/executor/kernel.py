"""The timing recurrence of a replay and its flow control, compiled with numba (one module: numba's
cache of a compiled function does not notice a change to another module it calls).

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

**Links** (``router.link_schedule``). ``"cut-through"`` (the default): a leg advances hop by hop;
its head enters a link at the earliest cycle, no earlier than it arrives, at which the link is free
for the transfer's hold, waiting in the router it reached until then (a long message is a train of
packets moving together). Each link keeps a calendar of its latest ``CALENDAR`` reserved windows
(one more merges the two earliest, which can only delay a transfer) and a transfer takes the first
gap that fits, even ahead of an older transfer's reservation (work-conserving). Every PE-mesh link
ends in a FIFO input buffer of ``router.buffer_flits`` flits: a head leaves it only after every
packet that reached it earlier has left, and enters a link only when the buffer at its far end has
room (a message longer than the buffer needs it empty), so a full buffer holds back the link into
it. A buffer remembers its latest ``CALENDAR`` packets; older ones fold into one bound on later
heads and stop counting towards its occupancy. Die-to-die and controller links are not
buffer-limited. A multicast's copies cross their common prefix once; a reduction combines at every
router, so each of its links carries it once, from the earliest leg's head to the latest's tail,
and its members send when all those windows fit (it holds links, not buffers). Transfers are
scheduled one at a time in stream order, so blocking acts only against earlier records
(docs/executor.md lists the deviations from a cycle-by-cycle router). ``"in-order"`` (the executor
before cut-through): a transfer starts when every link of its route is free at the offset its head
reaches it, and each link keeps only the end of its latest reservation.
"""

from __future__ import annotations

import numpy as np

from primal_compiler.isa.opcodes import Opcode
from primal_compiler.jit import njit

_SYNC, _PG_ON, _PG_OFF, _REDUCE = int(Opcode.SYNC), int(Opcode.PG_ON), int(Opcode.PG_OFF), int(Opcode.REDUCE)

CALENDAR = 8
"""Reserved windows a link's calendar keeps under cut-through (see the module docstring)."""

WAIT_LIMIT = 2**31 - 1
"""Per-link waits are kept in 32 bits; a wait that reaches this is refused (:func:`.replay.replay`)."""


CAL_WIDTH = 1 + 2 * CALENDAR
"""Columns of a link's calendar row: the window count, then (start, end) per window, sorted by start."""

BUF_WIDTH = 3 + 4 * CALENDAR
"""Columns of a buffer's row: the packet count, the folded (arrival, departure), then per packet
(arrival, tail departure, flits, record). One row per link keeps a link's state in adjacent cache lines."""


@njit(nogil=True)
def _fit(cal, lk, at, length):  # pragma: no cover - compiled
    """Earliest start >= ``at`` of a window of ``length`` cycles in the gaps of link ``lk``'s calendar."""
    s = at
    row = cal[lk]
    for k in range(row[0]):
        if s + length <= row[1 + 2 * k]:
            break
        if row[2 + 2 * k] > s:
            s = row[2 + 2 * k]
    return s


@njit(nogil=True)
def _drop(row, j, n):  # pragma: no cover - compiled
    """Remove window ``j`` of ``n`` from a calendar row."""
    for m in range(j, n - 1):
        row[1 + 2 * m] = row[3 + 2 * m]
        row[2 + 2 * m] = row[4 + 2 * m]


@njit(nogil=True)
def _reserve(cal, lk, s, e):  # pragma: no cover - compiled
    """Add window [s, e) (free by :func:`_fit`) to link ``lk``'s calendar, kept sorted, touching windows merged."""
    row = cal[lk]
    n = row[0]
    if n == CALENDAR:  # full: merge the two earliest windows
        row[2] = row[4]
        _drop(row, 1, n)
        n -= 1
    k = n
    while k > 0 and row[1 + 2 * (k - 1)] > s:
        row[1 + 2 * k] = row[1 + 2 * (k - 1)]
        row[2 + 2 * k] = row[2 + 2 * (k - 1)]
        k -= 1
    row[1 + 2 * k] = s
    row[2 + 2 * k] = e
    n += 1
    for j in (k, k - 1):  # merge with the next window, then the previous one with this, where they touch
        if 0 <= j and j + 1 < n and row[2 + 2 * j] >= row[3 + 2 * j]:
            row[2 + 2 * j] = max(row[2 + 2 * j], row[4 + 2 * j])
            _drop(row, j + 1, n)
            n -= 1
    row[0] = n


@njit(nogil=True)
def _fifo_ready(buf, lk, a, i):  # pragma: no cover - compiled
    """Earliest cycle record ``i``'s head that reached the input buffer at the end of link ``lk`` at cycle
    ``a`` can leave it: once every other packet that reached that buffer before it has left (first in,
    first out; the copies of one multicast leave together)."""
    row = buf[lk]
    r = row[2] if row[1] <= a else 0
    for k in range(row[0]):
        p = 3 + 4 * k
        if row[p] <= a and row[p + 3] != i:
            r = max(r, row[p + 1])
    return r


@njit(nogil=True)
def _fifo_room(buf, lk, a, need, cap, i):  # pragma: no cover - compiled
    """Earliest cycle >= ``a`` at which the input buffer at the end of link ``lk`` holds at most
    ``cap - need`` flits of the other packets it knows (arrived, tail not yet gone)."""
    row = buf[lk]
    t = a
    while True:
        held = 0
        gone = -1
        for k in range(row[0]):
            p = 3 + 4 * k
            if row[p] <= t < row[p + 1] and row[p + 3] != i:
                held += row[p + 2]
                gone = row[p + 1] if gone < 0 else min(gone, row[p + 1])
        if held + need <= cap or gone < 0:
            return t
        t = gone


@njit(nogil=True)
def _fifo_push(buf, lk, a, d, flits, i):  # pragma: no cover - compiled
    """Note record ``i``'s packet of ``flits`` buffer flits that reached link ``lk``'s input buffer at ``a``
    and whose tail left it at ``d``; a full record folds its earliest arrival into the folded bound
    (arrival, departure), which then holds back every later head as that packet would."""
    row = buf[lk]
    n = row[0]
    if n == CALENDAR:
        k0 = 0
        for k in range(1, n):
            if row[3 + 4 * k] < row[3 + 4 * k0]:
                k0 = k
        p0 = 3 + 4 * k0
        row[1] = max(row[1], row[p0])
        row[2] = max(row[2], row[p0 + 1])
        n -= 1
        for c in range(4):
            row[p0 + c] = row[3 + 4 * n + c]
    p = 3 + 4 * n
    row[p] = a
    row[p + 1] = d
    row[p + 2] = flits
    row[p + 3] = i
    row[0] = n + 1


@njit(nogil=True)
def _enter(cal, buf, lk, ready, h, latency, flits, cap, buffered, i):  # pragma: no cover - compiled
    """Earliest cycle >= ``ready`` at which a head can enter link ``lk``: the link free for ``h`` cycles
    and, for a buffered (PE-mesh) link, room for ``flits`` in the buffer it reaches ``latency`` later."""
    e = _fit(cal, lk, ready, h)
    while buffered:
        room = _fifo_room(buf, lk, e + latency, flits, cap, i)
        if room == e + latency:
            break
        e = _fit(cal, lk, room - latency, h)
    _reserve(cal, lk, e, e + h)
    return e


@njit(nogil=True)
def cut_through_links(i, t, lo, hi, link, link_off, hold, latency, cap, mesh_links, cal, buf, seen, enter,
                      wait):  # pragma: no cover - compiled
    """Reserve record ``i``'s link rows ``lo:hi`` hop by hop from start ``t`` (module docstring); fills
    ``wait`` per row and returns the largest wait a leg accumulated. ``hold``, ``latency``: per link
    kind (PE mesh, other); ``cap``: flits of a PE-mesh link's input buffer."""
    worst = 0
    prev_e = t
    prev_off = 0
    prev_lk = -1
    prev_at = 0
    for q in range(lo, hi):
        lk = link[q]
        mesh = lk < mesh_links
        off = link_off[q]
        h = hold[0] if mesh else hold[1]
        flits = min(h, cap)  # a message longer than the buffer streams through it, filling it
        first = off == 0  # the first link of a leg: its head is at the source, in no input buffer
        arrive = t if first else prev_e + off - prev_off
        lat = latency[0] if mesh else latency[1]
        if seen[lk] == i and arrive <= enter[lk]:
            e = enter[lk]  # an earlier leg of this record crosses it then: ride along
        else:
            held = not first and prev_lk < mesh_links
            ready = max(arrive, _fifo_ready(buf, prev_lk, arrive, i)) if held else arrive
            e = _enter(cal, buf, lk, ready, h, lat, flits, cap, mesh, i)
            if held:
                _fifo_push(buf, prev_lk, prev_at, e + h, min(hold[0], cap), i)
            if mesh and (q + 1 == hi or link_off[q + 1] == 0):  # the leg's last link: ejected on arrival
                _fifo_push(buf, lk, e + lat, e + lat + h, flits, i)
            if seen[lk] != i:
                seen[lk] = i
                enter[lk] = e
        worst = max(worst, e - (t + off))
        wait[q] = min(e - (t + off), WAIT_LIMIT)
        prev_e = e
        prev_off = off
        prev_lk = lk
        prev_at = e + lat
    return worst


@njit(nogil=True)
def reduction_links(i, t, lo, hi, link, link_off, hold, mesh_links, cal, seen, slot, win, wait):  # pragma: no cover
    """A reduction tree under cut-through (module docstring): one window per distinct link; fills ``wait``
    (the members' wait, the same on every row) and returns it."""
    win_link, win_lo, win_hi = win
    w = 0
    for q in range(lo, hi):
        lk = link[q]
        h = hold[0] if lk < mesh_links else hold[1]
        if seen[lk] != i:
            seen[lk] = i
            slot[lk] = w
            win_link[w] = lk
            win_lo[w] = link_off[q]
            win_hi[w] = link_off[q] + h
            w += 1
        else:
            win_lo[slot[lk]] = min(win_lo[slot[lk]], link_off[q])
            win_hi[slot[lk]] = max(win_hi[slot[lk]], link_off[q] + h)
    s = t
    moved = True
    while moved:  # s only grows, past a reserved window each time: ends
        moved = False
        for k in range(w):
            e = _fit(cal, win_link[k], s + win_lo[k], win_hi[k] - win_lo[k])
            if e > s + win_lo[k]:
                s = e - win_lo[k]
                moved = True
    for k in range(w):
        _reserve(cal, win_link[k], s + win_lo[k], s + win_hi[k])
    for q in range(lo, hi):
        wait[q] = min(s - t, WAIT_LIMIT)
    return s - t


@njit(nogil=True)
def in_order_links(i, t, lo, hi, link, link_off, hold, mesh_links, link_free, holder, link_by, link_bound,
                   link_mesh):  # pragma: no cover - compiled
    """Start of record ``i`` no earlier than ``t`` with every link row ``lo:hi`` free when its head gets
    there, and reserve them (module docstring); records the binding link's holder for the critical path."""
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
        e = t + link_off[q] + (hold[0] if lk < mesh_links else hold[1])
        if e >= link_free[lk]:
            link_free[lk] = e
            holder[lk] = i
    return t


@njit(nogil=True)
def schedule(op, busy, unit, pred_ptr, pred, link_ptr, link, link_off, hold_mesh, hold_other, ct_a, ct_b, blocking,
             seq, issue_cycles, reload, num_units, num_links, num_cts, mesh_links, cut_through, hop_cycles, other_cycles,
             buffer_flits):  # pragma: no cover - compiled
    """(dispatch, start, finish, first record touching a gated CT or -1, distinct mesh and other links per
    record, per link row the wait its leg's head has accumulated in routers up to entering that link, and
    per record the in-order link constraint on its start: the earlier transfer whose reservation bounds
    it or -1, that bound, and whether the link is a PE-mesh link).

    ``seq[i]`` is the sequencer of record i, ``issue_cycles[s]`` the dispatch interval of sequencer s;
    ``reload[i] > 0``: record i opens a phase whose program the NMC loads first (that many cycles on
    its one port, once the CT's sequencer is done with the previous phase).

    Links ``< mesh_links`` are PE-mesh links; a link listed twice by one record counts once.
    ``cut_through``: ``router.link_schedule = "cut-through"``, else in-order; ``hop_cycles`` and
    ``other_cycles``: head latency of a PE-mesh link and of any other link; ``buffer_flits``: flits of a
    PE-mesh link's input buffer (cut-through). A ``REDUCE`` is a reduction tree.
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
        if cut_through and o == _REDUCE:
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
