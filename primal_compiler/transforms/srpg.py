"""Pass ``srpg``: selective power gating and pipelined LoRA reconfiguration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.codegen.power import gate, pipeline_configs
from primal_compiler.ir.tiles import lora_macros
from primal_compiler.errors import InputError
from primal_compiler.isa.opcodes import REPROGRAM, Opcode
from primal_compiler.ir.facts import Fact, facts
from primal_compiler.passmgr import Pass, option

if TYPE_CHECKING:
    from primal_compiler.ir.program import Program
    from primal_compiler.target.spec import PrimalTarget


@dataclass(frozen=True)
class Srpg(Pass):
    """Gate every CT outside its active windows and hide adapter loads behind compute.

    ``gating`` inserts PG_OFF/PG_ON around each CT's windows (a CT wakes while
    the layer before it computes; SRAM and scratchpads are retained); with
    ``per_step`` a window is one step of a section, so a generation re-gates
    every CT between its tokens (off: from a layer's first to its last step).
    ``pipeline_config`` moves the CONFIG writes of layer n+1 next to the start
    of layer n, so only layer 0's load is exposed. Either can be turned off
    for the ablations. With ``gating`` and the target's
    ``power_gating.gate_unused_sram``, every SRAM-DCIM macro that holds no LoRA
    weight stays switched off (``pg_sram_off``, per CT). See
    :mod:`primal_compiler.codegen.power`. A program whose LoRA weights stay
    resident cannot be gated by a target that does not retain SRAM (its weights
    would be lost): refused, naming both choices.
    """

    name = "srpg"
    summary = "power-gate idle CTs and pipeline LoRA CONFIG writes behind compute"
    requires = facts(Fact.STREAM)
    provides = facts(Fact.POWER_SCHEDULE)

    gating: bool = option(True)
    pipeline_config: bool = option(True)
    per_step: bool = option(True)  # re-gate every CT between the steps (tokens) of a generation

    def run(self, program: Program, target: PrimalTarget) -> Program:
        stream = program.need_stream()
        ops = stream.records["op"]
        resident = (ops == Opcode.CONFIG).any() and not ((ops == Opcode.SYNC) & (stream.records["arg"] == REPROGRAM)).any()
        if self.gating and resident and not target.power_gating.retain_sram:
            raise InputError(f"pass {self.name}", "LoRA weights kept resident in SRAM-DCIM (codegen{lora_residency="
                                                  "resident}) are lost when a CT is gated without "
                                                  "power_gating.retain_sram: rewrite them at every pass "
                                                  "(codegen{lora_residency=per-token}), retain SRAM, or gating=false")
        if self.pipeline_config:
            stream = pipeline_configs(stream)
        num_cts, pes = program.need_layout().num_cts, target.ct.mesh_rows * target.ct.mesh_cols
        schedule = {"pg_ct": np.zeros(0, np.int64), "pg_on": np.zeros(0, np.int64), "pg_off": np.zeros(0, np.int64)}
        if self.gating:
            stream, schedule = gate(stream, num_cts, program.model.num_layers, self.per_step)
        unused = self.gating and target.power_gating.gate_unused_sram
        t = program.need_tiles()
        schedule["pg_sram_off"] = pes - lora_macros(t.macro, t.ct, t.pe, t.host, num_cts, pes) if unused \
            else np.zeros(num_cts, np.int64)
        ops = stream.records["op"]
        details = {
            "records": len(stream), "windows": len(schedule["pg_ct"]),
            "pg_on": int((ops == Opcode.PG_ON).sum()), "pg_off": int((ops == Opcode.PG_OFF).sum()),
            "sram_macros_off": int(schedule["pg_sram_off"].sum()),
            "sections": {s.name: s.stop - s.start for s in stream.sections},
        }
        return program.evolve(stream=stream, power=schedule, pending_details=details)
