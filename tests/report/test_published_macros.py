"""primal-7nm's RRAM-ACIM macro against measured 22 nm ReRAM compute-in-memory silicon.

The target's RRAM energies are derived (docs/targets.md), not fitted; this check brackets their sum, the
energy of one MAC through the executor's own cost rule (``costs.base_mvm``), by published measurements at
the same 8-bit input and 8-bit weight precision:

- J.-M. Hung et al., IEEE JSSC 58(1), 2023 (ISSCC 2022): 22 nm 8 Mb ReRAM-CIM, 8b input / 8b weight /
  19b output, 21.6 TOPS/W;
- J.-M. Hung et al., Nature Electronics 4, 2021: 22 nm 4 Mb ReRAM-CIM, 8b input / 8b weight, 15.6 TOPS/W.

Counting a MAC as two operations (the usual convention), the measured energy per MAC is the upper end: a
7 nm macro should cost no more than 22 nm silicon. The lower end is that silicon scaled to 7 nm by
capacitance alone (x 7/22, no voltage gain), since the ADCs that dominate both scale no better. An 8b x 8b
MAC on the target takes two 4-bit cells (``weight_bits`` 4), so twice the target's 8b x 4b MAC.
"""

from __future__ import annotations

import pytest

from primal_compiler.executor.costs import base_mvm
from primal_compiler.target import load_primal_target, with_overrides

MEASURED_TOPS_PER_W = {"Hung et al., JSSC 2023": 21.6, "Hung et al., Nature Electronics 2021": 15.6}
NODE_SCALE = 7 / 22


def fj_per_8b8b_mac(target) -> float:
    t = target.rram
    assert t.input_bits == 8 and t.weight_bits == 4
    _, pj, _ = base_mvm(target, t.rows, t.cols)
    return float(pj) / (t.rows * t.cols) * 2 * 1e3


@pytest.mark.parametrize("paper", sorted(MEASURED_TOPS_PER_W))
def test_the_rram_macro_lies_between_22nm_silicon_and_its_7nm_scaling(paper):
    measured_fj = 2 / MEASURED_TOPS_PER_W[paper] * 1e3  # 1 MAC = 2 ops
    ours = fj_per_8b8b_mac(load_primal_target("primal-7nm"))
    assert measured_fj * NODE_SCALE <= ours <= measured_fj, (paper, ours)


def test_a_macro_with_three_times_the_adc_energy_falls_outside_the_bracket():
    seven = load_primal_target("primal-7nm")
    hot = with_overrides(seven, {"rram.adc_energy_pj_per_conversion": 0.36, "rram.adc_power_uw": 360.0})
    assert fj_per_8b8b_mac(hot) > 2 / MEASURED_TOPS_PER_W["Hung et al., JSSC 2023"] * 1e3
