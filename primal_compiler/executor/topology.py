"""Where transfers go: XY routes on each CT's PE mesh and on the package mesh of CTs.

Positions are (CT, PE) with PE = row * mesh_cols + col; the controller (NMC)
is ``CONTROLLER``. Every CT has one die-to-die port, at PE 0 (row 0, col 0,
the hub position of the naive layout). A leg between PEs of one CT follows
the dimension-order route of the target (``xy``: columns first, then rows)
on that CT's mesh. A leg between CTs runs on the source CT's mesh to its
port, over the die-to-die links of the package mesh (XY on the CT grid, CTs
in snake order as the mapping placed them) and from the destination CT's port
to the PE. The controller sits beside CT 0 and reaches it over one
controller link per direction.

Link ids: mesh link ``((ct * P + node) * 4 + d)`` leaves ``node`` in direction
``d`` (0 +x, 1 -x, 2 +y, 3 -y); die-to-die link ``D0 + (y * package_cols + x) * 4 + d`` leaves grid site
(x, y) likewise (``D0 = num_cts * P * 4``; a route may cross an empty site of
a partly filled last row); the controller links follow the last site's (to
CT 0, then from CT 0).

Every function is vectorized over legs: a leg set expands to one row per
(leg, link) with the cycle offset at which the leg's head enters the link.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from primal_compiler.isa.opcodes import CONTROLLER

MESH, D2D, CTL = 0, 1, 2  # link kinds


@dataclass(frozen=True)
class Topology:
    """Geometry and link timing of one PRIMAL system; all counts are plain ints."""

    num_cts: int
    mesh_rows: int
    mesh_cols: int
    package_cols: int
    routing: str  # "xy" or "yx"
    hop_cycles: int  # per mesh hop
    d2d_cycles: int  # per die-to-die (or controller) link
    mesh_bytes_per_cycle: float
    d2d_bytes_per_cycle: float

    @property
    def pes(self) -> int:
        return self.mesh_rows * self.mesh_cols

    @property
    def d2d_base(self) -> int:
        return self.num_cts * self.pes * 4

    @property
    def grid_sites(self) -> int:
        """Positions of the package grid (the last row may be partly empty; links still cross it)."""
        return -(-self.num_cts // self.package_cols) * self.package_cols

    @property
    def ctl_link(self) -> int:
        return self.d2d_base + self.grid_sites * 4

    @property
    def num_links(self) -> int:
        return self.ctl_link + 2

    def link_kind(self, link: np.ndarray) -> np.ndarray:
        return np.where(link < self.d2d_base, MESH, np.where(link < self.ctl_link, D2D, CTL)).astype(np.int8)

    def ct_xy(self, ct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Package-grid coordinates of CTs in snake order (as the mapping's layout)."""
        ct = np.asarray(ct, dtype=np.int64)
        row = ct // self.package_cols
        col = np.where(row % 2 == 0, ct % self.package_cols, self.package_cols - 1 - ct % self.package_cols)
        return col, row


@dataclass(frozen=True)
class Routes:
    """(leg, link) rows of a leg set plus per-leg hop counts and zero-load latency."""

    leg: np.ndarray  # int64 leg index of each row
    link: np.ndarray  # int64 link id
    offset: np.ndarray  # int64 cycles from injection until the head enters the link
    mesh_hops: np.ndarray  # per leg: PE-mesh hops (both CTs' meshes for a die-to-die leg)
    pkg_hops: np.ndarray  # per leg: die-to-die links crossed (controller link included)
    latency: np.ndarray  # per leg: head latency in cycles (sum of link latencies)


def _dim_order(t: Topology, x0, y0, x1, y1, step_cycles, start, node_of, link_of):
    """Rows of dimension-order walks (x0,y0)->(x1,y1); returns (leg, link, offset, hops)."""
    hx, hy = np.abs(x1 - x0), np.abs(y1 - y0)
    first_x = t.routing == "xy"
    n = len(x0)
    legs, links, offs = [], [], []
    for dim in ((0, 1) if first_x else (1, 0)):
        h = hx if dim == 0 else hy
        prior = np.zeros(n, dtype=np.int64) if dim == (0 if first_x else 1) else (hx if first_x else hy)
        leg = np.repeat(np.arange(n), h)
        k = np.arange(len(leg)) - np.repeat(np.cumsum(h) - h, h)
        if dim == 0:
            s = np.sign(x1 - x0)[leg]
            x = x0[leg] + s * k
            y = (y0 if first_x else y1)[leg]
            d = np.where(s > 0, 0, 1)
        else:
            s = np.sign(y1 - y0)[leg]
            y = y0[leg] + s * k
            x = (x1 if first_x else x0)[leg]
            d = np.where(s > 0, 2, 3)
        legs.append(leg)
        links.append(link_of(leg, node_of(x, y), d))
        offs.append(start[leg] + (prior[leg] + k) * step_cycles)
    return np.concatenate(legs), np.concatenate(links), np.concatenate(offs), hx + hy


def route_legs(t: Topology, src_ct, src_pe, dst_ct, dst_pe) -> Routes:
    """Routes of legs (src_ct, src_pe) -> (dst_ct, dst_pe); ``CONTROLLER`` CTs allowed."""
    src_ct, dst_ct = np.asarray(src_ct, np.int64), np.asarray(dst_ct, np.int64)
    src_pe, dst_pe = np.asarray(src_pe, np.int64), np.asarray(dst_pe, np.int64)
    n = len(src_ct)
    s_ctl, d_ctl = src_ct == CONTROLLER, dst_ct == CONTROLLER
    cross = (src_ct != dst_ct) | s_ctl | d_ctl
    zero = np.zeros(n, dtype=np.int64)
    # on-CT part at the source: src -> port (0) when crossing, src -> dst otherwise
    a_to = np.where(cross, 0, dst_pe)
    a_ok = ~s_ctl
    a = _mesh_part(t, np.where(a_ok, src_ct, 0), np.where(a_ok, src_pe, 0), np.where(a_ok, a_to, np.where(a_ok, src_pe, 0)), zero)
    a_h = np.where(a_ok, a[3], 0)
    t_a = a_h * t.hop_cycles
    # controller link in, package path, controller link out
    ctl_in = cross & s_ctl
    pkg_src = np.where(s_ctl, 0, src_ct)
    pkg_dst = np.where(d_ctl, 0, dst_ct)
    t_in = t_a + ctl_in * t.d2d_cycles
    p = _package_part(t, pkg_src, pkg_dst, t_in, cross)
    t_p = t_in + p[3] * t.d2d_cycles
    ctl_out = cross & d_ctl
    t_out = t_p + ctl_out * t.d2d_cycles
    b_ok = cross & ~d_ctl
    b = _mesh_part(t, np.where(b_ok, dst_ct, 0), np.zeros(n, np.int64), np.where(b_ok, dst_pe, 0), t_out)
    b_h = np.where(b_ok, b[3], 0)
    keep_a = a_ok[a[0]]
    keep_b = b_ok[b[0]]
    ci, co = np.flatnonzero(ctl_in), np.flatnonzero(ctl_out)
    leg = np.concatenate([a[0][keep_a], ci, p[0], co, b[0][keep_b]])
    link = np.concatenate([a[1][keep_a], np.full(len(ci), t.ctl_link), p[1], np.full(len(co), t.ctl_link + 1), b[1][keep_b]])
    off = np.concatenate([a[2][keep_a], t_a[ci], p[2], t_p[co], b[2][keep_b]])
    latency = t_out + b_h * t.hop_cycles
    return Routes(leg, link, off, a_h + b_h, p[3] + ctl_in + ctl_out, latency)


def _mesh_part(t: Topology, ct, pe0, pe1, start):
    cols, pes = t.mesh_cols, t.pes
    x0, y0, x1, y1 = pe0 % cols, pe0 // cols, pe1 % cols, pe1 // cols

    def node_of(x, y):
        return y * cols + x

    def link_of(leg, node, d):
        return (ct[leg] * pes + node) * 4 + d

    return _dim_order(t, x0, y0, x1, y1, t.hop_cycles, start, node_of, link_of)


def _package_part(t: Topology, ct0, ct1, start, cross):
    x0, y0 = t.ct_xy(ct0)
    x1, y1 = t.ct_xy(ct1)
    x1, y1 = np.where(cross, x1, x0), np.where(cross, y1, y0)

    def link_of(leg, node, d):
        return t.d2d_base + node * 4 + d

    def site(x, y):
        return y * t.package_cols + x

    return _dim_order(t, x0, y0, x1, y1, t.d2d_cycles, start, site, link_of)
