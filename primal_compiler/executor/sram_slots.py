"""The SRAM-DCIM macros hold what the stream puts in them: every SRAM slot a record names exists.

A PE's macro holds as many LoRA tiles of the shape it hosts as
``codegen.residency.tile_slots`` says (the formula and why are there): a CONFIG into, or a
fired SMAC_SRAM from, a slot past that number names SRAM the machine does not
have, and the replay refuses the program before anything runs.
"""

from __future__ import annotations

import numpy as np

from primal_compiler.codegen.residency import tile_slots
from primal_compiler.errors import InputError
from primal_compiler.ir.precision import Precision
from primal_compiler.isa.opcodes import Flag, Opcode
from primal_compiler.target.spec import PrimalTarget


def check_slots(records: np.ndarray, sram_rows: np.ndarray, sram_cols: np.ndarray, pes: int, target: PrimalTarget,
                lora_bits: int, where: str) -> None:
    """InputError naming ``where`` and the first record whose SRAM slot is past its PE's macro; ``sram_rows`` and
    ``sram_cols`` are the hosted tile's shape at every ``ct * pes + pe`` (0: no tile)."""
    op = records["op"]
    config = np.flatnonzero(op == Opcode.CONFIG)
    smac = np.flatnonzero((op == Opcode.SMAC_SRAM) & ((records["flags"] & Flag.SKIPPED) == 0))
    at = np.concatenate([records["dst_ct"][config].astype(np.int64) * pes + records["dst_pe"][config],
                         records["ct"][smac].astype(np.int64) * pes + records["pe"][smac]])
    rec = np.concatenate([config, smac])
    slot = records["arg"][rec].astype(np.int64) & 0xFFFF
    rows, cols = sram_rows[at].astype(np.int64), sram_cols[at].astype(np.int64)
    hosted = (rows > 0) & (cols > 0)
    fits = np.where(hosted, tile_slots(np.maximum(rows, 1), np.maximum(cols, 1), target, lora_bits), 0)
    bad = np.flatnonzero(slot >= fits)
    if len(bad):
        k = bad[np.argmin(rec[bad])]
        r = int(rec[k])
        what = (f"its {rows[k]}x{cols[k]} LoRA tile leaves room for {fits[k]} in the {target.sram.rows}x"
                f"{target.sram.cols_bits}-bit SRAM-DCIM macro of target {target.name}") if hosted[k] \
            else "the PE hosts no LoRA tile"
        raise InputError(where, f"record {r} ({Opcode(op[r]).name}) names SRAM slot {slot[k]} of CT {at[k] // pes} "
                                f"PE {at[k] % pes}, but {what}")


def lora_bits(meta: dict) -> int:
    """The LoRA weight width of a program file's model, read as the loader reads precision (``executor.memory``:
    absent widths default)."""
    return Precision(**meta.get("model_ir", {}).get("precision", {})).lora_weight_bits
