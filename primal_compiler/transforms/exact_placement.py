"""Pass ``exact-placement``: prove optimal placements of small CTs, bound the rest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from primal_compiler.mapping.blocking import apply_placement
from primal_compiler.mapping.coupled import coupled_bound
from primal_compiler.mapping.exact import solve_exact
from primal_compiler.mapping.hops import layout_hops, template_hops
from primal_compiler.mapping.instance import hub_slots
from primal_compiler.ir.facts import Fact, facts
from primal_compiler.passmgr import Pass, option

if TYPE_CHECKING:
    from primal_compiler.ir.program import Program
    from primal_compiler.target.spec import PrimalTarget


@dataclass(frozen=True)
class ExactPlacement(Pass):
    """CP-SAT on every CT template of at most ``max_tiles`` tiles; a star lower bound on all.

    A proven or better CP-SAT placement replaces the current one. The record
    gives, per template and in total, the current byte-hops, the lower bound
    and the gap, so a heuristic's quality is measured, not claimed.
    """

    name = "exact-placement"
    summary = "CP-SAT optimum on small CTs and a lower bound on every CT"
    requires = facts(Fact.BLOCKED)
    provides = facts(Fact.PLACED, Fact.BOUNDED)

    # CP-SAT's model has tiles x PEs booleans: 1 M for a full 32x32 CT, beyond what it proves.
    max_tiles: int = option(20, 0, 1024)
    # CP-SAT deterministic time per template (about seconds); an hour at most.
    deterministic_time: float = option(20.0, 0.0, 3600.0)

    def run(self, program: Program, target: PrimalTarget) -> Program:
        layout = program.need_layout()
        uses = [int((layout.ct_template == k).sum()) for k in range(len(layout.templates))]
        per, total_cost, total_bound = {}, 0.0, 0.0
        for k, tp in enumerate(layout.templates):
            inst = tp.instance
            cost = float(template_hops(tp) @ inst.weight)
            bound = coupled_bound(inst)
            proven = False
            if inst.num_tiles <= self.max_tiles:
                res = solve_exact(inst, self.deterministic_time)
                bound = max(bound, res.bound)
                proven = res.optimal
                if res.slots is not None and res.cost < cost:
                    layout = layout.replace_template(k, slots=res.slots, hubs=hub_slots(inst, res.slots))
                    cost = float(template_hops(layout.templates[k]) @ inst.weight)
            per[f"template{k}"] = {"byte_hops": cost, "lower_bound": bound, "proven_optimal": proven}
            total_cost += cost * uses[k]
            total_bound += bound * uses[k]
        tiles = apply_placement(program.need_tiles(), layout)
        details = {"hops": layout_hops(layout), "byte_hops": total_cost, "lower_bound": total_bound,
                   "gap": (total_cost - total_bound) / total_bound if total_bound else 0.0, "templates": per}
        return program.evolve(tiles=tiles, layout=layout, pending_details=details)
