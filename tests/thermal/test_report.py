"""The thermal report: the network's steady state under the replay's power, its warm-up and ADC offsets."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from primal_compiler.target import with_overrides
from primal_compiler.thermal.drive import drive
from primal_compiler.executor.heat import network
from primal_compiler.thermal.report import render_thermal, thermal_report


def test_report_is_the_networks_steady_state_under_the_replays_power(thermal_replay):
    rp = thermal_replay
    rep = thermal_report(rp, "decode")
    d = drive(rp, "decode")
    net = network(rp.topo, rp.target)
    die = 45.0 + net.steady_rise(d.ct_w)[: rp.topo.num_cts]
    np.testing.assert_allclose(rep["per_ct"]["die_c"], die, rtol=1e-12)
    assert rep["die_c"]["max"] == pytest.approx(die.max()) and rep["hottest_ct"] == int(np.argmax(die))
    assert rep["die_c"]["min"] > rep["ambient_c"] == 45.0
    assert rep["die_c"]["max"] >= rep["plate_c"]["max"] > 45.0  # heat flows die -> plate -> air
    assert rep["power_w"] == pytest.approx(d.ct_w.sum())
    per_k, calib = rp.target.thermal.adc_offset_lsb_per_k, rp.target.thermal.adc_calibration_c
    assert rep["adc_offset_lsb"]["max"] == pytest.approx(per_k * (die.max() - calib))
    assert rep["adc_offset_lsb"]["at_ambient"] == pytest.approx(0.6)  # 0.3 LSB per 10 K x (45 - 25) K


def test_warmup_rises_from_ambient_to_the_steady_state(thermal_replay):
    rep = thermal_report(thermal_replay, "decode")
    curve = np.array(rep["warmup"]["hottest_die_c"])
    assert (np.diff(curve) >= -1e-12).all()
    rise = rep["die_c"]["max"] - 45.0
    assert curve[0] - 45.0 < 0.5 * rise  # starts near ambient (a tenth of the fastest time constant in)
    assert curve[-1] - 45.0 == pytest.approx(rise, rel=0.01)  # five slowest time constants: settled
    tc = rep["time_constants_s"]
    assert tc["fastest"] < tc["slowest"]


def test_a_warmer_ambient_shifts_every_temperature_by_the_same_amount(thermal_replay):
    rp = thermal_replay
    hot = replace(rp, target=with_overrides(rp.target, {"thermal.ambient_c": 85.0}))
    a, b = thermal_report(rp)["per_ct"]["die_c"], thermal_report(hot)["per_ct"]["die_c"]
    np.testing.assert_allclose(np.array(b) - np.array(a), 40.0, rtol=1e-9)


def test_a_better_heat_sink_runs_cooler(thermal_replay):
    rp = thermal_replay
    cold = replace(rp, target=with_overrides(rp.target, {"thermal.convection_k_mm2_per_w": 100.0}))
    assert thermal_report(cold)["die_c"]["max"] < thermal_report(rp)["die_c"]["max"]


def test_text_names_the_phase_and_the_figures(thermal_replay):
    rep = thermal_report(thermal_replay, "prefill")
    text = render_thermal(rep)
    assert text.startswith("thermal: prefill power sustained")
    assert f"max {rep['die_c']['max']:.3f}" in text and "ADC offset" in text
