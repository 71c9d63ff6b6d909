"""Accuracy against die temperature: the hardware-precision replay with the ADCs' offset drift, step by step
against the exact replay.

The exact (float32) replay decodes greedily and sets the reference
continuation; each hardware-precision replay is teacher-forced along it
(``force``), so every step's logits answer the same question and top-1
agreement, mean KL and logit error compare like with like
(:mod:`.metrics`). A temperature is one value for every CT, or one per CT
(``primal thermal``'s map).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.functional.metrics import logit_error, mean_kl, top1_agreement
from primal_compiler.functional.replay import replay_functional
from primal_compiler.thermal.adc import adc_offset_lsb

if TYPE_CHECKING:
    from primal_compiler.ir.program import Program
    from primal_compiler.target.spec import PrimalTarget


def temperature_sweep(program: Program, target: PrimalTarget, weights: str | Path, prompt: Sequence[int],
                      generate: int, temperatures_c: Sequence[float | np.ndarray],
                      adapter: str | Path | None = None) -> list[dict]:
    """One row per temperature: ``temperature_c`` (mean over CTs for a map), the ADC offset in LSB (max over
    CTs), and the hardware replay's ``top1`` agreement, ``kl`` and ``logit_error`` against the exact replay."""
    exact = replay_functional(program, target, weights, adapter, prompt=prompt, generate=generate)
    rows = []
    for temperature in temperatures_c:
        run = replay_functional(program, target, weights, adapter, prompt=prompt, generate=generate,
                                precision="hardware", force=exact.tokens, temperature_c=temperature)
        rows.append({"temperature_c": float(np.mean(temperature)),
                     "adc_offset_lsb": float(np.max(adc_offset_lsb(target, temperature))),
                     "top1": top1_agreement(run.logits, exact.logits), "kl": mean_kl(run.logits, exact.logits),
                     "logit_error": logit_error(run.logits, exact.logits), "tokens": run.tokens})
    return rows
