"""Merged legs: a ``BCAST``'s where they share their path (a tree, one row per link of it), a ``REDUCE``'s one row
per link (:data:`SPAN`).

The legs of one multicast leave one PE, and dimension-order routing sends two of them down the same links until
they part. Listed leg by leg (:func:`.topology.route_legs`), the shared prefix repeats once per leg, and the link
model (:mod:`.flow`) moved every copy along it one event per hop, each a no-op once the first copy had taken the
link (it "rode along"). Here a record's legs become a tree: a row at depth ``d`` of a leg is kept only when no
earlier leg of the record has the same first ``d + 1`` links (the earliest such leg's row stands for it, the one
the link model served first), so every row is one (record, path prefix), and the schedule runs one event per
distinct prefix.

Guarantees: the kept rows of a record are its rows in leg order less the repeated ones, so a record that shares
nothing keeps its rows as they were and is no tree; links, offsets and every kept row's link-crossing are those
of the copy it stands for. For a tree record, :data:`UP` gives each kept row's parent (the kept row for the same
path one link shorter, -1 at a root), :data:`ENDS` how many legs end at it (a leg whose destination lies on
another's path ends at a row that also has children; two legs to one PE end at one row), :data:`KID` and
:data:`SIB` its first child and next sibling in row order (the schedule's walk). Rows are relative to the
record's first kept row. :func:`build` walks the legs of one record at a time into a buffer and stores the kept
rows alone (the repeated ones are never stored). The schedule's timing is that of the copies (``tests/executor/test_golden_reports.py``
holds it to the figures before the trees; ``tests/executor/test_trees.py`` checks every leg is still a path).
"""

from __future__ import annotations

import numpy as np

from primal_compiler.arrays import ranges
from primal_compiler.executor import topology
from primal_compiler.executor.topology import Routes, Walk, walk
from primal_compiler.jit import njit

UP, KID, SIB, ENDS = 0, 1, 2, 3
"""Columns of a tree row."""

SPAN, ROLE = KID, SIB
"""A reduction's rows are merged too, one per link (:func:`.flow.run` reserves its tree's windows at once, in no
order), and reuse two columns: ``SPAN``, the cycles from the earliest to the latest offset at which a member's head
reaches the link (the row's offset is the earliest), and ``ROLE``, :data:`FIRST` where the link is some member's
first (its injection port is held) | :data:`LAST` where it enters the destination (its ejection port is held).
``UP`` is -1 (no walk) and ``ENDS`` 1 at the first link of the last member's leg only (the leg
:func:`.critical.held_in_routers` charges a reduction's wait to, as it did when rows were legs)."""

FIRST, LAST = 1, 2
"""Bits of a reduction row's ``ROLE``."""

MULTICAST, REDUCTION = 1, 2
"""What :func:`build` merges a record's legs into (``kind``; 0: nothing, its rows stay legs)."""


@njit(nogil=True)
def _trie(lo, hi, ptr, link, node_link, kid, sib, last, up, ends, keep):  # pragma: no cover - compiled
    """The trie of the paths of legs ``lo:hi`` (leg ``l``'s rows ``ptr[l] - ptr[lo]:ptr[l + 1] - ptr[lo]`` of
    ``link``): node 0 is the root, nodes ``1..m`` the distinct path prefixes in order of their first row, with
    their link, parent (``up``), first child and next sibling (``kid``, ``sib``; ``last``: last child) and the legs
    ending there (``ends``). Marks in ``keep`` the rows that begin a node; returns ``m``."""
    kid[0], last[0] = -1, -1
    m = 0
    base = ptr[lo]
    for leg in range(lo, hi):
        cur = 0
        for q in range(ptr[leg] - base, ptr[leg + 1] - base):
            lk = link[q]
            c = kid[cur]
            while c >= 0 and node_link[c] != lk:
                c = sib[c]
            new = c < 0
            if new:
                m += 1
                c = m
                node_link[c], kid[c], sib[c], last[c], up[c], ends[c] = lk, -1, -1, -1, cur, 0
                if last[cur] < 0:
                    kid[cur] = c
                else:
                    sib[last[cur]] = c
                last[cur] = c
            keep[q] = new
            cur = c
        if ptr[leg + 1] > ptr[leg]:
            ends[cur] += 1
    return m


@njit(nogil=True)
def _merged(lo, hi, ptr, link, offset, stamp, at, i, out_link, out_offset, w, tree, t):  # pragma: no cover - compiled
    """The rows of reduction legs ``lo:hi`` of record ``i`` (rows as :func:`_trie`'s) merged one per link, in order
    of first appearance, written to ``out_link``/``out_offset`` from ``w`` on and their tree rows from ``t``; returns
    their count (``stamp``/``at``: per link, the record that last saw it and where its row is)."""
    m = 0
    base = ptr[lo]
    charged = -1  # the first link of the last leg that has one: it carries the reduction's wait on the critical path
    for leg in range(lo, hi):
        first_q, end_q = ptr[leg] - base, ptr[leg + 1] - base
        for q in range(first_q, end_q):
            lk, off = link[q], offset[q]
            if q == first_q:
                charged = lk
            role = (FIRST if q == first_q else 0) | (LAST if q + 1 == end_q else 0)
            if stamp[lk] != i:
                stamp[lk], at[lk] = i, m
                out_link[w + m], out_offset[w + m] = lk, off
                tree[t + m, UP], tree[t + m, SPAN], tree[t + m, ROLE], tree[t + m, ENDS] = -1, 0, role, 0
                m += 1
            else:
                r = t + at[lk]
                first = out_offset[w + at[lk]]
                lowest, highest = min(first, off), max(first + tree[r, SPAN], off)
                out_offset[w + at[lk]] = lowest
                tree[r, SPAN], tree[r, ROLE] = highest - lowest, tree[r, ROLE] | role
    if charged >= 0:
        tree[t + at[charged], ENDS] = 1
    return m


@njit(nogil=True, depends=(topology,))
def _tries(first_leg, ptr, legs, geometry, kind, links, link, offset, tree_at, tree):  # pragma: no cover - compiled
    """Walk every record's legs (:func:`.topology.walk`; ``legs``, ``geometry`` and ``ptr`` as :func:`.topology.plan`
    gives them) into a buffer of one record's rows and write its kept rows to ``link``/``offset``, in order, its
    tree rows (if it is one) to ``tree`` and its first tree row, or -1, to ``tree_at``. Returns (rows each record
    keeps, tree rows in all). A record is a tree when it is a :data:`MULTICAST` and two of its legs share a
    path's first links, or a :data:`REDUCTION` with a link row (``links``: more than any link id)."""
    n = len(first_leg) - 1
    widest = 0
    for i in range(n):
        widest = max(widest, ptr[first_leg[i + 1]] - ptr[first_leg[i]])
    node_link, kid, sib = np.empty(widest + 1, np.int64), np.empty(widest + 1, np.int64), np.empty(widest + 1, np.int64)
    last, up, ends = np.empty(widest + 1, np.int64), np.empty(widest + 1, np.int64), np.empty(widest + 1, np.int64)
    keep = np.ones(widest, dtype=np.bool_)
    one_link, one_offset = np.empty(widest, np.int32), np.empty(widest, np.int32)
    kept = np.empty(n, dtype=np.int64)
    stamp, at = np.full(links, -1, np.int64), np.empty(links, np.int64)
    total = 0
    w = 0  # the next kept row's place
    for i in range(n):
        lo, hi = first_leg[i], first_leg[i + 1]
        rows = ptr[hi] - ptr[lo]
        walk(lo, hi, ptr, ptr[lo], legs, geometry, one_link, one_offset)
        tree_at[i] = -1
        if kind[i] == REDUCTION and rows:
            m = _merged(lo, hi, ptr, one_link, one_offset, stamp, at, i, link, offset, w, tree, total)
            kept[i], tree_at[i] = m, total
            w += m
            total += m
            continue
        m = rows
        if kind[i] == MULTICAST and hi - lo > 1:
            m = _trie(lo, hi, ptr, one_link, node_link, kid, sib, last, up, ends, keep)
        kept[i] = m
        for k in range(rows):
            if m == rows or keep[k]:
                link[w], offset[w] = one_link[k], one_offset[k]
                w += 1
        if m < rows:
            tree_at[i] = total
            for c in range(1, m + 1):
                t = total + c - 1
                tree[t, UP], tree[t, ENDS] = up[c] - 1, ends[c]  # node c is row c - 1; the root, -1
                tree[t, KID], tree[t, SIB] = max(kid[c] - 1, -1), max(sib[c] - 1, -1)
            total += m
    return kept, total


def build(rec: np.ndarray, routes: Routes, walks: Walk, links: int, kind: np.ndarray) -> tuple[
        np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(link rows per record kept, per record its first tree row or -1, tree rows (rows, 4) int32, the kept rows'
    links and offsets, record by record) of legs whose records ``rec`` are sorted, planned by
    :func:`.topology.plan` (``routes``, ``walks``; ``links``: more than any link id); ``kind`` per record says what
    its legs merge into (:data:`MULTICAST`: legs leaving one PE at once; :data:`REDUCTION`: legs meeting at one PE;
    0: none). The legs' rows are walked one record at a time: the rows the merges drop are never stored, and the
    arrays are allocated for every row but shrunk to the kept ones (the pages past them are never touched)."""
    n = len(kind)
    first_leg = np.searchsorted(rec, np.arange(n + 1)).astype(np.int64)
    rows = int(routes.ptr[-1])
    merging = np.repeat(kind, np.diff(first_leg)) != 0
    bound = int(np.diff(routes.ptr)[merging].sum())
    link, offset = np.empty(rows, np.int32), np.empty(rows, np.int32)
    tree, tree_at = np.empty((bound, 4), np.int32), np.empty(n, np.int64)
    kept, total = _tries(first_leg, routes.ptr, walks.legs, walks.geometry, kind, links, link, offset, tree_at, tree)
    for a, size in ((link, int(kept.sum())), (offset, int(kept.sum())), (tree, (total, 4))):
        a.resize(size, refcheck=False)  # made here, no view of them exists: shrunk in place
    return kept, tree_at, tree, link, offset


def legs(link_ptr: np.ndarray, link_offset: np.ndarray, tree_at: np.ndarray, tree: np.ndarray) -> tuple[
        np.ndarray, np.ndarray]:
    """(parent row, legs ending there) of every link row: the row before it within a leg (-1 at a leg's first row)
    and 1 at a leg's last row; a tree row's :data:`UP` (relative to its record's first row; -1 at a root) and
    :data:`ENDS`."""
    rows = len(link_offset)
    up = np.where(link_offset > 0, np.arange(rows, dtype=np.int64) - 1, -1)
    ends = np.r_[link_offset[1:] == 0, True].astype(np.int64) if rows else np.zeros(0, np.int64)
    trees = np.flatnonzero(tree_at >= 0)
    size = link_ptr[trees + 1] - link_ptr[trees]
    row, t, first = ranges(link_ptr[trees], size), ranges(tree_at[trees], size), np.repeat(link_ptr[trees], size)
    rel = tree[t, UP].astype(np.int64)
    up[row] = np.where(rel >= 0, first + rel, -1)
    ends[row] = tree[t, ENDS]
    return up, ends
