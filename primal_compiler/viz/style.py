"""Colours, figure set-up and saving shared by every picture (matplotlib, Agg backend)."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402

#: Fill colour of a PE by the role of the RRAM tile it holds (keys: ROLE_CODES values).
ROLE_COLORS = {
    "q": "#1f77b4", "k": "#ff7f0e", "v": "#2ca02c", "qkv": "#17becf", "o": "#d62728",
    "gate": "#9467bd", "up": "#8c564b", "down": "#e377c2", "fc1": "#9467bd", "fc2": "#e377c2",
    "embed": "#bcbd22", "pos_embed": "#dbdb8d", "lm_head": "#7f7f7f",
}
HUB_COLOR = "#ffd92f"  # PE holding no weight tile that the mapping uses as a hub
KV_COLOR = "#c7e9c0"  # PE holding only KV-cache chunks
EMPTY_COLOR = "#f2f2f2"  # unused PE
LORA_COLORS = {"A": "#000000", "B": "#ffffff"}  # corner marker of a PE hosting a LoRA A / B SRAM tile
KV_DOT = "#005a32"  # dot on a weight PE that also holds KV chunks

#: Gantt colours of CT power states (plus reconfiguring = CONFIG landing on the CT).
STATE_COLORS = {"active": "#4daf4a", "waking": "#ff7f00", "gated": "#d9d9d9", "reconfiguring": "#e41a1c"}

#: Energy components (metrics.COMPONENT_KEYS) and PE area components.
COMPONENT_COLORS = {
    "rram_adc": "#1f77b4", "base_dcim": "#aec7e8", "sram_dcim": "#ff7f0e", "router_dmac": "#2ca02c", "links": "#d62728",
    "controller": "#9467bd", "wakeup": "#8c564b", "static": "#7f7f7f",
    "rram": "#1f77b4", "sram": "#ff7f0e", "router": "#2ca02c", "dmac": "#17becf", "scratchpad": "#bcbd22",
    "h100_base": "#444444", "h100_lora": "#aaaaaa",
}

DPI = 100


def rgb(color: str) -> tuple[float, float, float]:
    return to_rgb(color)


def figure(width_in: float, height_in: float):
    """A new figure (not registered with pyplot's global state beyond creation; close with :func:`close`)."""
    return plt.figure(figsize=(width_in, height_in), dpi=DPI)


def close(fig) -> None:
    plt.close(fig)


FORMATS = ("png", "svg", "pdf")
"""Picture formats: PNG (raster, what the HTML page inlines first), SVG and PDF (vector, for a paper)."""

_UNDATED = {"png": None, "svg": {"Date": None}, "pdf": {"CreationDate": None}}


def _savefig(fig, target, fmt: str, **kw) -> None:
    """``fig.savefig`` with no date and fixed SVG ids, so the same figure is the same bytes every run."""
    with matplotlib.rc_context({"svg.hashsalt": "primal-compiler"}):
        fig.savefig(target, format=fmt, dpi=DPI, metadata=_UNDATED[fmt], **kw)


def save(fig, out: Path, stem: str, formats: tuple[str, ...], tight: bool = True) -> list[str]:
    """Write ``fig`` as ``out/STEM.FMT`` in each of ``formats`` (of :data:`FORMATS`) and close it; the names
    written, in order. ``tight=False`` keeps the pixel layout."""
    kw = {"bbox_inches": "tight", "pad_inches": 0.1} if tight else {}
    names = []
    for fmt in formats:
        _savefig(fig, out / f"{stem}.{fmt}", fmt, **kw)
        names.append(f"{stem}.{fmt}")
    close(fig)
    return names


def to_bytes(fig, fmt: str) -> bytes:
    buf = io.BytesIO()
    _savefig(fig, buf, fmt, bbox_inches="tight", pad_inches=0.1)
    close(fig)
    return buf.getvalue()


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def rects(ax, left, width, bottom, height, colors, **kw):
    """Axis-aligned rectangles as one PolyCollection (thousands of bars draw in milliseconds, unlike ax.bar)."""
    import numpy as np
    from matplotlib.collections import PolyCollection

    left, width = np.broadcast_arrays(np.asarray(left, float), np.asarray(width, float))
    bottom, height = np.broadcast_arrays(np.asarray(bottom, float), np.asarray(height, float))
    left, width, bottom, height = (np.broadcast_to(a, np.broadcast(left, bottom).shape) for a in (left, width, bottom, height))
    x0, x1, y0, y1 = left, left + width, bottom, bottom + height
    verts = np.stack([np.stack([x0, y0], -1), np.stack([x1, y0], -1), np.stack([x1, y1], -1),
                      np.stack([x0, y1], -1)], 1)
    pc = PolyCollection(verts, facecolors=colors, linewidths=0, **kw)
    pc.set_in_layout(False)  # tight bounding boxes need not visit every rectangle
    ax.add_collection(pc)
    return pc
