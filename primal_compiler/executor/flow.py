"""Cut-through flow control as a discrete-event model of the links, compiled with numba (the rules in full:
docs/executor.md, Network).

A started transfer's legs are *events*: the head of link row ``q`` is at the router before link ``link[q]`` at
cycle ``time``. Events are processed in the order (time, arbitration key, row); heads waiting for one link when it
frees are served by the key (``router.arbitration``: the record's start, "age", or its index, "program-order").
A head takes its link when the link's calendar is free for the transfer's hold, it is at the front of its input
buffer, and the buffer at the far end has room for its packet, counted as credits (``_room``); a message longer
than the buffer streams through it. Legs leave and enter PEs through injection and ejection ports, calendars after
the links' (``INJ_BASE``, ``EJ_BASE`` in ``cfg``). A multicast is a tree (:mod:`.trees`): one event per link of it,
branching where its legs part and ejecting where one ends; a head that reaches a link its record already took, no
later than it was taken, rides along. A reduction (``REDUCE``) reserves one window per link of its tree when it
starts. A buffer tracks ``SLOTS`` packets; departed ones fold into one bound.

The schedule (:mod:`.kernel`) runs the events only as far as it needs a finish, so a transfer that starts after
such a point is placed around the links' reservations as they stand (first fit). On unicast traffic without such
points this is the flit model of ``tests/executor/refsim.py`` packet for packet (docs/refsim.md).
"""

from __future__ import annotations

import heapq

import numpy as np

from primal_compiler.executor import linkstate, trees
from primal_compiler.executor.linkstate import (
    CALENDAR, CAP, DELIVERED, DRY, EJ_BASE, EJECT, INJ_BASE, K_IN, K_OUT, LAT_MESH, LAT_OTHER, MESH_LINKS, NONE,
    REDUCE, SLOTS, WAIT_LIMIT,
)
from primal_compiler.executor.trees import ENDS, FIRST, KID, LAST, ROLE, SIB, SPAN, UP
from primal_compiler.jit import njit


@njit(nogil=True, depends=(linkstate, trees))
def run(until, j, t, heap, pool, wake, cal, cal_at, buf, seen, enter, wait, link, link_off, link_ptr, tree_at, tree, inj, ej,
        cfg, hold_mesh, hold_other, start, busy, finish, left, ejected, slot, win_link, win_lo, win_hi):  # pragma: no cover
    """Process events in order: ``until`` :data:`DELIVERED` until record ``j``'s legs are all delivered,
    :data:`DRY` until none is left, :data:`REDUCE` while one is queued before cycle ``t`` and then record
    ``j``, a reduction tree started at ``t``, reserves its windows (``_reduce``, which sets its rows' wait).
    Returns, for REDUCE, the reduction's wait; else 0 if the events ran out before record ``j``'s legs were
    delivered, 1 otherwise. The helpers are closures over the arrays (numba counts a reference, atomically, per
    array passed to a compiled function: most of the replay's time when each event passed them all); the arrays
    are arguments, since numba 0.68 drops writes to arrays unpacked from a tuple argument in a function with
    closures (tests/executor/test_replay.py checks every record's finish against its legs' waits)."""

    def _fit(lk, at, length):
        """Earliest start >= ``at`` of a window of ``length`` cycles in the gaps of link ``lk``'s calendar."""
        b = cal_at[lk]
        s = at
        for k in range(cal[b]):
            if s + length <= cal[b + 1 + 2 * k]:
                break
            if cal[b + 2 + 2 * k] > s:
                s = cal[b + 2 + 2 * k]
        return s

    def _drop(b, first, n, m):
        """Windows ``first .. first + m - 1`` of the ``n`` in the calendar at ``b`` forgotten."""
        for k in range(first, n - m):
            cal[b + 1 + 2 * k] = cal[b + 1 + 2 * (k + m)]
            cal[b + 2 + 2 * k] = cal[b + 2 + 2 * (k + m)]

    def _reserve(lk, s, e):
        """Add window [s, e) (free by :func:`_fit`) to link ``lk``'s calendar, kept sorted, touching windows
        merged."""
        b = cal_at[lk]
        n = cal[b]
        full = (cal_at[lk + 1] - b - 1) // 2
        if n == full:  # full: forget the earliest window (in time order, long past); a quarter of a big one
            m = 1 if full <= CALENDAR else full // 4
            _drop(b, 0, n, m)
            n -= m
        k = n
        while k > 0 and cal[b + 1 + 2 * (k - 1)] > s:
            cal[b + 1 + 2 * k] = cal[b + 1 + 2 * (k - 1)]
            cal[b + 2 + 2 * k] = cal[b + 2 + 2 * (k - 1)]
            k -= 1
        cal[b + 1 + 2 * k] = s
        cal[b + 2 + 2 * k] = e
        n += 1
        for m in (k, k - 1):  # merge with the next window, then the previous one with this, where they touch
            if 0 <= m and m + 1 < n and cal[b + 2 + 2 * m] >= cal[b + 3 + 2 * m]:
                cal[b + 2 + 2 * m] = max(cal[b + 2 + 2 * m], cal[b + 4 + 2 * m])
                _drop(b, m + 1, n, 1)
                n -= 1
        cal[b] = n

    def _port(first, k, now, h, i):
        """(row, cycle): of the ``k`` port rows from ``first``, the one free for ``h`` cycles earliest from
        ``now`` and that cycle; (row, -1) when record ``i`` took one at ``now`` or later already (a copy of
        it leaving with the one that took it shares it)."""
        best, at = first, -1
        for c in range(first, first + k):
            if seen[c] == i and now <= enter[c]:
                return c, -1
            e = _fit(c, now, h)
            if at < 0 or e < at:
                best, at = c, e
        return best, at

    def _take(c, now, h, i):
        _reserve(c, now, now + h)
        seen[c] = i
        enter[c] = now

    def _ready(b, a, i):
        """Earliest cycle record ``i``'s head that reached buffer ``b`` at ``a`` may leave it (every other
        packet that reached it earlier has gone), or -1 while one of those has not been granted."""
        r = buf[b, 2] if buf[b, 1] <= a else 0
        for k in range(buf[b, 0]):
            p = 3 + 4 * k
            if buf[b, p] <= a and buf[b, p + 3] != i:
                if buf[b, p + 1] < 0:
                    return -1
                r = max(r, buf[b, p + 1])
        return r

    def _room(b, at, lat, need, cap, i):
        """Earliest cycle >= ``at`` at which record ``i`` may send ``need`` flits onto the link into buffer
        ``b``: the flits of other packets sent onto it before that cycle and not yet gone number at most
        ``cap - need`` (a packet's flits are sent one a cycle from its head's entry, ``lat`` before its
        arrival, and leave one a cycle up to its tail's departure), and a slot is free; -1 while that
        depends on a packet not yet granted onwards."""
        if buf[b, 0] == SLOTS:
            known = False
            for k in range(SLOTS):
                known = known or buf[b, 4 + 4 * k] >= 0
            if not known:
                return -1
        while True:  # counted as a router counts credits: flits sent before cycle at and not yet gone
            held = 0
            soon = -1  # the next cycle at which a packet's count drops
            for k in range(buf[b, 0]):
                p = 3 + 4 * k
                sent = at - (buf[b, p] - lat)
                if buf[b, p + 3] == i or sent <= 0:
                    continue
                f = buf[b, p + 2]
                d = buf[b, p + 1]
                if d < 0:
                    held += min(f, cap, sent)
                    continue
                drop = d - min(f, cap)  # a packet leaves one flit a cycle, its tail at d; a longer message
                gone = min(f, cap, sent) - min(f, cap, max(0, at - drop))  # drains through the buffer alike
                held += gone
                if gone > 0:
                    nxt = max(at + 1, drop + 1)
                    soon = nxt if soon < 0 else min(soon, nxt)
            if held + need <= cap:
                return at
            if soon < 0:
                return -1
            at = soon

    def _arrive(b, a, flits, i, now):
        """Note record ``i``'s packet, due in buffer ``b`` at ``a`` and not yet granted onwards (a branch of its
        tree that meets it again is the same packet); packets gone by ``now`` fold into the bound first."""
        n = buf[b, 0]
        k = 0
        while k < n:
            p = 3 + 4 * k
            if buf[b, p + 3] == i and buf[b, p] == a:
                return
            if 0 <= buf[b, p + 1] <= now or n == SLOTS and buf[b, p + 1] >= 0:
                buf[b, 1] = max(buf[b, 1], buf[b, p])
                buf[b, 2] = max(buf[b, 2], buf[b, p + 1])
                n -= 1
                for c in range(4):
                    buf[b, p + c] = buf[b, 3 + 4 * n + c]
            else:
                k += 1
        if n == SLOTS:  # every slot waiting (a branch that rode along past the room check): left untracked
            return
        p = 3 + 4 * n
        buf[b, p] = a
        buf[b, p + 1] = -1
        buf[b, p + 2] = flits
        buf[b, p + 3] = i
        buf[b, 0] = n + 1

    def _depart(b, a, d, i):
        """Record ``i``'s packet that reached buffer ``b`` at ``a`` has its tail gone at ``d`` (the latest
        copy)."""
        for k in range(buf[b, 0]):
            p = 3 + 4 * k
            if buf[b, p + 3] == i and buf[b, p] == a:
                buf[b, p + 1] = max(buf[b, p + 1], d)

    def _park(b, ev):
        """Keep event ``ev`` until the next departure from buffer ``b`` (pool[0] row 0: free-list head, size)."""
        p = pool[0]
        if p[0, 0] < 0:
            if p[0, 1] == len(p):
                bigger = np.empty((2 * len(p), 6), dtype=np.int64)
                bigger[: len(p)] = p
                pool[0] = bigger
                p = bigger
            node = p[0, 1]
            p[0, 1] += 1
        else:
            node = p[0, 0]
            p[0, 0] = p[node, 5]
        p[node, 0], p[node, 1], p[node, 2], p[node, 3], p[node, 4] = ev
        p[node, 5] = wake[b]
        wake[b] = node

    def _wake(b, now):
        """Return every event parked at buffer ``b`` to the queue at ``now``."""
        if wake[b] < 0:
            return
        p = pool[0]
        node = wake[b]
        wake[b] = -1
        while node >= 0:
            heapq.heappush(heap, (now, p[node, 1], p[node, 2], p[node, 3], p[node, 4]))
            nxt = p[node, 5]
            p[node, 5] = p[0, 0]
            p[0, 0] = node
            node = nxt

    def _leg_done(i, w):
        finish[i] = max(finish[i], start[i] + busy[i] + w)
        left[i] -= 1

    def _branch(i, q, e, off, lat, w, key, mesh):
        """Tree row ``q`` of record ``i`` (:mod:`.trees`) taken at ``e``: the legs ending there eject (a PE-mesh
        link) or are delivered, its children ask for their links; returns the first one's event, queues the rest."""
        lo, b = link_ptr[i], tree_at[i]
        for _ in range(tree[b + q - lo, ENDS]):
            if mesh:
                heapq.heappush(heap, (e + lat, key, q - EJECT, e + lat, i))
            else:
                _leg_done(i, w)
        first = NONE
        c = tree[b + q - lo, KID]
        while c >= 0:
            r = lo + c
            if first[0] >= 0:
                heapq.heappush(heap, first)
            first = (e + link_off[r] - off, key, r, e + lat, i)
            c = tree[b + c, SIB]
        return first

    def _reduce(i, t0):
        """Record ``i``, a reduction tree started at ``t0`` under cut-through (module docstring): one window
        per distinct link, all reserved at once; its members' wait (the same on every row) goes to
        ``wait`` and is returned."""
        lo, hi = link_ptr[i], link_ptr[i + 1]
        w = 0
        for q in range(lo, hi):  # one row per link (:mod:`.trees`), its heads from link_off to link_off + SPAN
            lk = link[q]
            mesh = lk < cfg[MESH_LINKS]
            h = hold_mesh[i] if mesh else hold_other[i]
            span, role = tree[tree_at[i] + q - lo, SPAN], tree[tree_at[i] + q - lo, ROLE]
            for r in range(3):  # the link; a member's injection port; the destination's ejection port
                if r == 0:
                    row, at, end = lk, link_off[q], link_off[q] + span + h
                elif r == 1 and mesh and role & FIRST:
                    row, at, end = cfg[INJ_BASE] + inj[lk], 0, h
                elif r == 2 and mesh and role & LAST:
                    row, at, end = cfg[EJ_BASE] + ej[lk], link_off[q] + cfg[LAT_MESH], link_off[q] + cfg[LAT_MESH] + span + h
                else:
                    continue
                if seen[row] != i:
                    seen[row] = i
                    slot[row] = w
                    win_link[w] = row
                    win_lo[w] = at
                    win_hi[w] = end
                    w += 1
                else:
                    win_lo[slot[row]] = min(win_lo[slot[row]], at)
                    win_hi[slot[row]] = max(win_hi[slot[row]], end)
        base = t0
        moved = True
        while moved:  # base only grows, past a reserved window each time: ends
            moved = False
            for k in range(w):
                row, length = win_link[k], win_hi[k] - win_lo[k]
                e = _fit(row, base + win_lo[k], length)
                if row >= cfg[INJ_BASE]:  # a local port: whichever of the PE's ports is free earliest
                    first, ports = (cfg[INJ_BASE], cfg[K_IN]) if row < cfg[EJ_BASE] else (cfg[EJ_BASE], cfg[K_OUT])
                    first += (row - first) // ports * ports
                    for c in range(first, first + ports):
                        ec = _fit(c, base + win_lo[k], length)
                        if ec < e:
                            e, win_link[k] = ec, c
                if e > base + win_lo[k]:
                    base = e - win_lo[k]
                    moved = True
        for k in range(w):
            _reserve(win_link[k], base + win_lo[k], base + win_hi[k])
        for q in range(lo, hi):
            wait[q] = min(base - t0, WAIT_LIMIT)
        return base - t0

    def _request(ev):
        """The head of event ``ev`` = (now, key, row, arrival in its input buffer, record) asks for its
        link; returns the event that follows (time -1: none, it is parked or its leg is delivered)."""
        now, key, q, arr, i = ev
        lk = link[q]
        mesh = lk < cfg[MESH_LINKS]
        off = link_off[q]
        h = hold_mesh[i] if mesh else hold_other[i]
        lat = cfg[LAT_MESH] if mesh else cfg[LAT_OTHER]
        cap = cfg[CAP]
        need = h if h <= cap else 1  # a packet needs room for all of it; a longer message streams a flit a cycle
        up = q - 1 if tree_at[i] < 0 else link_ptr[i] + tree[tree_at[i] + q - link_ptr[i], UP]  # a tree row's parent
        prev = link[up] if off > 0 else -1  # the link into its input buffer
        held = off > 0 and prev < cfg[MESH_LINKS]
        if seen[lk] == i and now <= enter[lk]:
            e = enter[lk]  # another branch of this record's tree crosses it then: ride along
        else:
            if held:
                r = _ready(prev, arr, i)
                if r < 0:
                    _park(prev, ev)
                    return NONE
                if r > now:
                    return (r, key, q, arr, i)
            port, at = -1, -1
            if off == 0 and mesh:  # the leg leaves its PE through one of its injection ports
                port, at = _port(cfg[INJ_BASE] + inj[lk], cfg[K_IN], now, h, i)
                if at > now:
                    return (at, key, q, arr, i)
            e = _fit(lk, now, h)
            if e > now:
                return (e, key, q, arr, i)
            if mesh:
                room = _room(lk, now, lat, need, cap, i)
                if room < 0:
                    _park(lk, ev)
                    return NONE
                if room > now:
                    return (room, key, q, arr, i)
            if at >= 0:
                _take(port, now, h, i)
            _reserve(lk, now, now + h)
            if seen[lk] != i:
                seen[lk] = i
                enter[lk] = now
        if held:
            _depart(prev, arr, e + h, i)
            _wake(prev, now)
        if mesh:
            _arrive(lk, e + lat, h, i, now)
        w = e - (start[i] + off)
        wait[q] = min(w, WAIT_LIMIT)
        if tree_at[i] >= 0:
            return _branch(i, q, e, off, lat, w, key, mesh)
        if q + 1 < link_ptr[i + 1] and link_off[q + 1] > 0:
            return (e + link_off[q + 1] - off, key, q + 1, e + lat, i)
        if mesh:  # the leg's last link: eject in FIFO order
            return (e + lat, key, q - EJECT, e + lat, i)
        _leg_done(i, w)
        return NONE

    def _eject(ev):
        """The packet of event ``ev`` reached its destination's buffer at ``arr``: it leaves in FIFO order
        (parked while a packet ahead of it is not yet granted onwards) through one of its PE's ejection
        ports (waiting while they are all taken), and its leg is delivered."""
        now, key, v, arr, i = ev
        q = v + EJECT
        lk = link[q]
        r = _ready(lk, arr, i)
        if r < 0:
            _park(lk, ev)
            return NONE
        if r > now:
            return (r, key, v, arr, i)
        h = hold_mesh[i]
        port, at = _port(cfg[EJ_BASE] + ej[lk], cfg[K_OUT], now, h, i)
        if at > now:
            return (at, key, v, arr, i)
        if at >= 0:
            _take(port, now, h, i)
        out = now
        _depart(lk, arr, out + h, i)
        _wake(lk, now)
        w = out - cfg[LAT_MESH] - (start[i] + link_off[q])  # the leg's waits, its wait to eject included
        ejected[i] = max(ejected[i], w)  # the last link row keeps the wait up to entering the link
        _leg_done(i, w)
        return NONE

    while len(heap):
        if until == DELIVERED and left[j] == 0 or until == REDUCE and heap[0][0] >= t:
            break
        cur = heapq.heappop(heap)
        while True:  # the event and those that follow from it while none queued is earlier
            cur = _request(cur) if cur[2] >= 0 else _eject(cur)
            if cur[0] < 0:
                break
            if len(heap) and heap[0] < cur:
                heapq.heappush(heap, cur)
                break
    if until == REDUCE:
        return _reduce(j, t)
    return 1 if until == DRY or left[j] == 0 else 0
