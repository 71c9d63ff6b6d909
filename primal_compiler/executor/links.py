"""How transfers share links in the timing recurrence (:mod:`.kernel`), compiled with numba.

``router.link_schedule = "cut-through"`` (the default): each leg of a
transfer advances hop by hop. Its head enters a link at the earliest cycle,
no earlier than it reaches the link, at which the link is free for the
cycles the transfer holds it; until then the transfer waits in the router it
has reached (virtual cut-through; a long message is a train of packets that
move together). Each link keeps a calendar of its reserved windows and a
transfer takes the first gap that fits, even one ahead of an older
transfer's reservation, so a link never idles while a transfer scheduled
after the ones holding it could use it (work-conserving). A calendar keeps its link's latest
``CALENDAR`` windows; one more merges its two earliest (the gap between them
is lost, so the approximation can only delay a transfer).

Every PE-mesh link ends in a FIFO input buffer of ``router.buffer_flits``
flits at the router it enters: a head leaves it only after every packet that
reached it earlier has left (head-of-line blocking), and enters a link only
when the buffer at the far end has room for it (a message longer than the
buffer streams through it and needs it empty), so a full buffer holds back
the link into it. A buffer remembers its latest ``CALENDAR`` packets; older
ones fold into one bound on later heads and stop counting towards its
occupancy. Die-to-die and controller links are not buffer-limited. Transfers
are scheduled one at a time in stream order, so blocking and back-pressure
act only against earlier records, and a head delivered at its destination is
not held behind the packets ahead of it there (docs/executor.md lists these
deviations).

Legs of one record share links: a multicast's copies cross their common
prefix once (a later leg rides along); a reduction combines at every
router, so each of its links carries it once, from the earliest leg's head
to the latest's tail, and its members send when all those windows fit,
waiting where they are until then (a reduction holds links, not buffers).

``"in-order"``, the executor before cut-through, kept to compare: a
transfer starts when every link of its route is free at the offset its head
reaches it, and each link keeps only the end of its latest reservation, so
transfers cross a shared link strictly in stream order.
"""

from __future__ import annotations

from primal_compiler.jit import njit

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
    """A reduction tree under cut-through: its legs combine at every router, so each distinct link carries
    it once, from the earliest offset a leg reaches it to the latest plus the hold; the members send when
    every such window fits a gap (first fit), waiting where they are until then. Fills ``wait`` (the same
    on every row) and returns it."""
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
