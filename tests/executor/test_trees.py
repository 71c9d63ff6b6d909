"""Multicast trees (executor/trees.py): a BCAST's legs merged where their paths agree, every leg still there."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from primal_compiler.executor import trees
from primal_compiler.executor.topology import Topology, plan, route_legs


def _topo() -> Topology:
    return Topology(num_cts=4, mesh_rows=4, mesh_cols=4, package_cols=2, routing="xy", hop_cycles=2, d2d_cycles=4,
                    mesh_bytes_per_cycle=16.0, d2d_bytes_per_cycle=32.0)


def _legs(record_of_leg, src, dst, kind):
    """(trees.build's three results, the kept rows' links and offsets, the routes as they were) of legs
    ``(src ct, pe) -> (dst ct, pe)`` of records in order."""
    t = _topo()
    rec = np.asarray(record_of_leg, np.int64)
    ends = [np.asarray(a, np.int64) for a in (*zip(*src), *zip(*dst))]
    r = route_legs(t, *ends)
    kept, tree_at, tree, link, offset = trees.build(rec, *plan(t, *ends), t.num_links, np.asarray(kind, np.int64))
    assert len(link) == len(offset) == int(kept.sum())
    return (kept, tree_at, tree), (link, offset), r


def test_a_hand_drawn_tree():
    """PE 0 to PEs 3, 1, 15 and 3 again on a 4x4 mesh, XY: 0->1 is shared by all, 1->2->3 by legs 0 and 3 (one
    PE twice: two legs end at one row), leg 1 ends at PE 1 where the others pass (a row that ends a leg and has
    children), leg 2 turns south at PE 3 after sharing the row to it."""
    (kept, tree_at, tree), (link, offset), r = _legs([0, 0, 0, 0], [(0, 0)] * 4, [(0, 3), (0, 1), (0, 15), (0, 3)],
                                                     [trees.MULTICAST])
    assert r.ptr.tolist() == [0, 3, 4, 10, 13]
    keep = [True] * 3 + [False] + [False] * 3 + [True] * 3 + [False] * 3
    assert link.tolist() == r.link[keep].tolist() and offset.tolist() == r.offset[keep].tolist()
    assert kept.tolist() == [6] and tree_at.tolist() == [0]
    up, kid, sib, ends = (tree[:, c].tolist() for c in (trees.UP, trees.KID, trees.SIB, trees.ENDS))
    assert up == [-1, 0, 1, 2, 3, 4]  # 0->1, 1->2, 2->3, 3->7, 7->11, 11->15
    assert ends == [1, 0, 2, 0, 0, 1] and kid == [1, 2, 3, 4, 5, -1] and sib == [-1] * 6


def test_a_reduction_keeps_one_row_per_link():
    """PEs 0, 1 and 4 reduce into PE 3 on a 4x4 mesh, XY: 0->1 is PE 0's first link, 1->2 and 2->3 are crossed by
    PEs 0 and 1 at offsets 2 and 0, then 4 and 2 (span 2); 4's leg goes 4->5->6->7 then north 7->3. One row per
    link, at its earliest offset, with the span to its latest; FIRST on the members' first links, LAST on the
    links into PE 3; ENDS at the last member's first link (where the critical path charges the wait)."""
    (kept, tree_at, tree), (link, offset), r = _legs([0, 0, 0], [(0, 0), (0, 1), (0, 4)], [(0, 3)] * 3,
                                                     [trees.REDUCTION])
    legs = [r.link[r.ptr[k]:r.ptr[k + 1]].tolist() for k in range(3)]
    assert legs[1] == legs[0][1:] and len(legs[2]) == 4 and not set(legs[2]) & set(legs[0])
    assert link.tolist() == legs[0] + legs[2] and kept.tolist() == [7] and tree_at.tolist() == [0]
    assert offset.tolist() == [0, 0, 2, 0, 2, 4, 6]
    span, role, up, ends = (tree[:, c].tolist() for c in (trees.SPAN, trees.ROLE, trees.UP, trees.ENDS))
    first, last = trees.FIRST, trees.LAST
    assert span == [0, 2, 2, 0, 0, 0, 0] and up == [-1] * 7 and ends == [0, 0, 0, 1, 0, 0, 0]
    assert role == [first, first, last, first, 0, 0, last]


def test_records_that_share_nothing_are_no_trees():
    """A unicast, a multicast whose legs part at once, and one a record may not merge (its kind 0)."""
    (kept, tree_at, tree), (link, offset), r = _legs([0, 1, 1, 2, 2], [(0, 5)] * 5,
                                                     [(0, 7), (0, 7), (0, 13), (0, 7), (0, 6)],
                                                     [0, trees.MULTICAST, 0])
    assert link.tolist() == r.link.tolist() and offset.tolist() == r.offset.tolist()
    assert kept.tolist() == np.diff(r.ptr[[0, 1, 3, 5]]).tolist()
    assert tree_at.tolist() == [-1, -1, -1] and tree.shape == (0, 4)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 15)), min_size=1, max_size=12),
                min_size=1, max_size=5), st.data())
def test_every_leg_is_a_path_from_a_root_to_a_row_it_ends_at(groups, data):
    """Per record, the kept rows' root-to-row paths where legs end are exactly its legs' paths (as a multiset),
    and no two kept rows of a record stand for the same path: nothing lost, nothing repeated."""
    src = [(data.draw(st.integers(0, 3)), data.draw(st.integers(0, 15))) for _ in groups]
    rec = [i for i, g in enumerate(groups) for _ in g]
    (kept, tree_at, tree), (link, offset), r = _legs(rec, [src[i] for i in rec], [d for g in groups for d in g],
                                                     [trees.MULTICAST] * len(groups))
    ptr = np.r_[0, np.cumsum(kept)]
    up, ends = trees.legs(ptr, offset, tree_at, tree)
    leg_rec = np.asarray(rec)
    for i in range(len(groups)):
        legs = sorted(tuple(r.link[r.ptr[k]:r.ptr[k + 1]].tolist()) for k in np.flatnonzero(leg_rec == i)
                      if r.ptr[k + 1] > r.ptr[k])
        paths, got = set(), []
        for q in range(ptr[i], ptr[i + 1]):
            path, at = [], q
            while at >= 0:
                assert ptr[i] <= at <= q
                path.append(int(link[at]))
                at = up[at]
            paths.add(tuple(path))
            got += [tuple(reversed(path))] * int(ends[q])
        assert len(paths) == ptr[i + 1] - ptr[i] and sorted(got) == legs
