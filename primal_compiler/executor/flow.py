"""Cut-through flow control as a discrete-event model of the links, compiled with numba.

A started transfer's legs are *events*: the head of leg row ``q`` is at the router before link
``link[q]`` at cycle ``time``. Events are processed in the order (time, arbitration key, row), so a
head that reaches a router before another is served before it, and the heads waiting for one link
when it frees are served by the key (``router.arbitration``: the record's start, "age", or its
index, "program-order").

* A head takes its link only when the link's calendar is free from now for the transfer's hold (else
  it asks again when the link frees), it is at the front of its input buffer (every packet that
  reached that buffer earlier has been granted onwards; else it waits for the next departure there,
  and leaves no earlier than their tails), and the buffer at the link's far end has room for its
  packet (:func:`_room`, counted as credits; else it waits). A message longer than the buffer
  streams through it a flit at a time.
* At a leg's last PE-mesh link the packet ejects in FIFO order: its tail leaves once the packets
  ahead of it in that buffer have left.
* A multicast's copies cross their common prefix once (a copy that reaches a link its record already
  took, no later than it was taken, rides along); they then move independently. A reduction
  (:func:`reduction_links`) combines at every router: one window per link from the earliest member's
  head to the latest's tail, reserved at once when its record starts.
* A buffer keeps up to ``SLOTS`` packets (arrival, tail departure or -1 while waiting, flits,
  record); departed ones fold into one bound (arrival, departure) on later heads.

The schedule (:mod:`.kernel`) runs the events only as far as it needs a finish, so a transfer that
starts after such a point is placed around the links' reservations as they stand (first fit), not
in strict time order against the ones already placed. On unicast traffic without such points this
is the flit model of ``tests/executor/refsim.py`` packet for packet (docs/refsim.md).
"""

from __future__ import annotations

import heapq

import numpy as np

from primal_compiler.jit import njit

CALENDAR = 16
"""Reserved windows a link's calendar keeps; one more forgets the earliest. Events run in time order,
so a forgotten window is in the past of every later request, except for a transfer placed after the
schedule ran the events ahead, which may then overlap it. On Llama-2-13B's schedule 16 windows end
within 2% of 64 (8: 6% earlier); merging the two earliest instead made such a transfer wait behind
the merged span (22% later; seconds on Llama-2-70B without gating)."""

CAL_WIDTH = 1 + 2 * CALENDAR
"""Columns of a link's calendar row: the window count, then (start, end) per window, sorted by start."""

SLOTS = 16
"""Packets an input buffer tracks; with all of them still waiting, a head waits for a departure."""

BUF_WIDTH = 3 + 4 * SLOTS
"""Columns of a buffer's row: the packet count, the folded (arrival, departure), then per packet
(arrival, tail departure or -1, flits, record)."""

WAIT_LIMIT = 2**31 - 1
"""Per-link waits are kept in 32 bits; a wait that reaches this is refused (:func:`.replay.replay`)."""

NONE = (-1, -1, -1, -1, -1)
"""No event."""

# columns of the cfg array
MESH_LINKS, CAP, LAT_MESH, LAT_OTHER = 0, 1, 2, 3


@njit(nogil=True, inline="always")
def fit(cal, lk, at, length):  # pragma: no cover - compiled
    """Earliest start >= ``at`` of a window of ``length`` cycles in the gaps of link ``lk``'s calendar."""
    s = at
    for k in range(cal[lk, 0]):
        if s + length <= cal[lk, 1 + 2 * k]:
            break
        if cal[lk, 2 + 2 * k] > s:
            s = cal[lk, 2 + 2 * k]
    return s


@njit(nogil=True, inline="always")
def _drop(cal, lk, j, n):  # pragma: no cover - compiled
    for m in range(j, n - 1):
        cal[lk, 1 + 2 * m] = cal[lk, 3 + 2 * m]
        cal[lk, 2 + 2 * m] = cal[lk, 4 + 2 * m]


@njit(nogil=True, inline="always")
def reserve(cal, lk, s, e):  # pragma: no cover - compiled
    """Add window [s, e) (free by :func:`fit`) to link ``lk``'s calendar, kept sorted, touching windows merged."""
    n = cal[lk, 0]
    if n == CALENDAR:  # full: forget the earliest window (in time order, long past)
        _drop(cal, lk, 0, n)
        n -= 1
    k = n
    while k > 0 and cal[lk, 1 + 2 * (k - 1)] > s:
        cal[lk, 1 + 2 * k] = cal[lk, 1 + 2 * (k - 1)]
        cal[lk, 2 + 2 * k] = cal[lk, 2 + 2 * (k - 1)]
        k -= 1
    cal[lk, 1 + 2 * k] = s
    cal[lk, 2 + 2 * k] = e
    n += 1
    for j in (k, k - 1):  # merge with the next window, then the previous one with this, where they touch
        if 0 <= j and j + 1 < n and cal[lk, 2 + 2 * j] >= cal[lk, 3 + 2 * j]:
            cal[lk, 2 + 2 * j] = max(cal[lk, 2 + 2 * j], cal[lk, 4 + 2 * j])
            _drop(cal, lk, j + 1, n)
            n -= 1
    cal[lk, 0] = n


@njit(nogil=True, inline="always")
def _ready(buf, b, a, i):  # pragma: no cover - compiled
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


@njit(nogil=True, inline="always")
def _room(buf, b, t, lat, need, cap, i):  # pragma: no cover - compiled
    """Earliest cycle >= ``t`` at which record ``i`` may send ``need`` flits onto the link into buffer
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
    while True:  # counted as a router counts credits: flits sent before cycle t and not yet gone
        held = 0
        soon = -1  # the next cycle at which a packet's count drops
        for k in range(buf[b, 0]):
            p = 3 + 4 * k
            sent = t - (buf[b, p] - lat)
            if buf[b, p + 3] == i or sent <= 0:
                continue
            f = buf[b, p + 2]
            d = buf[b, p + 1]
            if d < 0:
                held += min(f, cap, sent)
                continue
            drop = d - min(f, cap)  # a packet leaves one flit a cycle, its tail at d; a longer message
            left = min(f, cap, sent) - min(f, cap, max(0, t - drop))  # drains through the buffer the same way
            held += left
            if left > 0:
                nxt = max(t + 1, drop + 1)
                soon = nxt if soon < 0 else min(soon, nxt)
        if held + need <= cap:
            return t
        if soon < 0:
            return -1
        t = soon


@njit(nogil=True, inline="always")
def _arrive(buf, b, a, flits, i, now):  # pragma: no cover - compiled
    """Note record ``i``'s packet, due in buffer ``b`` at ``a`` and not yet granted onwards (a second
    copy of it is the same packet); packets gone by ``now`` fold into the bound first."""
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
    if n == SLOTS:  # every slot waiting (a copy that rode along past the room check): left untracked
        return
    p = 3 + 4 * n
    buf[b, p] = a
    buf[b, p + 1] = -1
    buf[b, p + 2] = flits
    buf[b, p + 3] = i
    buf[b, 0] = n + 1


@njit(nogil=True, inline="always")
def _depart(buf, b, a, d, i):  # pragma: no cover - compiled
    """Record ``i``'s packet that reached buffer ``b`` at ``a`` has its tail gone at ``d`` (the latest copy)."""
    for k in range(buf[b, 0]):
        p = 3 + 4 * k
        if buf[b, p + 3] == i and buf[b, p] == a:
            buf[b, p + 1] = max(buf[b, p + 1], d)


@njit(nogil=True, inline="always")
def _park(pool, wake, b, ev):  # pragma: no cover - compiled
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


@njit(nogil=True, inline="always")
def _wake(pool, wake, b, now, heap):  # pragma: no cover - compiled
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


@njit(nogil=True)
def new_pool():  # pragma: no cover - compiled
    """An empty pool of parked events (row 0 is its header)."""
    p = np.zeros((64, 6), dtype=np.int64)
    p[0, 0] = -1
    p[0, 1] = 1
    return [p]


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
            e = fit(cal, win_link[k], s + win_lo[k], win_hi[k] - win_lo[k])
            if e > s + win_lo[k]:
                s = e - win_lo[k]
                moved = True
    for k in range(w):
        reserve(cal, win_link[k], s + win_lo[k], s + win_hi[k])
    for q in range(lo, hi):
        wait[q] = min(s - t, WAIT_LIMIT)
    return s - t


@njit(nogil=True, inline="always")
def _leg_done(i, w, start, busy, finish, left):  # pragma: no cover - compiled
    finish[i] = max(finish[i], start[i] + busy[i] + w)
    left[i] -= 1


@njit(nogil=True, inline="always")
def _request(ev, heap, pool, wake, cal, buf, seen, enter, wait, link, link_off, link_ptr, cfg, hold_mesh,
             hold_other, start, busy, finish, left):  # pragma: no cover - compiled
    """The head of event ``ev`` = (now, key, row, arrival in its input buffer, record) asks for its link;
    returns the event that follows (time -1: none, it is parked or its leg is delivered)."""
    now, key, q, arr, i = ev
    lk = link[q]
    mesh = lk < cfg[MESH_LINKS]
    off = link_off[q]
    h = hold_mesh[i] if mesh else hold_other[i]
    lat = cfg[LAT_MESH] if mesh else cfg[LAT_OTHER]
    cap = cfg[CAP]
    need = h if h <= cap else 1  # a packet needs room for all of it; a longer message streams, a flit at a time
    prev = link[q - 1] if off > 0 else -1
    held = off > 0 and prev < cfg[MESH_LINKS]
    if seen[lk] == i and now <= enter[lk]:
        e = enter[lk]  # an earlier copy of this record crosses it then: ride along
    else:
        if held:
            r = _ready(buf, prev, arr, i)
            if r < 0:
                _park(pool, wake, prev, ev)
                return NONE
            if r > now:
                return (r, key, q, arr, i)
        e = fit(cal, lk, now, h)
        if e > now:
            return (e, key, q, arr, i)
        if mesh:
            room = _room(buf, lk, now, lat, need, cap, i)
            if room < 0:
                _park(pool, wake, lk, ev)
                return NONE
            if room > now:
                return (room, key, q, arr, i)
        reserve(cal, lk, now, now + h)
        if seen[lk] != i:
            seen[lk] = i
            enter[lk] = now
    if held:
        _depart(buf, prev, arr, e + h, i)
        _wake(pool, wake, prev, now, heap)
    if mesh:
        _arrive(buf, lk, e + lat, h, i, now)
    w = e - (start[i] + off)
    wait[q] = min(w, WAIT_LIMIT)
    if q + 1 < link_ptr[i + 1] and link_off[q + 1] > 0:
        return (e + link_off[q + 1] - off, key, q + 1, e + lat, i)
    if mesh:  # the leg's last link: eject in FIFO order
        return (e + lat, key, -(q + 1), e + lat, i)
    _leg_done(i, w, start, busy, finish, left)
    return NONE


@njit(nogil=True, inline="always")
def _eject(ev, heap, pool, wake, cal, buf, seen, enter, wait, link, link_off, link_ptr, cfg, hold_mesh,
           hold_other, start, busy, finish, left):  # pragma: no cover - compiled
    """The packet of event ``ev`` reached its destination's buffer at ``arr``: it leaves in FIFO order
    (parked while a packet ahead of it is not yet granted onwards) and its leg is delivered."""
    now, key, v, arr, i = ev
    q = -v - 1
    lk = link[q]
    r = _ready(buf, lk, arr, i)
    if r < 0:
        _park(pool, wake, lk, ev)
        return NONE
    out = max(arr, r)
    _depart(buf, lk, arr, out + hold_mesh[i], i)
    _wake(pool, wake, lk, now, heap)
    w = out - cfg[LAT_MESH] - (start[i] + link_off[q])
    wait[q] = min(w, WAIT_LIMIT)
    _leg_done(i, w, start, busy, finish, left)
    return NONE


@njit(nogil=True)
def run(until, j, t, state):  # pragma: no cover - compiled
    """Process events in order: ``until`` 0 until record ``j``'s legs are all delivered, 1 while one is
    queued before cycle ``t``, 2 until none is left; False if they ran out before record ``j``'s were.
    ``state``: the arrays of :func:`_request`'s signature after ``ev``, unpacked once here so the loop
    handles plain arrays (unpacking a tuple per event costs a reference count per array)."""
    (heap, pool, wake, cal, buf, seen, enter, wait, link, link_off, link_ptr, cfg, hold_mesh, hold_other, start,
     busy, finish, left) = state
    while len(heap):
        if until == 0 and left[j] == 0 or until == 1 and heap[0][0] >= t:
            return True
        ev = heapq.heappop(heap)
        while True:  # the event and those that follow from it while none queued is earlier
            if ev[2] >= 0:
                ev = _request(ev, heap, pool, wake, cal, buf, seen, enter, wait, link, link_off, link_ptr, cfg,
                              hold_mesh, hold_other, start, busy, finish, left)
            else:
                ev = _eject(ev, heap, pool, wake, cal, buf, seen, enter, wait, link, link_off, link_ptr, cfg,
                            hold_mesh, hold_other, start, busy, finish, left)
            if ev[0] < 0:
                break
            if len(heap) and heap[0] < ev:
                heapq.heappush(heap, ev)
                break
    return until != 0 or left[j] == 0


@njit(nogil=True)
def start_legs(i, t, key, lo, hi, link_off, heap, left):  # pragma: no cover - compiled
    """Queue record ``i``'s legs (rows ``lo:hi``, a leg starting at each zero offset) from cycle ``t``."""
    for q in range(lo, hi):
        if link_off[q] == 0:
            heapq.heappush(heap, (t, key, q, t, i))
            left[i] += 1
