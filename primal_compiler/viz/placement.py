"""Placement maps: every PE of a CT coloured by the weight tile it holds, and the package overview.

Layout is deterministic: in a CT map the PE ``row * cols + col`` is the cell
centred on data coordinates ``(col, row)`` (row 0 at the top), filled with
:data:`~.style.ROLE_COLORS` of its RRAM tile's role, else the hub, KV-only or
empty colour. A PE hosting a LoRA A (B) SRAM tile gets a small black (white)
square in its top-right corner; a weight PE that also holds KV chunks a
dark-green dot bottom-left. Lines mark block boundaries (neighbours with
different labels). :func:`cell_center_px` maps a PE to figure pixels.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.artist import Artist
from matplotlib.collections import LineCollection
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from primal_compiler.ir.tiles import ROLE_CODES
from primal_compiler.viz import style
from primal_compiler.viz.data import HUB, LORA_A, LORA_B, VizData, pe_kv, pe_lora, pe_roles

LABEL_NAMES = [r.value for r in ROLE_CODES] + ["hub", "KV cache", "empty"]


def label_colors() -> np.ndarray:
    """RGB of every PE label (role indices, then HUB, KV_ONLY, EMPTY)."""
    cols = [style.ROLE_COLORS.get(r.value, "#000000") for r in ROLE_CODES]
    cols += [style.HUB_COLOR, style.KV_COLOR, style.EMPTY_COLOR]
    return np.array([style.rgb(c) for c in cols])


def _boundaries(label: np.ndarray) -> np.ndarray:
    """Segments between horizontally or vertically adjacent cells with different labels."""
    rows, cols = label.shape
    segs = []
    r, c = np.nonzero(label[:, 1:] != label[:, :-1])  # vertical line between (r, c) and (r, c+1)
    segs.append(np.stack([np.stack([c + 0.5, r - 0.5], 1), np.stack([c + 0.5, r + 0.5], 1)], 1))
    r, c = np.nonzero(label[1:, :] != label[:-1, :])  # horizontal line between (r, c) and (r+1, c)
    segs.append(np.stack([np.stack([c - 0.5, r + 0.5], 1), np.stack([c + 0.5, r + 0.5], 1)], 1))
    return np.concatenate(segs) if segs else np.zeros((0, 2, 2))


def draw_ct(ax, d: VizData, ct: int, legend: bool = True) -> None:
    """The placement map of CT ``ct`` on ``ax``."""
    rows, cols = d.rows, d.cols
    label = pe_roles(d, ct).reshape(rows, cols)
    ax.imshow(label_colors()[label], interpolation="nearest", origin="upper",
              extent=(-0.5, cols - 0.5, rows - 0.5, -0.5))
    edges = LineCollection(list(_boundaries(label)), colors="#222222", linewidths=0.6)
    edges.set_in_layout(False)
    ax.add_collection(edges)
    ax.add_patch(Rectangle((-0.5, -0.5), cols, rows, fill=False, edgecolor="#222222", linewidth=1.0))
    lora = pe_lora(d, ct).reshape(rows, cols)
    ms = max(4.0, 160.0 / max(rows, cols)) ** 2 / 4
    for bit, name in ((LORA_A, "A"), (LORA_B, "B")):
        r, c = np.nonzero(lora & bit)
        dx = 0.27 if bit == LORA_A else 0.27
        dy = -0.27 if bit == LORA_A else 0.0
        ax.scatter(c + dx, r + dy, s=ms, marker="s", c=style.LORA_COLORS[name], edgecolors="#000000",
                   linewidths=0.3, zorder=3)
    kv = pe_kv(d, ct).reshape(rows, cols) & (label < HUB)
    r, c = np.nonzero(kv)
    ax.scatter(c - 0.27, r + 0.27, s=ms * 0.6, marker="o", c=style.KV_DOT, linewidths=0, zorder=3)
    ax.set_xlim(-0.5, cols - 0.5)
    ax.set_ylim(rows - 0.5, -0.5)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    used = int((label < HUB).sum())
    ax.set_title(f"CT {ct} ({d.layer_name(ct)}): {used} weight PEs", fontsize=9)
    if legend:
        present = sorted(set(np.unique(label).tolist()))
        handles: list[Artist] = [Patch(facecolor=label_colors()[k], edgecolor="#222222", label=LABEL_NAMES[k])
                                 for k in present]
        handles += [Line2D([], [], marker="s", linestyle="", markerfacecolor=style.LORA_COLORS[n],
                           markeredgecolor="#000000", markersize=5, label=f"LoRA {n} (SRAM)")
                    for n, bit in (("A", LORA_A), ("B", LORA_B)) if (lora & bit).any()]
        if kv.any():
            handles.append(Line2D([], [], marker="o", linestyle="", color=style.KV_DOT, markersize=4,
                                  label="+ KV chunks"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)


def ct_figure(d: VizData, ct: int):
    """(figure, axes) of one CT's map at a fixed pixel layout (see :func:`cell_center_px`)."""
    fig = style.figure(7.5, 6.0)
    ax = fig.add_axes((0.04, 0.04, 0.66, 0.9))
    draw_ct(ax, d, ct)
    return fig, ax


def cell_center_px(fig, ax, pe: int, cols: int) -> tuple[int, int]:
    """(x, y) pixel of PE ``pe``'s cell centre in the figure saved without tight bounding box (y from the top)."""
    fig.canvas.draw()
    x, y = ax.transData.transform((pe % cols, pe // cols))
    height = fig.get_size_inches()[1] * fig.dpi
    return int(round(x)), int(round(height - y))


def draw_overview(ax, d: VizData, mark: Sequence[int] = ()) -> None:
    """Package grid: each CT at its snake position, coloured by layer, the controller beside CT 0."""
    topo = d.rp.topo
    ct = np.arange(d.num_cts)
    x, y = topo.ct_xy(ct)
    layer = d.arrays["ct_layer"][ct]
    cmap = style.plt.get_cmap("tab20")
    for i in ct:
        head = layer[i] >= d.num_layers
        color = "#7f7f7f" if head else cmap(int(layer[i]) % 20)
        ax.add_patch(Rectangle((x[i] - 0.45, y[i] - 0.45), 0.9, 0.9, facecolor=color,
                               edgecolor="#e41a1c" if i in mark else "#333333", linewidth=2.0 if i in mark else 0.4))
        fs = 7 if d.num_cts <= 64 else 4.5
        ax.text(x[i], y[i], "H" if head else str(int(layer[i])), ha="center", va="center", fontsize=fs,
                color="white" if head else "black")
    ax.plot(x, y, color="#555555", linewidth=0.4, alpha=0.6, zorder=0)
    ax.add_patch(Rectangle((-1.45, -0.45), 0.9, 0.9, facecolor="#000000"))
    ax.text(-1.0, 0, "NMC", ha="center", va="center", fontsize=5, color="white")
    for k in mark:
        ax.annotate(f"CT {k}", (x[k], y[k] - 0.45), fontsize=6, color="#e41a1c", ha="center", va="bottom",
                    xytext=(0, 1), textcoords="offset points")
    ax.set_xlim(-1.6, topo.package_cols - 0.4)
    ax.set_ylim(y.max() + 0.6, -0.9)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(f"{d.meta.get('model')}: {d.num_cts} CTs, layer of each CT (H = LM head)", fontsize=9)


def overview_figure(d: VizData, picks: list[int]):
    fig = style.figure(6.0, 6.0)
    draw_overview(fig.add_subplot(1, 1, 1), d, picks)
    return fig


def combined_figure(d: VizData, picks: list[int]):
    """The overview next to the representative CTs' maps (one picture for the README)."""
    n = len(picks)
    ncols = min(4, n)
    nrows = -(-n // ncols)
    fig = style.figure(4.2 + 4.6 * ncols, 4.0 * nrows + 0.6)
    gs = fig.add_gridspec(nrows, ncols + 1, width_ratios=[1.1] + [1.0] * ncols, wspace=0.08, hspace=0.15)
    draw_overview(fig.add_subplot(gs[:, 0]), d, picks)
    for k, ct in enumerate(picks):
        draw_ct(fig.add_subplot(gs[k // ncols, 1 + k % ncols]), d, ct, legend=False)
    labels = set()
    for ct in picks:
        labels |= set(np.unique(pe_roles(d, ct)).tolist())
    colors = label_colors()
    handles: list[Artist] = [Patch(facecolor=colors[k], edgecolor="#222222", label=LABEL_NAMES[k])
                             for k in sorted(labels)]
    handles += [Line2D([], [], marker="s", linestyle="", markerfacecolor=style.LORA_COLORS[n], markeredgecolor="#000",
                       markersize=5, label=f"LoRA {n} (SRAM)") for n in ("A", "B")]
    handles.append(Line2D([], [], marker="o", linestyle="", color=style.KV_DOT, markersize=4, label="+ KV chunks"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 9), fontsize=8, frameon=False)
    fig.suptitle(f"Placement of {d.meta.get('model')} ({d.meta.get('pipeline')})", fontsize=10)
    return fig


def render(d: VizData, out, formats: tuple[str, ...], picks: list[int]) -> list[str]:
    """placement.FMT (overview + maps), placement_overview.FMT and placement_ctNNN.FMT per pick, in each format."""
    names = style.save(combined_figure(d, picks), out, "placement", formats)
    names += style.save(overview_figure(d, picks), out, "placement_overview", formats)
    for ct in picks:
        fig, _ = ct_figure(d, ct)
        names += style.save(fig, out, f"placement_ct{ct:03d}", formats, tight=False)
    return names
