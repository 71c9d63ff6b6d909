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

    leg: np.ndarray  # int64 leg index of each row (rows grouped by leg, in path order)
    link: np.ndarray  # int64 link id
    offset: np.ndarray  # int64 cycles from injection until the head enters the link
    mesh_hops: np.ndarray  # per leg: PE-mesh hops (both CTs' meshes for a die-to-die leg)
    pkg_hops: np.ndarray  # per leg: die-to-die links crossed (controller link included)
    latency: np.ndarray  # per leg: head latency in cycles (sum of link latencies)


def _dim_order(t: Topology, x0, y0, x1, y1, step_cycles, start, node_of, link_of):
    """Rows of dimension-order walks (x0,y0)->(x1,y1): (leg, link, offset, position on the walk, hops per leg)."""
    hx, hy = np.abs(x1 - x0), np.abs(y1 - y0)
    first_x = t.routing == "xy"
    n = len(x0)
    legs, links, offs, pos = [], [], [], []
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
        pos.append(prior[leg] + k)
        offs.append(start[leg] + pos[-1] * step_cycles)
    return np.concatenate(legs), np.concatenate(links), np.concatenate(offs), np.concatenate(pos), hx + hy


def route_legs(t: Topology, src_ct, src_pe, dst_ct, dst_pe) -> Routes:
    """Routes of legs (src_ct, src_pe) -> (dst_ct, dst_pe); ``CONTROLLER`` CTs allowed.

    Rows come leg by leg, each leg's links in the order its head crosses them.
    """
    src_ct, dst_ct = np.asarray(src_ct, np.int64), np.asarray(dst_ct, np.int64)
    src_pe, dst_pe = np.asarray(src_pe, np.int64), np.asarray(dst_pe, np.int64)
    n = len(src_ct)
    s_ctl, d_ctl = src_ct == CONTROLLER, dst_ct == CONTROLLER
    cross = (src_ct != dst_ct) | s_ctl | d_ctl
    zero = np.zeros(n, dtype=np.int64)
    # on-CT part at the source: src -> port (0) when crossing, src -> dst otherwise (none from the controller)
    a_ok = ~s_ctl
    a = _mesh_part(t, np.where(a_ok, src_ct, 0), np.where(a_ok, src_pe, 0),
                   np.where(a_ok, np.where(cross, 0, dst_pe), 0), zero)
    t_a = a[4] * t.hop_cycles
    # controller link in, package path, controller link out, on-CT part at the destination
    ctl_in, ctl_out = (cross & s_ctl).astype(np.int64), (cross & d_ctl).astype(np.int64)
    t_in = t_a + ctl_in * t.d2d_cycles
    p = _package_part(t, np.where(s_ctl, 0, src_ct), np.where(d_ctl, 0, dst_ct), t_in, cross)
    t_p = t_in + p[4] * t.d2d_cycles
    t_out = t_p + ctl_out * t.d2d_cycles
    b_ok = cross & ~d_ctl
    b = _mesh_part(t, np.where(b_ok, dst_ct, 0), zero, np.where(b_ok, dst_pe, 0), t_out)
    counts = np.stack([a[4], ctl_in, p[4], ctl_out, b[4]])
    part_base = np.cumsum(counts, axis=0) - counts
    total = counts.sum(axis=0)
    leg_base = np.cumsum(total) - total
    ci, co = np.flatnonzero(ctl_in), np.flatnonzero(ctl_out)
    parts = [(a[0], a[1], a[2], a[3]), (ci, np.full(len(ci), t.ctl_link), t_a[ci], np.zeros(len(ci), np.int64)),
             (p[0], p[1], p[2], p[3]), (co, np.full(len(co), t.ctl_link + 1), t_p[co], np.zeros(len(co), np.int64)),
             (b[0], b[1], b[2], b[3])]
    rows = int(total.sum())
    leg, link, off = np.empty(rows, np.int64), np.empty(rows, np.int64), np.empty(rows, np.int64)
    for i, (pl, pk, po, pp) in enumerate(parts):
        at = leg_base[pl] + part_base[i][pl] + pp
        leg[at], link[at], off[at] = pl, pk, po
    latency = t_out + b[4] * t.hop_cycles
    return Routes(leg, link, off, a[4] + b[4], p[4] + ctl_in + ctl_out, latency)


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
