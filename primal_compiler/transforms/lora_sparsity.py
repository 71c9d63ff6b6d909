"""Pass ``lora-sparsity``: mark the SRAM tiles whose LoRA block is all zero.

A LoRA SRAM tile holds one block of A (``in x r``: rows of input block
``brow``, columns of rank block ``bcol``) or of B stored transposed
(``out x r``: rows of output block ``brow``). When every weight of the block
is zero the tile's contribution is zero too, so ``zero`` is set to 1 and the
accelerator may mask it (skip the MAC, skip writing the macro). Weights come
from the model's ONNX file (``weights=``) or a PEFT adapter directory
(``adapter=``); for design-space studies without trained adapters,
``zero_fraction=F`` instead masks a seeded uniform sample of ``round(F x n)``
of the n LoRA tiles (a statistical stand-in, recorded as such). Every layer is checked against its own weights, although
identical layers share one lowering template. RRAM tiles get ``zero = 0``:
base weights are never masked.

The test is exact: a block counts as zero only if every stored value is
0.0 (NaN counts as nonzero); values that would round to zero at
``lora_bits`` are not masked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.ir.columns import stored_order
from primal_compiler.ir.model import Model
from primal_compiler.ir.tiles import ROLE_CODES, Macro, Part, TileTable
from primal_compiler.mapping.lower import Geometry
from primal_compiler.ir.facts import Fact, facts
from primal_compiler.passmgr import SEED_RANGE, Pass, option
from primal_compiler.mapping.lower import geometry

if TYPE_CHECKING:
    from primal_compiler.frontend.weights import ModelWeights
    from primal_compiler.ir.program import Program
    from primal_compiler.target.spec import PrimalTarget


@dataclass(frozen=True)
class LoraSparsity(Pass):
    """Set the tile column ``zero`` from real LoRA weights: 1 where an SRAM tile's block of A or B is all zero."""

    name = "lora-sparsity"
    summary = "mask all-zero LoRA blocks, reading weights from an ONNX file or a PEFT adapter"
    requires = facts(Fact.TILES)
    provides = facts(Fact.LORA_SPARSITY)

    weights: str = option("")  # ONNX file holding the model with unmerged LoRA
    adapter: str = option("")  # PEFT adapter directory (adapter_config.json + adapter_model.safetensors)
    zero_fraction: float = option(0.0, 0.0, 1.0)  # synthetic: mask this fraction of LoRA tiles, sampled with ``seed``
    seed: int = option(0, *SEED_RANGE)

    def run(self, program: Program, target: PrimalTarget) -> Program:
        where = f"pass {self.name}"
        given = [name for name, on in (("weights", self.weights), ("adapter", self.adapter),
                                       ("zero_fraction", self.zero_fraction > 0)) if on]
        if len(given) != 1:
            said = " and ".join(given) if given else "none of them"
            raise InputError(where, f"{said} given; set exactly one of weights=FILE.onnx, adapter=PEFT_DIR "
                                    f"or zero_fraction=F")
        tiles = program.need_tiles()
        if self.zero_fraction > 0:
            zero, source = self.sampled(tiles), f"synthetic: zero_fraction={self.zero_fraction}, seed={self.seed}"
        else:
            from primal_compiler.frontend.onnx_weights import load_onnx_weights  # heavy (onnx): only when read
            from primal_compiler.frontend.peft import load_peft_adapter
            from primal_compiler.frontend.weights import check_lora

            loaded = load_onnx_weights(self.weights, base=False) if self.weights else load_peft_adapter(self.adapter)
            check_lora(loaded, program.model)
            zero, source = zero_tiles(tiles, loaded, geometry(program.model, target), program.model), loaded.source
        sram = tiles.macro == Macro.SRAM
        masked = sram & (zero == 1)
        by_role = {}
        for code in np.unique(tiles.role[sram]):
            role = tiles.role == code
            by_role[ROLE_CODES[code].value] = round(float(masked[role].sum() / (sram & role).sum()), 6)
        details = {
            "source": source,
            "lora_tiles": int(sram.sum()),
            "masked_tiles": int(masked.sum()),
            "masked_fraction": round(float(masked.sum() / max(1, sram.sum())), 6),
            "masked_fraction_by_role": by_role,
            "masked_a_tiles": int((masked & (tiles.part == Part.LORA_A)).sum()),
            "masked_b_tiles": int((masked & (tiles.part == Part.LORA_B)).sum()),
            "masked_bytes": int(tiles.bytes[masked].sum()),
        }
        return program.evolve(tiles=tiles.with_columns(zero=zero), pending_details=details)


    def sampled(self, tiles: TileTable) -> np.ndarray:
        """``zero`` with a seeded uniform sample of ``round(zero_fraction x n)`` of the n SRAM tiles set."""
        zero = np.zeros(len(tiles), dtype=np.int8)
        sram = np.flatnonzero(tiles.macro == Macro.SRAM)
        pick = np.random.default_rng(self.seed).permutation(len(sram))[: round(self.zero_fraction * len(sram))]
        zero[sram[pick]] = 1
        return zero


def block_nonzero(matrix: np.ndarray, block_rows: int, block_cols: int) -> np.ndarray:
    """``(ceil(rows/block_rows), ceil(cols/block_cols))`` booleans: the block holds a nonzero value."""
    rows, cols = matrix.shape
    nb, kb = -(-rows // block_rows), -(-cols // block_cols)
    padded = np.zeros((nb * block_rows, kb * block_cols), dtype=bool)
    padded[:rows, :cols] = matrix != 0
    return np.asarray(padded.reshape(nb, block_rows, kb, block_cols).any(axis=(1, 3)))


def zero_tiles(tiles: TileTable, weights: ModelWeights, geo: Geometry, model: Model,
               padded: bool = False) -> np.ndarray:
    """The ``zero`` column: 1 for SRAM tiles whose block is all zero, 0 for every other tile.

    One block reduction per LoRA factor of each layer, then one gather for
    all tiles; a tile's block is found from its own ``layer``, ``role``,
    ``part``, ``brow`` and ``bcol``.
    """
    where = weights.source
    zero = np.zeros(len(tiles), dtype=np.int8)
    sram = np.flatnonzero(tiles.macro == Macro.SRAM)
    if sram.size == 0:
        return zero
    nroles = len(ROLE_CODES)
    key = (tiles.layer[sram].astype(np.int64) * nroles + tiles.role[sram]) * len(Part) + tiles.part[sram]
    keys, inverse = np.unique(key, return_inverse=True)
    flags, offsets, widths = [], np.empty(len(keys), np.int64), np.empty(len(keys), np.int64)
    heights = np.empty(len(keys), np.int64)
    start = 0
    for n, k in enumerate(keys.tolist()):
        layer, rest = divmod(k, nroles * len(Part))
        role, part = ROLE_CODES[rest // len(Part)], Part(rest % len(Part))
        p = weights.get(layer, role)
        a, b = (None, None) if p is None else (p.a, p.b)
        lin = model.layers[layer].linear(role)
        if a is None and padded and lin is not None:  # an adapter of several that leaves this role alone: zeros
            a, b = np.zeros((lin.in_features, 1), np.float32), np.zeros((1, lin.out_features), np.float32)
        if a is None or b is None:
            raise InputError(where, f"no LoRA weights for layer {layer} {role.value}, which has LoRA tiles")
        if part == Part.LORA_A:
            matrix = a
        else:  # B is stored transposed, out x r, its outputs in the crossbars' column order
            order = stored_order(model, layer, role)
            matrix = (b if order is None else b[:, order]).T
        nz = block_nonzero(matrix, geo.sram_rows, geo.lora_width)
        heights[n], widths[n] = nz.shape
        offsets[n] = start
        start += nz.size
        flags.append(nz.ravel())
    brow, bcol = tiles.brow[sram].astype(np.int64), tiles.bcol[sram].astype(np.int64)
    past = (brow >= heights[inverse]) | (bcol >= widths[inverse])
    if past.any() and not padded:
        raise InputError(where, "the tile table was cut with another geometry than the target's SRAM macros")
    row, col = np.minimum(brow, heights[inverse] - 1), np.minimum(bcol, widths[inverse] - 1)
    at = offsets[inverse] + row * widths[inverse] + col
    nonzero = np.concatenate(flags)[at] & ~past
    zero[sram] = ~nonzero
    return zero
