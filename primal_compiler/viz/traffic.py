"""Traffic heat-maps: bytes carried by every mesh link and die-to-die link over one section.

A record's legs may cross a link more than once (a multicast's branches
share their first links, a reduction's members their last, see
:mod:`primal_compiler.executor.transfers`); :func:`link_bytes` counts each
link once per record with the record's ``nbytes``, as the executor's energy
model does. It walks the legs' routes itself (:func:`.topology.walk`), so a
replay read from the cache needs no link rows: each record's distinct links
are its rows' (the trees only drop repeats), added record by record. Drawn per phase (decode step, prefill): the mesh of the busiest
CT (directed links as offset segments, width and colour by bytes, the
hottest marked) and the package grid with its die-to-die links; below, the
mesh bytes of every CT as bars.
"""

from __future__ import annotations

import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.colors import LogNorm

from primal_compiler.executor import topology
from primal_compiler.jit import njit
from primal_compiler.viz import style
from primal_compiler.viz.data import VizData

HOTTEST = 5  # links marked in each panel


@njit(nogil=True, depends=(topology,))
def _link_bytes(first_leg, ptr, legs, geometry, nbytes, lo, hi, num_links):  # pragma: no cover - compiled
    """Bytes per link over records ``lo:hi`` whose legs are ``first_leg[i]:first_leg[i + 1]`` (routes ``ptr``,
    ``legs``, ``geometry`` as :func:`.topology.plan` gives them): each link a record's legs cross, once."""
    out = np.zeros(num_links, dtype=np.float64)
    last = np.full(num_links, -1, dtype=np.int64)
    widest = 0
    for i in range(lo, hi):
        widest = max(widest, ptr[first_leg[i + 1]] - ptr[first_leg[i]])
    link, off = np.empty(widest, np.int32), np.empty(widest, np.int32)
    for i in range(lo, hi):
        a, b = first_leg[i], first_leg[i + 1]
        topology.walk(a, b, ptr, ptr[a], legs, geometry, link, off)
        for k in range(ptr[b] - ptr[a]):
            lk = link[k]
            if last[lk] != i:
                last[lk] = i
                out[lk] += nbytes[i]
    return out


def link_bytes(d: VizData, rec_lo: int, rec_hi: int) -> np.ndarray:
    """Bytes per link id over records ``[rec_lo, rec_hi)`` (each link once per record)."""
    tr, topo = d.rp.transfers, d.rp.topo
    first_leg = np.searchsorted(tr.rec, np.arange(rec_lo, rec_hi + 1)).astype(np.int64)  # legs of these records
    a, b = int(first_leg[0]), int(first_leg[-1])
    routes, walks = topology.plan(topo, tr.src_ct[a:b], tr.src_pe[a:b], tr.dst_ct[a:b], tr.dst_pe[a:b])
    nb = d.stream.records["nbytes"][rec_lo:rec_hi].astype(np.float64)
    return _link_bytes(first_leg - a, routes.ptr, walks.legs, walks.geometry, nb, 0, rec_hi - rec_lo, topo.num_links)


def section_bounds(d: VizData, name: str) -> tuple[int, int] | None:
    for s in d.stream.sections:
        if s.name == name:
            return s.start, s.stop
    return None


def phases(d: VizData) -> list[tuple[str, np.ndarray]]:
    """(title, bytes per link) of the first decode step and the first prefill."""
    out = []
    for title, name in (("decode step", "decode:0"), ("prefill", "prefill:0")):
        b = section_bounds(d, name)
        if b:
            out.append((f"{title} ({name})", link_bytes(d, *b)))
    return out


def _segments(x0, y0, d, shift=0.12, length=0.8):
    """Segments of directed links leaving (x0, y0) in direction d (0 +x, 1 -x, 2 +y, 3 -y), offset by direction."""
    dx = np.select([d == 0, d == 1], [1.0, -1.0], 0.0)
    dy = np.select([d == 2, d == 3], [1.0, -1.0], 0.0)
    # shift perpendicular to the direction of travel (right-hand side), so a link pair draws as two lines
    px, py = -dy * shift, dx * shift
    gap = (1 - length) / 2
    a = np.stack([x0 + dx * gap + px, y0 + dy * gap + py], 1)
    b = np.stack([x0 + dx * (1 - gap) + px, y0 + dy * (1 - gap) + py], 1)
    return np.stack([a, b], 1)


def _draw_links(ax, seg, val, norm, cmap, hottest_labels: bool = True):
    on = val > 0
    lc = LineCollection(seg[on], cmap=cmap, norm=norm, linewidths=0.5 + 2.5 * (np.log(val[on]) - np.log(norm.vmin))
                        / max(1e-9, np.log(norm.vmax) - np.log(norm.vmin)) if on.any() else 1.0)
    lc.set_array(val[on])
    lc.set_in_layout(False)
    ax.add_collection(lc)
    top = np.argsort(val)[::-1][:HOTTEST]
    top = top[val[top] > 0]
    for rank, k in enumerate(top):
        mid = seg[k].mean(axis=0)
        ax.plot(*mid, marker="o", markersize=9, markerfacecolor="none", markeredgecolor="#e41a1c", markeredgewidth=1.2)
        if hottest_labels:
            ax.annotate(str(rank + 1), mid, xytext=(5, 4), textcoords="offset points", fontsize=7, color="#e41a1c")
    return lc


def mesh_panel(ax, d: VizData, per_link: np.ndarray, title: str):
    """Busiest CT's mesh links for one phase; returns the CT drawn."""
    topo = d.rp.topo
    mesh = per_link[: topo.d2d_base].reshape(topo.num_cts, topo.pes, 4)
    per_ct = mesh.sum(axis=(1, 2))
    ct = int(per_ct.argmax())
    val = mesh[ct].reshape(-1)
    node = np.repeat(np.arange(topo.pes), 4)
    dirs = np.tile(np.arange(4), topo.pes)
    seg = _segments(node % topo.mesh_cols, node // topo.mesh_cols, dirs)
    vmax = max(float(val.max()), 1.0)
    vmin = max(1.0, vmax / 1e4)
    norm = LogNorm(vmin=vmin, vmax=vmax)
    cmap = style.plt.get_cmap("inferno_r")
    lc = _draw_links(ax, seg, np.where(val > 0, np.maximum(val, vmin), 0), norm, cmap)
    used = np.flatnonzero(val > 0) // 4
    x0, x1, y0, y1 = 0, topo.mesh_cols - 1, 0, topo.mesh_rows - 1
    if len(used):  # zoom to the PEs that carry traffic (at least 8 x 8)
        ux, uy = used % topo.mesh_cols, used // topo.mesh_cols
        x1, y1 = min(x1, max(ux.max() + 1, 7)), min(y1, max(uy.max() + 1, 7))
    ax.set_xlim(x0 - 0.7, x1 + 0.7)
    ax.set_ylim(y1 + 0.7, y0 - 0.7)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_facecolor("#fafafa")
    hot = val.max()
    ax.set_title(f"{title}\nCT {ct} ({d.layer_name(ct)}), busiest of {topo.num_cts}: "
                 f"{style.human_bytes(val.sum())} on mesh links, hottest {style.human_bytes(hot)}", fontsize=8)
    ax.figure.colorbar(lc, ax=ax, fraction=0.046, pad=0.02, label="bytes per link")
    return ct


def package_panel(ax, d: VizData, per_link: np.ndarray, title: str) -> None:
    """Die-to-die links on the package grid (and the controller links beside CT 0)."""
    topo = d.rp.topo
    d2d = per_link[topo.d2d_base: topo.ctl_link]
    site = np.repeat(np.arange(topo.grid_sites), 4)
    dirs = np.tile(np.arange(4), topo.grid_sites)
    seg = _segments(site % topo.package_cols, site // topo.package_cols, dirs, shift=0.1, length=0.5)
    # controller links: NMC at (-1, row of CT 0) to CT 0's site and back
    x0, y0 = topo.ct_xy(np.array([0]))
    ctl_seg = _segments(np.array([-1.0, x0[0]]), np.array([float(y0[0])] * 2), np.array([0, 1]), shift=0.1, length=0.5)
    seg = np.concatenate([seg, ctl_seg])
    val = np.concatenate([d2d, per_link[topo.ctl_link: topo.ctl_link + 2]])
    x, y = topo.ct_xy(np.arange(topo.num_cts))
    ax.scatter(x, y, s=max(6, 3000 / topo.grid_sites), marker="s", c="#dddddd", edgecolors="#999999", zorder=0)
    ax.scatter([-1], [y0[0]], s=max(6, 3000 / topo.grid_sites), marker="s", c="#000000", zorder=0)
    vmax = max(float(val.max()), 1.0)
    vmin = max(1.0, vmax / 1e4)
    norm = LogNorm(vmin=vmin, vmax=vmax)
    if (val > 0).any():
        lc = _draw_links(ax, seg, np.where(val > 0, np.maximum(val, vmin), 0), norm,
                         style.plt.get_cmap("viridis_r"), hottest_labels=False)
        ax.figure.colorbar(lc, ax=ax, fraction=0.046, pad=0.02, label="bytes per link")
    ax.set_xlim(-1.7, topo.package_cols - 0.3)
    ax.set_ylim(y.max() + 0.7, -0.9)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(f"{title}: die-to-die and controller links\n{style.human_bytes(val.sum())} over "
                 f"{int((val > 0).sum())} links (circled: hottest)", fontsize=8)


def per_ct_panel(ax, d: VizData, sets: list[tuple[str, np.ndarray]]) -> None:
    topo = d.rp.topo
    width = 0.8 / max(1, len(sets))
    per_ct = [per_link[: topo.d2d_base].reshape(topo.num_cts, -1).sum(axis=1) for _, per_link in sets]
    values = np.concatenate(per_ct) if per_ct else np.zeros(0)
    pos = values[values > 0]
    lo = max(1.0, float(pos.min()) / 3) if len(pos) else 1.0
    hi = max(lo * 10, float(values.max()) * 2) if len(values) else 10.0
    for k, ((title, _), v) in enumerate(zip(sets, per_ct)):
        x = np.arange(topo.num_cts) + (k - (len(sets) - 1) / 2) * width - width / 2
        color = style.plt.get_cmap("tab10")(k)
        style.rects(ax, x, width, lo, np.maximum(v - lo, 0), [color])
        ax.plot([], [], color=color, linewidth=6, label=title)
    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    ax.set_xlabel("CT")
    ax.set_ylabel("bytes on its mesh links")
    ax.set_xlim(-0.6, topo.num_cts - 0.4)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=7, frameon=False)
    ax.set_title("mesh traffic per CT", fontsize=8)


def figure(d: VizData, sets: list[tuple[str, np.ndarray]] | None = None):
    """Row 1: busiest CT's mesh per phase; row 2: die-to-die links per phase; row 3: mesh bytes per CT."""
    sets = phases(d) if sets is None else sets
    n = max(1, len(sets))
    fig = style.figure(6.4 * n, 12.0)
    gs = fig.add_gridspec(3, n, height_ratios=[3.0, 2.4, 1.0], hspace=0.3, wspace=0.2)
    for k, (title, per_link) in enumerate(sets):
        mesh_panel(fig.add_subplot(gs[0, k]), d, per_link, title)
        package_panel(fig.add_subplot(gs[1, k]), d, per_link, title)
    per_ct_panel(fig.add_subplot(gs[2, :]), d, sets)
    fig.suptitle(f"Link traffic of {d.meta.get('model')} (circled: {HOTTEST} hottest links, numbered by rank)",
                 fontsize=10)
    return fig


def render(d: VizData, out, formats: tuple[str, ...]) -> list[str]:
    return style.save(figure(d), out, "traffic", formats)
