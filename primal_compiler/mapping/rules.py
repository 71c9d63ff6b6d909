"""The seed's layout rules, checked on a placed layout and reported with the traffic they concern.

Per CT template, for the attention matrices it holds:

- ``column_band`` (per role Q, K, V, O): the seed's column-shaped
  rectangle, read as :mod:`~primal_compiler.mapping.bands` explains (a role's
  tile count is rarely a multiple of the mesh's rows, so an exactly filled
  rectangle is mostly impossible): every column strictly between the role's
  first and last column holds the role's tiles and no other matrix's.
  Reported with the tiles, the band's first and last column, and the other
  matrices' tiles inside the band's inner columns.
- ``q_next_to_k``: some W_Q tile and some W_K tile are mesh neighbours
  (one hop apart). Reported with the byte-hops of the q -> K-root flows.
- ``qk_horizontal``: every q vector from a Q root to its K root stays in one
  mesh row (``dy = 0``), i.e. Q.K^T needs only horizontal traffic. Reported
  with the byte-hops of those flows and the bytes that move vertically.

A rule with no tiles or flows to judge in a template is absent from its
record. These are observations of the placement; nothing here changes it
(``ga-placement{enforce=columns:qk_horizontal}`` keeps the column bands and
ties each Q root's row to its K root's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.ir.model import Role
from primal_compiler.ir.tiles import ROLE_INDEX, Macro
from primal_compiler.mapping.bands import ATTENTION
from primal_compiler.mapping.hops import template_hops
from primal_compiler.mapping.instance import Instance
from primal_compiler.mapping.layout import CtTemplate
from primal_compiler.mapping.traffic import FlowClass

if TYPE_CHECKING:
    from primal_compiler.ir.program import Program


def template_rules(tp: CtTemplate, roles: np.ndarray) -> dict:
    """Rules of one placed template; ``roles`` is the role code of each of its tiles (seq order)."""
    inst = tp.instance
    x, y = tp.slots % inst.cols, tp.slots // inst.cols
    out: dict = {}
    for role in ATTENTION:
        m = roles == ROLE_INDEX[role]
        if m.any():
            first, last = int(x[m].min()), int(x[m].max())
            inner = (x > first) & (x < last)
            foreign = int((inner & ~m & (roles >= 0)).sum())
            gaps = last - first + 1 - len(np.unique(x[m]))  # inner columns without a tile of the role
            out[f"column_band_{role}"] = {"holds": foreign == 0 and gaps == 0, "tiles": int(m.sum()),
                                          "first_col": first, "last_col": last, "foreign_tiles": foreign}
    qk = qk_flows(inst)
    hops = template_hops(tp)
    qk_cost = float(hops[qk] @ inst.weight[qk])
    q, k = roles == ROLE_INDEX[Role.Q], roles == ROLE_INDEX[Role.K]
    if q.any() and k.any():
        d = np.abs(x[q][:, None] - x[k][None, :]) + np.abs(y[q][:, None] - y[k][None, :])
        out["q_next_to_k"] = {"holds": bool(d.min() == 1), "min_hops": int(d.min()), "qk_byte_hops": qk_cost}
    if qk.any():
        pe = np.concatenate([tp.slots, tp.hubs]).astype(np.int64)
        dy = np.abs(pe[inst.src[qk]] // inst.cols - pe[inst.dst[qk]] // inst.cols)
        out["qk_horizontal"] = {"holds": bool((dy == 0).all()), "qk_byte_hops": qk_cost,
                                "vertical_bytes": float(inst.weight[qk][dy > 0].sum())}
    return out


def qk_flows(inst: Instance) -> np.ndarray:
    """Mask of the instance's ATTN flows from a Q root to a K root."""
    T = inst.num_tiles
    names = np.array(("",) * T + tuple(inst.hub_names), dtype=object) if inst.hub_names else None
    mask = inst.flow_class == FlowClass.ATTN
    if names is None or not mask.any():
        return np.zeros(len(inst.src), dtype=bool)
    src = np.array([str(n).startswith(f"root:{Role.Q}:") for n in names[inst.src]])
    dst = np.array([str(n).startswith(f"root:{Role.K}:") for n in names[inst.dst]])
    return mask & src & dst


def layout_rules(program: Program) -> list[dict]:
    """:func:`template_rules` for every template of ``program``'s layout, in template order."""
    t, layout = program.need_tiles(), program.need_layout()
    out = []
    for tp in layout.templates:
        start = int(np.searchsorted(t.layer, tp.layer))
        rows = start + tp.rel_rows  # self-hosted LoRA tiles are no part of a matrix's rectangle
        out.append(template_rules(tp, np.where(t.macro[rows] == Macro.RRAM, t.role[rows], -1)))
    return out
