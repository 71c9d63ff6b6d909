"""The layout of the link model's state (:mod:`.flow`): calendars, input buffers, events, and the
helpers that create events and their pool, compiled with numba.

An event is ``(time, arbitration key, row, arrival in its input buffer, record)``; ``row`` is a link
row (a head asking for that link) or, below zero, an ejection (:data:`EJECT`). ``cfg`` columns give the
link model's sizes (:data:`MESH_LINKS` ...).
"""

from __future__ import annotations

import heapq

import numpy as np

from primal_compiler.executor import trees
from primal_compiler.executor.trees import ENDS
from primal_compiler.jit import njit

CALENDAR = 16
"""Reserved windows a link's calendar keeps; one more forgets the earliest. Events run in time order,
so a forgotten window is in the past of every later request, except for a transfer placed after the
schedule ran the events ahead, which may then overlap it. On Llama-2-13B's schedule 16 windows end
within 2% of 64 (8: 6% earlier); merging the two earliest instead made such a transfer wait behind
the merged span (22% later; seconds on Llama-2-70B without gating)."""

CAL_WIDTH = 1 + 2 * CALENDAR
"""Columns of a link's calendar row: the window count, then (start, end) per window, sorted by start."""

BIG_CALENDAR = 512
"""Reserved windows a die-to-die or controller link's calendar keeps; when full, the earliest quarter is
forgotten. These links are few (ports per CT, and the controller's) and a flood of transfers can queue on
one: a mixed-adapter batch rewriting Llama-2-7B's LoRA weights sends thousands of CONFIGs down the
controller link, and with 16 windows the transfers placed after the schedule ran ahead overlapped forgotten
ones and crossed it 10% faster than its bandwidth (a decode step 19% short). With 512 no package link is
held longer than the span of the records crossing it (``tests/executor/test_links.py``), and the main job's
settled ITL equals that with 4096 windows (docs/executor.md)."""

BIG_WIDTH = 1 + 2 * BIG_CALENDAR
"""Columns of a die-to-die or controller link's calendar row."""

SLOTS = 16
"""Packets an input buffer tracks; with all of them still waiting, a head waits for a departure."""

BUF_WIDTH = 3 + 4 * SLOTS
"""Columns of a buffer's row: the packet count, the folded (arrival, departure), then per packet
(arrival, tail departure or -1, flits, record)."""

WAIT_LIMIT = 2**31 - 1
"""Per-link waits are kept in 32 bits; a wait that reaches this is refused (:func:`.replay.replay`)."""

NONE = (-1, -1, -1, -1, -1)
"""No event."""

EJECT = 1 << 62
"""An ejection event's row is its leg's last link row minus this: negative, so it is told from a head's
request, and in row order, so heads that reach their ejection ports at the same cycle with the same
arbitration key are served in stream order, as requests are."""

# columns of the cfg array: PE-mesh links, buffer flits, head latencies, the first calendar row of the
# injection and of the ejection ports (after the links'), and the ports of each kind a PE has
MESH_LINKS, CAP, LAT_MESH, LAT_OTHER, INJ_BASE, EJ_BASE, K_IN, K_OUT = 0, 1, 2, 3, 4, 5, 6, 7


DELIVERED, DRY, REDUCE = 0, 1, 2
"""What :func:`run` runs the events until (its ``until``)."""


@njit(nogil=True)
def new_pool():  # pragma: no cover - compiled
    """An empty pool of parked events (row 0 is its header)."""
    p = np.zeros((64, 6), dtype=np.int64)
    p[0, 0] = -1
    p[0, 1] = 1
    return [p]


@njit(nogil=True, depends=(trees,))
def start_legs(i, t, key, lo, hi, link_off, heap, left, at, tree):  # pragma: no cover - compiled
    """Queue record ``i``'s legs (rows ``lo:hi``, a leg or a tree (:mod:`.trees`, its rows from ``at``; -1: none)
    starting at each zero offset) from cycle ``t``; ``left[i]`` counts the legs to deliver."""
    for q in range(lo, hi):
        if link_off[q] == 0:
            heapq.heappush(heap, (t, key, q, t, i))
            if at < 0:
                left[i] += 1
        if at >= 0:
            left[i] += tree[at + q - lo, ENDS]
