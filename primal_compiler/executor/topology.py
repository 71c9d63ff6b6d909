"""Where transfers go: XY routes on each CT's PE mesh and on the package mesh of CTs.

Positions are (CT, PE) with PE = row * mesh_cols + col; the controller (NMC)
is ``CONTROLLER``. Every CT has ``d2d.ports_per_ct`` die-to-die ports, PEs of
its north edge (row 0) at columns ``k x mesh_cols / ports`` (:func:`port_pes`;
one port: PE 0, the hub position of the naive layout), where its mesh meets
its package router. A leg between PEs of one CT follows the dimension-order
route of the target (``xy``: columns first, then rows) on that CT's mesh. A
leg between CTs runs on the source CT's mesh to the port nearest its source
PE, over the die-to-die links of the package mesh (XY on the CT grid, CTs in
snake order as the mapping placed them) and from the destination CT's port
nearest its destination PE to that PE (the nearer port of a tie: the one of
lower column). The controller sits beside CT 0 and reaches it over one
controller link per direction.

Link ids: mesh link ``((ct * P + node) * 4 + d)`` leaves ``node`` in direction
``d`` (0 +x, 1 -x, 2 +y, 3 -y); die-to-die link ``D0 + (y * package_cols + x) * 4 + d`` leaves grid site
(x, y) likewise (``D0 = num_cts * P * 4``; a route may cross an empty site of
a partly filled last row); the controller links follow the last site's (to
CT 0, then from CT 0).

A PE's injection and ejection channels (``router.injection_cycles`` and
``router.ejection_cycles``, the terminal channels of a router pipeline) add
to a leg's latency; the local ports they cross (``router.injection_ports``,
``router.ejection_ports``) are resources of the flow model: a leg whose first
link is a PE-mesh link takes one of its source's injection ports, a leg whose
last link is one takes one of its destination's ejection ports
(:func:`local_ports`). The die-to-die port and the controller link are ports
of their own.

Every function works on a leg set at once (:func:`plan` and :func:`walk` as
compiled loops over its legs): a leg set expands to one row per (leg, link)
with the cycle offset at which the leg's head enters the link.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from primal_compiler.isa.opcodes import CONTROLLER
from primal_compiler.jit import njit

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
    terminal_cycles: int = 0  # a PE's injection plus ejection channel, added to every leg between PEs
    ports: tuple[int, ...] = (0,)  # PEs of each CT's die-to-die ports (port_pes)

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
    """(leg, link) rows of a leg set plus per-leg hop counts and zero-load latency; :func:`plan` leaves the rows
    (``link``, ``offset``) empty and says in ``ptr`` how many each leg has."""

    ptr: np.ndarray  # int64 CSR: leg i's rows are ptr[i]:ptr[i + 1], in path order
    link: np.ndarray  # int32 link id
    offset: np.ndarray  # int32 cycles from injection until the head enters the link
    mesh_hops: np.ndarray  # per leg: PE-mesh hops (both CTs' meshes for a die-to-die leg)
    pkg_hops: np.ndarray  # per leg: die-to-die links crossed (controller link included)
    latency: np.ndarray  # per leg: head latency in cycles (link latencies plus the terminal channels)


def port_pes(mesh_cols: int, ports: int) -> tuple[int, ...]:
    """The PEs of a CT's ``ports`` die-to-die ports: row 0, columns ``k x mesh_cols // ports``."""
    return tuple(k * mesh_cols // ports for k in range(ports))


@dataclass(frozen=True)
class Walk:
    """What the compiled walk of a leg set's link rows reads (:func:`plan`): per leg, its endpoints and the
    die-to-die ports its route uses, int64 (``legs``); the topology's constants (``geometry``)."""

    legs: tuple[np.ndarray, ...]  # src_ct, src_pe, dst_ct, dst_pe, src_port, dst_port
    geometry: tuple[int, ...]  # mesh_cols, pes, package_cols, xy (1) or yx (0), hop, d2d cycles, d2d_base, ctl_link, CONTROLLER


def plan(t: Topology, src_ct, src_pe, dst_ct, dst_pe) -> tuple[Routes, Walk]:
    """Routes of legs (src_ct, src_pe) -> (dst_ct, dst_pe) without their link rows (``link`` and ``offset``
    empty; ``ptr`` says how many each leg has), and what :func:`walk` needs to write them; ``CONTROLLER`` CTs
    allowed. Hop counts and latencies are closed forms, one compiled pass over the legs (no temporaries of the
    legs' length: Llama-2-70B has 10.5 M legs)."""
    src_ct, dst_ct = np.asarray(src_ct, np.int64), np.asarray(dst_ct, np.int64)
    src_pe, dst_pe = np.asarray(src_pe, np.int64), np.asarray(dst_pe, np.int64)
    n = len(src_ct)
    s_port, d_port, rows, mesh, pkg, latency = (np.empty(n, np.int64) for _ in range(6))
    _plan(src_ct, src_pe, dst_ct, dst_pe, np.asarray(t.ports, np.int64), t.mesh_cols, t.package_cols, CONTROLLER,
          t.hop_cycles, t.d2d_cycles, t.terminal_cycles, s_port, d_port, rows, mesh, pkg, latency)
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(rows, out=ptr[1:])
    del rows
    none = np.zeros(0, np.int32)
    routes = Routes(ptr, none, none, mesh, pkg, latency)
    geometry = (t.mesh_cols, t.pes, t.package_cols, int(t.routing == "xy"), t.hop_cycles, t.d2d_cycles, t.d2d_base,
                t.ctl_link, CONTROLLER)
    return routes, Walk((src_ct, src_pe, dst_ct, dst_pe, s_port, d_port), geometry)


@njit(nogil=True)
def _nearest(pe, ports, cols):  # pragma: no cover - compiled
    """(the port PE of ``ports`` nearest ``pe``, its hops): XY distance on the CT mesh, ties to the first listed
    (:func:`port_pes` lists them by column)."""
    best, hops = ports[0], -1
    for k in range(len(ports)):
        h = abs(pe % cols - ports[k] % cols) + abs(pe // cols - ports[k] // cols)
        if hops < 0 or h < hops:
            best, hops = ports[k], h
    return best, hops


@njit(nogil=True)
def _plan(sct, spe, dct, dpe, ports, cols, pcols, ctl, hop, d2d, terminal, s_port, d_port, rows, mesh, pkg,
          latency):  # pragma: no cover - compiled
    """Per leg: the die-to-die ports its route leaves and enters by (0 where it uses none), its link rows, its
    PE-mesh hops (both CTs' meshes for a leg between CTs), its die-to-die links (the controller link included)
    and its head latency (link latencies, plus a PE's terminal channels when it crosses a link)."""
    for i in range(len(sct)):
        s_ctl, d_ctl = sct[i] == ctl, dct[i] == ctl
        cross = s_ctl or d_ctl or sct[i] != dct[i]
        a, b, p = 0, 0, 0
        s_port[i], d_port[i] = 0, 0
        if cross:
            if not s_ctl:
                s_port[i], a = _nearest(spe[i], ports, cols)
            if not d_ctl:
                d_port[i], b = _nearest(dpe[i], ports, cols)
            ax, ay = _grid(0 if s_ctl else sct[i], pcols)
            bx, by = _grid(0 if d_ctl else dct[i], pcols)
            p = abs(ax - bx) + abs(ay - by) + int(s_ctl) + int(d_ctl)
        else:
            a = abs(spe[i] % cols - dpe[i] % cols) + abs(spe[i] // cols - dpe[i] // cols)
        rows[i], mesh[i], pkg[i] = a + b + p, a + b, p
        latency[i] = (a + b) * hop + p * d2d + (terminal if a + b + p > 0 else 0)


def route_legs(t: Topology, src_ct, src_pe, dst_ct, dst_pe) -> Routes:
    """Routes of legs (src_ct, src_pe) -> (dst_ct, dst_pe) (:func:`plan`) with their link rows: from one compiled
    walk (:func:`walk`), leg by leg, each leg's links in the order its head crosses them."""
    routes, w = plan(t, src_ct, src_pe, dst_ct, dst_pe)
    link = np.empty(int(routes.ptr[-1]), dtype=np.int32)
    off = np.empty(int(routes.ptr[-1]), dtype=np.int32)
    walk(0, len(routes.ptr) - 1, routes.ptr, 0, w.legs, w.geometry, link, off)
    return replace(routes, link=link, offset=off)


@njit(nogil=True)
def _steps(x0, y0, x1, y1, x_first, q, t, step, base, stride_y, link, off, ct_base):  # pragma: no cover
    """Append the dimension-order walk (x0,y0)->(x1,y1) at row q and time t; returns (q, t).

    A link id is ``base + (ct_base + site) * 4 + direction`` with site ``y * stride_y + x``.
    """
    for phase in range(2):
        along_x = (phase == 0) == x_first
        forward = x1 > x0 if along_x else y1 > y0
        d = (0 if along_x else 2) + (0 if forward else 1)  # +x, -x, +y, -y
        delta = 1 if forward else -1
        while (x0 != x1) if along_x else (y0 != y1):
            link[q] = base + (ct_base + y0 * stride_y + x0) * 4 + d
            off[q] = t
            q += 1
            t += step
            if along_x:
                x0 += delta
            else:
                y0 += delta
    return q, t


@njit(nogil=True)
def _grid(ct, pcols):  # pragma: no cover - compiled
    row = ct // pcols
    col = ct % pcols if row % 2 == 0 else pcols - 1 - ct % pcols
    return col, row


@njit(nogil=True)
def walk(lo, hi, ptr, shift, legs, geometry, link, off):  # pragma: no cover - compiled
    """Write the link rows of legs ``lo:hi`` (:func:`plan`'s ``legs`` and ``geometry``; leg ``i``'s rows
    ``ptr[i]:ptr[i + 1]``) to ``link``/``off`` from row ``ptr[i] - shift`` on (see the module docstring)."""
    sct, spe, dct, dpe, sport, dport = legs
    cols, pes, pcols, xy, hop, d2d, d2d_base, ctl_link, ctl = geometry
    x_first = xy == 1
    for i in range(lo, hi):
        q, t = ptr[i] - shift, 0
        s_ctl, d_ctl = sct[i] == ctl, dct[i] == ctl
        cross = s_ctl or d_ctl or sct[i] != dct[i]
        if not s_ctl:
            to = sport[i] if cross else dpe[i]
            q, t = _steps(spe[i] % cols, spe[i] // cols, to % cols, to // cols, x_first, q, t, hop, 0, cols,
                          link, off, sct[i] * pes)
        if not cross:
            continue
        if s_ctl:
            link[q], off[q] = ctl_link, t
            q, t = q + 1, t + d2d
        ax, ay = _grid(0 if s_ctl else sct[i], pcols)
        bx, by = _grid(0 if d_ctl else dct[i], pcols)
        q, t = _steps(ax, ay, bx, by, x_first, q, t, d2d, d2d_base, pcols, link, off, 0)
        if d_ctl:
            link[q], off[q] = ctl_link + 1, t
        else:
            _steps(dport[i] % cols, dport[i] // cols, dpe[i] % cols, dpe[i] // cols, x_first, q, t, hop, 0, cols,
                   link, off, dct[i] * pes)


def local_ports(t: Topology, mesh_ids: np.ndarray, injection_ports: int,
                ejection_ports: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """For the PE-mesh links ``mesh_ids`` (original ids, in the schedule's order): the first row of the
    injection ports of each link's source PE and of the ejection ports of its destination PE, numbered from
    0 over the PEs some link leaves or enters (``injection_ports`` or ``ejection_ports`` rows a PE), and the
    rows of each kind."""
    ids = np.asarray(mesh_ids, dtype=np.int64)
    src = ids // 4
    step = np.array([1, -1, t.mesh_cols, -t.mesh_cols], dtype=np.int64)
    dst = src + step[ids % 4]
    _, inj = np.unique(src, return_inverse=True)
    _, ej = np.unique(dst, return_inverse=True)
    n_inj = int(inj.max()) + 1 if len(inj) else 0
    n_ej = int(ej.max()) + 1 if len(ej) else 0
    return inj * injection_ports, ej * ejection_ports, n_inj * injection_ports, n_ej * ejection_ports
