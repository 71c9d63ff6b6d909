"""Hop statistics of a placed layout, for one decode step of the whole model.

Per transfer (flow), hops are the XY Manhattan distance between its PEs on
the CT mesh; co-located transfers count 0. ``max_hops`` is the largest,
``mean_hops`` the mean over transfers, ``weighted_hops`` the bytes-weighted
mean (sum of bytes x hops over sum of bytes) and ``byte_hops`` the sum itself.
Each CT template counts once per CT that uses it. Die-to-die transfers are
reported apart (``inter_ct``) with hops on the package mesh of CTs;
transfers to and from the controller are counted but carry no hops.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from primal_compiler.mapping.layout import CtTemplate, Layout


def template_hops(tp: CtTemplate) -> np.ndarray:
    """Hops of every flow of one template under its stored tile and hub PEs."""
    inst = tp.instance
    pe = np.concatenate([tp.slots, tp.hubs]).astype(np.int64)
    x, y = pe % inst.cols, pe // inst.cols
    return np.abs(x[inst.src] - x[inst.dst]) + np.abs(y[inst.src] - y[inst.dst])


def mapped_legs(layout: Layout) -> dict[str, np.ndarray]:
    """The transfers the mapping costed: per CT template (CSR) its flows' PEs and hops; die-to-die CT pairs."""
    src, dst, hops = [], [], []
    for tp in layout.templates:
        pe = np.concatenate([tp.slots, tp.hubs]).astype(np.int32)
        src.append(pe[tp.instance.src])
        dst.append(pe[tp.instance.dst])
        hops.append(template_hops(tp).astype(np.int32))
    ptr = np.concatenate([[0], np.cumsum([len(h) for h in hops])]).astype(np.int64)
    return {"ct_template": layout.ct_template.astype(np.int32), "map_tpl_ptr": ptr,
            "map_src_pe": np.concatenate(src), "map_dst_pe": np.concatenate(dst), "map_hops": np.concatenate(hops),
            "map_d2d_src": layout.inter_src.astype(np.int32), "map_d2d_dst": layout.inter_dst.astype(np.int32)}


def _summary(hops: np.ndarray, weight: np.ndarray, count: np.ndarray) -> dict[str, Any]:
    n = float(count.sum())
    bytes_total = float((weight * count).sum())
    byte_hops = float((hops * weight * count).sum())
    return {
        "max_hops": int(hops.max()) if len(hops) else 0,
        "mean_hops": float((hops * count).sum() / n) if n else 0.0,
        "weighted_hops": byte_hops / bytes_total if bytes_total else 0.0,
        "byte_hops": byte_hops,
        "transfers": int(n),
        "bytes": bytes_total,
    }


def layout_hops(layout: Layout) -> dict:
    """Intra-CT statistics at the top level, die-to-die under ``inter_ct``."""
    uses = np.bincount(layout.ct_template, minlength=len(layout.templates))
    hops, weight, count = [], [], []
    for k, tp in enumerate(layout.templates):
        hops.append(template_hops(tp))
        weight.append(tp.instance.weight)
        count.append(np.full(len(tp.instance.weight), uses[k]))
    stats = _summary(np.concatenate(hops), np.concatenate(weight), np.concatenate(count))
    on_chip = (layout.inter_src >= 0) & (layout.inter_dst >= 0)
    sx, sy = layout.ct_xy(layout.inter_src[on_chip])
    dx, dy = layout.ct_xy(layout.inter_dst[on_chip])
    inter = _summary(np.abs(sx - dx) + np.abs(sy - dy), layout.inter_bytes[on_chip], np.ones(on_chip.sum()))
    inter["controller_transfers"] = int((~on_chip).sum())
    stats["inter_ct"] = inter
    return stats
