"""primal-7nm's derived energy and leakage values recomputed from their cited inputs.

Each value's TOML comment gives a formula; here the formula is typed again over the cited facts (the
NeuroSim V1.4 7 nm device of Technology.cpp / Param.cpp / Bus.cpp, Horowitz's ISSCC 2014 45 nm adder)
and the transistor counts the comments state, so editing a value without its derivation fails.
"""

from __future__ import annotations

import pytest

from primal_compiler.target import load_primal_target

VDD_V = 0.7  # NeuroSim V1.4 7 nm supply
FIN_WIDTH_UM = 0.107  # effective width of one fin
IOFF_N_UA_PER_UM, IOFF_P_UA_PER_UM = 1.47e-4, 1.01e-4
GATE_AF, DRAIN_AF = 100.497, 22.24  # one-fin gate and drain capacitance
WIRE_FF_PER_UM = 0.2
READ_V, R_ON_OHM, R_OFF_OHM = 0.264, 100e3, 1.7e6

N_OFF_PW = IOFF_N_UA_PER_UM * FIN_WIDTH_UM * VDD_V * 1e6  # uA x V = uW; x 1e6 = pW
P_OFF_PW = IOFF_P_UA_PER_UM * FIN_WIDTH_UM * VDD_V * 1e6
PER_TRANSISTOR_PW = (N_OFF_PW + P_OFF_PW) / 4  # one off device per n/p pair
SCALE_45NM = (7 / 45) * (VDD_V / 0.9) ** 2  # C with the feature size, V from Horowitz's 0.9 V: every 45 nm figure
ADDER_BIT_FJ = 100.0 / 32 * SCALE_45NM  # 0.1 pJ per 32-bit add at 45 nm

DFF_T, FA_T = 24, 28
RRAM_PERIPHERY_T = (
    32 * (12 * DFF_T + 20 + 6 * 4)  # SAR ADCs: register, comparator, DAC switches
    + 256 * 4  # sample-and-hold and column mux
    + 256 * (4 + DFF_T)  # word-line drivers and input latches
    + 32 * (20 * FA_T + 20 * DFF_T)  # shift-add accumulators
)
ROUTER_T = 6 * 4 * 128 * DFF_T + 6 * 128 * 12 + 2000  # input FIFOs, crossbar, allocation
DMAC_T = 16 * (201 * FA_T + 48 * DFF_T) + 2 * 16 * 16 * DFF_T  # 16 FP16 MACs and their lane buffers


@pytest.fixture(scope="module")
def t():
    return load_primal_target("primal-7nm")


def test_the_device_leaks_what_the_sram_cell_was_given():
    # a 6T cell holding a bit leaks through one pull-down, one pull-up and one access device
    assert 2 * N_OFF_PW + P_OFF_PW == pytest.approx(29.6, rel=1e-3)
    assert RRAM_PERIPHERY_T == 52_096 and ROUTER_T + DMAC_T == 205_712


def test_leakage_is_transistors_times_the_device(t):
    assert t.rram.leakage_uw == pytest.approx(RRAM_PERIPHERY_T * PER_TRANSISTOR_PW * 1e-6, rel=0.01)
    assert t.router.leakage_uw == pytest.approx((ROUTER_T + DMAC_T) * PER_TRANSISTOR_PW * 1e-6, rel=0.01)


def test_wakeup_recharges_the_gated_transistors(t):
    farads = t.ct.pes * (RRAM_PERIPHERY_T + ROUTER_T + DMAC_T) * (GATE_AF + DRAIN_AF) * 1e-18
    assert t.power_gating.wakeup_energy_pj == pytest.approx(farads * VDD_V**2 * 1e12, rel=0.01)


def test_crossbar_energies_follow_the_device(t):
    mean_siemens = (1 / R_ON_OHM + 1 / R_OFF_OHM) / 2
    assert t.rram.array_read_energy_pj == pytest.approx(READ_V**2 * mean_siemens * 2e-9 * 1e12, rel=0.01)
    word_line_ff = t.rram.cols * GATE_AF * 1e-3 + t.rram.cols * 0.240 * WIRE_FF_PER_UM
    assert t.rram.row_driver_energy_pj == pytest.approx(word_line_ff * VDD_V**2 * 1e-3, rel=0.01)
    assert t.rram.shift_add_energy_pj_per_conversion == pytest.approx(20 * ADDER_BIT_FJ * 1e-3, rel=0.01)


def test_every_45nm_figure_is_scaled_by_one_rule(t):
    sram_bit_pj = 10.0 / 64 * SCALE_45NM  # Horowitz: 10 pJ per 64-bit access of an 8 KB SRAM
    assert t.sram.write_energy_pj_per_bit == pytest.approx(sram_bit_pj, rel=0.01)
    assert t.router.scratchpad_energy_pj_per_bit == t.sram.write_energy_pj_per_bit
    assert t.router.dmac_energy_pj_per_op == pytest.approx((1.1 + 0.4) * SCALE_45NM, rel=0.01)  # FP16 mul + add


def test_a_record_issue_is_a_256_bit_read_and_latch(t):
    bits = 32 * 8
    expected = bits * t.sram.write_energy_pj_per_bit + bits * ADDER_BIT_FJ * 1e-3
    assert t.system.nmc_issue_energy_pj == pytest.approx(expected, rel=0.01)

