"""Pass ``lower-tiles``: every matrix of every layer becomes rows of the tile table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.ir.precision import Precision
from primal_compiler.ir.tiles import Macro
from primal_compiler.mapping.lower import geometry, lower_model, psum_bits
from primal_compiler.ir.facts import Fact, facts
from primal_compiler.passmgr import Pass, option

if TYPE_CHECKING:
    from primal_compiler.ir.program import Program
    from primal_compiler.target.spec import PrimalTarget


@dataclass(frozen=True)
class LowerTiles(Pass):
    """Cut base weights into RRAM crossbar tiles (bit-sliced) and LoRA factors into SRAM tiles.

    The bit widths default to SEED.md section 6 (4-bit base, 8-bit LoRA, FP16
    embeddings and LM head) and replace the model's precision; the partial
    sums' width follows from them (:func:`~primal_compiler.mapping.lower.psum_bits`).
    """

    name = "lower-tiles"
    summary = "lower matrices to RRAM/SRAM tiles with mixed precision"
    provides = facts(Fact.TILES)

    # 1..32 bits, the widths the IR's Precision admits (32 = FP32).
    base_bits: int = option(4, 1, 32)
    lora_bits: int = option(8, 1, 32)
    lm_head_bits: int = option(16, 1, 32)
    embed_bits: int = option(16, 1, 32)

    def run(self, program: Program, target: PrimalTarget) -> Program:
        act = program.model.precision.activation_bits
        precision = Precision(
            base_weight_bits=self.base_bits, lora_weight_bits=self.lora_bits,
            embed_bits=self.embed_bits, lm_head_bits=self.lm_head_bits, activation_bits=act,
            psum_bits=psum_bits(program.model, act, self.base_bits, self.lora_bits, self.lm_head_bits),
            kv_bits=program.model.precision.kv_bits,
        )
        model = program.model.with_precision(precision)
        tiles = lower_model(model, geometry(model, target))
        rram = int((tiles.macro == Macro.RRAM).sum())
        details = {"rram_tiles": rram, "sram_tiles": len(tiles) - rram,
                   "weight_bytes": int(tiles.bytes.sum()), "layers": int(np.unique(tiles.layer).size)}
        return program.evolve(model=model, tiles=tiles, pending_details=details)

