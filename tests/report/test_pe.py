"""The PE-level figures (report/pe.py) worked by hand from primal-7nm's and digital-7nm's constants.

The hand numbers are docs/targets.md's worked example ("What the PRIMAL numbers add up to"), typed in
here as arithmetic on the TOML values, not read through the code under test.
"""

from __future__ import annotations

import pytest

from primal_compiler.report.pe import compare, pe_figures
from primal_compiler.target import load_primal_target, with_overrides

# one full 256 x 256 RRAM MVM: 32 pulses x 256 columns of conversions (0.12 + 0.0059 pJ), 32 x 64 x 256 cells
# at 0.74 fJ, 32 x 64 word lines at 0.0186 pJ, in 260 cycles
RRAM_PJ = 32 * 256 * (0.12 + 0.0059) + 32 * 64 * 256 * 0.00074 + 32 * 64 * 0.0186
SRAM_PJ = 256 * 8 * 0.045  # a full 256 x 8 LoRA macro, 10 cycles
ROUTER_PJ = 16 * (0.141 + 16 * 0.0147) + 128 * 0.05  # 16 attention MACs reading an FP16 element each, one flit-hop
PRIMAL_UW = 0.24 + 0.19 + 3.2 + 0.96 + 4.46  # the RRAM periphery's leakage and its bias
DIGITAL_UW = 16 * 3.2 + 3.2 + 0.96 + 4.46  # 16 base macros instead of the RRAM periphery


@pytest.fixture(scope="module")
def both():
    return compare(load_primal_target("primal-7nm"), load_primal_target("digital-7nm"))


def test_peak_power_by_unit(both):
    peak = both["target"]["peak_mw"]
    assert peak["rram_adc"] == pytest.approx(RRAM_PJ / 260 + 0.00024 + 0.00019)
    assert peak["sram_dcim"] == pytest.approx(SRAM_PJ / 10 + 0.0032)
    assert peak["router_dmac"] == pytest.approx(ROUTER_PJ + 0.00096 + 0.00446)
    assert both["target"]["peak_share"]["sram_dcim"] == pytest.approx(peak["sram_dcim"] / sum(peak.values()))
    digital = both["reference"]["peak_mw"]
    assert digital["base_dcim"] == pytest.approx(256 * 256 * 0.045 / 2 / 10 + 16 * 0.0032)  # 4-bit weights


def test_static_power_active_and_gated(both):
    assert both["target"]["static_total_uw"] == pytest.approx(PRIMAL_UW)
    assert both["reference"]["static_total_uw"] == pytest.approx(DIGITAL_UW)
    assert both["static_saving"] == pytest.approx(1 - PRIMAL_UW / DIGITAL_UW)
    gated_primal = 0.24 * 0.05 + 3.2 + 0.96 * 0.05 + 4.46  # periphery (its bias too) and router off, SRAM and pad kept
    gated_digital = 16 * 3.2 + 3.2 + 0.96 * 0.05 + 4.46  # the base macros are kept: they hold the weights
    assert both["static_saving_gated"] == pytest.approx(1 - gated_primal / gated_digital)


def test_density_of_the_base_array(both):
    rram = 256 * 256 / 260 * 1e9 / 0.03912  # MACs/s per mm2
    digital = 256 * 256 / 10 * 1e9 / (16 * 0.00948)
    assert both["compute_density_ratio"] == pytest.approx(rram / digital)
    assert both["storage_density_ratio"] == pytest.approx((16 * 9480) / 39120)
    assert both["target"]["area_share"]["rram"] == pytest.approx(0.652)  # the seed fact that pins area.rram_um2


def test_the_figures_follow_the_constants():
    seven = load_primal_target("primal-7nm")
    leaky = with_overrides(seven, {"sram.leakage_uw": 6.4})
    assert pe_figures(leaky)["static_total_uw"] == pytest.approx(PRIMAL_UW + 3.2)
