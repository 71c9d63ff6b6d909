"""XY routes: hop counts, link ids and head offsets."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from primal_compiler.executor.topology import MESH, Topology, route_legs
from primal_compiler.isa.opcodes import CONTROLLER


def _topo(rows=4, cols=5, cts=7, pcols=3, routing="xy"):
    return Topology(num_cts=cts, mesh_rows=rows, mesh_cols=cols, package_cols=pcols, routing=routing, hop_cycles=2,
                    d2d_cycles=4, mesh_bytes_per_cycle=16.0, d2d_bytes_per_cycle=32.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 19), st.integers(0, 6), st.integers(0, 19)),
                min_size=1, max_size=30), st.sampled_from(["xy", "yx"]))
def test_routes_are_manhattan_and_use_distinct_links(legs, routing):
    t = _topo(routing=routing)
    sct, spe, dct, dpe = (np.array(x) for x in zip(*legs))
    r = route_legs(t, sct, spe, dct, dpe)
    cross = sct != dct
    sx, sy = spe % t.mesh_cols, spe // t.mesh_cols
    dx, dy = dpe % t.mesh_cols, dpe // t.mesh_cols
    on_ct = np.abs(sx - dx) + np.abs(sy - dy)
    via_port = sx + sy + dx + dy
    assert np.array_equal(r.mesh_hops, np.where(cross, via_port, on_ct))
    px, py = t.ct_xy(sct)
    qx, qy = t.ct_xy(dct)
    assert np.array_equal(r.pkg_hops, np.abs(px - qx) + np.abs(py - qy))
    assert np.array_equal(np.diff(r.ptr), r.mesh_hops + r.pkg_hops) and r.ptr[0] == 0
    leg_of = np.repeat(np.arange(len(legs)), np.diff(r.ptr))
    assert (r.link >= 0).all() and (r.link < t.num_links).all()
    for leg in range(len(legs)):
        mine = r.link[leg_of == leg]
        assert len(np.unique(mine)) == len(mine)
        order = np.argsort(r.offset[leg_of == leg])
        offs, kinds = r.offset[leg_of == leg][order], t.link_kind(mine[order])
        step = np.where(kinds == MESH, 2, 4)  # each link delays the head by its own latency
        assert np.array_equal(offs, np.cumsum(step) - step)
    assert np.array_equal(r.latency, r.mesh_hops * 2 + r.pkg_hops * 4)


def test_controller_legs_use_the_controller_link():
    t = _topo()
    r = route_legs(t, np.array([CONTROLLER, 3]), np.array([0, 6]), np.array([3, CONTROLLER]), np.array([6, 0]))
    assert (r.link == t.ctl_link).sum() == 1 and (r.link == t.ctl_link + 1).sum() == 1
    x, y = t.ct_xy(np.array([3]))
    assert r.pkg_hops.tolist() == [1 + x[0] + y[0]] * 2
