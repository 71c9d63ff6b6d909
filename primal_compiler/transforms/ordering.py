"""Shared machinery of the ordering passes (``row-major-order``, ``zcurve-order``, ...)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, TYPE_CHECKING

from primal_compiler.mapping.blocking import apply_placement
from primal_compiler.mapping.curves import CURVES
from primal_compiler.mapping.hops import layout_hops
from primal_compiler.mapping.instance import HUB_POLICIES, hub_slots
from primal_compiler.ir.facts import Fact, facts
from primal_compiler.passmgr import Pass, option

if TYPE_CHECKING:
    from primal_compiler.ir.program import Program
    from primal_compiler.target.spec import PrimalTarget


@dataclass(frozen=True)
class OrderingPass(Pass):
    """Place each CT's tiles, in sequence order, along a PE curve.

    Hubs go to the bytes-weighted median of their tiles (``hubs=median``) or
    all to the CT's port PE (0, 0) (``hubs=port``: the naive layout).
    """

    curve: ClassVar[str] = ""  # a key of mapping.curves.CURVES
    compared_hubs: ClassVar[str] = "median"  # the hub policy ``primal map --compare`` runs it with
    requires = facts(Fact.BLOCKED)
    provides = facts(Fact.PLACED)

    hubs: str = option("median", choices=HUB_POLICIES)

    def run(self, program: Program, target: PrimalTarget) -> Program:
        layout = program.need_layout()
        order = CURVES[self.curve](layout.rows, layout.cols)
        for k, tp in enumerate(layout.templates):
            slots = order[: tp.instance.num_tiles].copy()
            layout = layout.replace_template(k, slots=slots, hubs=hub_slots(tp.instance, slots, self.hubs))
        tiles = apply_placement(program.need_tiles(), layout)
        return program.evolve(tiles=tiles, layout=layout, pending_details={"hops": layout_hops(layout)})
