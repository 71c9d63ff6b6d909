"""Pass ``blocking``: group tiles into CT-sized blocks of the target's mesh."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.mapping.blocking import apply_placement, block_model
from primal_compiler.mapping.hops import layout_hops
from primal_compiler.ir.facts import Fact, facts
from primal_compiler.passmgr import CONTEXT_RANGE, Pass, option
from primal_compiler.mapping.lower import geometry

if TYPE_CHECKING:
    from primal_compiler.ir.program import Program
    from primal_compiler.target.spec import PrimalTarget


@dataclass(frozen=True)
class Blocking(Pass):
    """Pack whole output columns of each matrix into CTs, layer by layer.

    Q, K, V, O and the MLP matrices fill each CT column by column, so each is
    a column-shaped rectangle with W_Q beside W_K; LoRA tiles sit in the SRAM
    of PEs that share their input (A) or output column (B), and those beyond
    the layer's RRAM tiles on PEs of their own after the layer's matrices
    (their crossbars unused). ``context`` is the
    context length that weighs the attention-score flows of the traffic model.
    """

    name = "blocking"
    summary = "assign tiles to CTs as column-shaped rectangles (32x32 blocking)"
    requires = facts(Fact.TILES)
    provides = facts(Fact.BLOCKED, Fact.PLACED)

    context: int = option(2048, *CONTEXT_RANGE)
    workload_options = {"context": "context"}

    def run(self, program: Program, target: PrimalTarget) -> Program:
        mesh = (target.ct.mesh_rows, target.ct.mesh_cols)
        tiles, layout = block_model(program.model, program.need_tiles(), geometry(program.model, target), mesh,
                                    self.context, target.system.num_cts)
        tiles = apply_placement(tiles, layout)
        used = int((tiles.seq >= 0).sum())
        details = {
            "cts": layout.num_cts, "templates": len(layout.templates), "pes_used": used,
            "utilisation": used / (layout.num_cts * mesh[0] * mesh[1]),
            "cts_per_layer": int(np.bincount(layout.ct_layer)[0]),
            "hops": layout_hops(layout),
        }
        return program.evolve(tiles=tiles, layout=layout, pending_details=details)
