"""Where a layer's tiles and hubs sit, and its flows cut into on-CT legs and die-to-die legs.

This follows :mod:`primal_compiler.mapping.layout` exactly: a hub lives in
the CT the mapping gave it, at the PE of its CT template; a flow between CTs
is one die-to-die leg into the proxy hub ``proxy:<payload>`` of the
destination CT (one per source CT, destination CT and payload) plus an
on-CT leg from that proxy. So every transfer of the stream is a transfer the
mapping passes costed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.ir.tiles import Macro
from primal_compiler.mapping.layout import _locate_hubs
from primal_compiler.mapping.traffic import Flow, layer_flows
from primal_compiler.mapping.lower import geometry

if TYPE_CHECKING:
    from primal_compiler.ir.program import Program
    from primal_compiler.target.spec import PrimalTarget

Pos = tuple[int, int]  # (global CT, PE)


@dataclass(frozen=True)
class Leg:
    src: int | str  # tile row, hub name or proxy name
    dst: int | str
    src_pos: Pos
    dst_pos: Pos
    nbytes: float
    flow: Flow
    d2d: bool


class LayerRoutes:
    """Positions and legs of one layer (``num_layers`` = the LM head) of a placed program."""

    def __init__(self, program: Program, target: PrimalTarget, layer: int, context: int) -> None:
        t, layout = program.need_tiles(), program.need_layout()
        self.t, self.layer = t, layer
        rows = np.flatnonzero(t.layer == layer)
        self.rows = rows
        geo = geometry(program.model, target)
        self.flows = layer_flows(program.model, layer, t, rows, geo, context)
        host_ct = np.where(t.macro[rows] == Macro.RRAM, t.ct[rows], t.ct[np.maximum(t.host[rows], 0)])
        ct_of = np.full(len(t), -1, dtype=np.int64)
        ct_of[rows] = host_ct
        rram = rows[t.macro[rows] == Macro.RRAM]
        self.hub_ct = _locate_hubs(t, rram, ct_of, self.flows, geo.rram_rows, geo.rram_cols)
        self.ct_of = ct_of
        self.cts = np.unique(ct_of[rows])
        self._hub_pe: dict[tuple[int, str], int] = {}
        for ct in self.cts:
            tp = layout.templates[int(layout.ct_template[ct])]
            for k, name in enumerate(tp.instance.hub_names):
                self._hub_pe[int(ct), name] = int(tp.hubs[k])

    def tile_pos(self, row: int) -> Pos:
        t = self.t
        return int(self.ct_of[row]), int(t.pe[row])

    def hub_pos(self, name: str, ct: int | None = None) -> Pos:
        """PE of a hub (in its own CT, or of a proxy in ``ct``); the CT port when no flow touches it there."""
        ct = self.hub_ct[name] if ct is None else ct
        return ct, self._hub_pe.get((ct, name), 0)

    def pos(self, endpoint) -> Pos:
        return self.tile_pos(int(endpoint)) if isinstance(endpoint, (int, np.integer)) else self.hub_pos(endpoint)

    def legs(self, flows: list[Flow]) -> tuple[list[Leg], list[Leg]]:
        """(die-to-die legs, deduplicated per proxy; on-CT legs) of ``flows``, in flow order."""
        inter: dict[tuple, Leg] = {}
        local: list[Leg] = []
        for f in flows:
            a, b = self.pos(f.src), self.pos(f.dst)
            if a[0] == b[0]:
                local.append(Leg(f.src, f.dst, a, b, f.bytes, f, False))
                continue
            proxy = f"proxy:{f.payload}"
            ppos = self.hub_pos(proxy, b[0])
            key = (a[0], b[0], proxy)
            old = inter.get(key)
            if old is None or old.nbytes < f.bytes:
                inter[key] = Leg(f.src, proxy, a, ppos, f.bytes, f, True)
            local.append(Leg(proxy, f.dst, ppos, b, f.bytes, f, False))
        return list(inter.values()), local
