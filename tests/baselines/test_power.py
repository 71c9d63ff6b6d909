"""GPU board power: the targets' memory slope is the one the published readings give, and each study is
predicted by a slope the other studies chose."""

from __future__ import annotations

import pytest

from primal_compiler.baselines.calibration import load_points, predict
from primal_compiler.baselines.power import implied_share, leave_one_study_out, pooled_share, slope
from primal_compiler.target import load_gpu_target

POWER = [p for p in load_points() if p.metric == "power_w"]


def test_there_are_readings_from_three_studies_at_batch_1_and_above():
    assert len({p.study for p in POWER}) >= 3 and sum(p.batch == 1 for p in POWER) >= 8


@pytest.mark.parametrize("gpu", ["a100", "a100-40gb", "h100", "h200"])
def test_the_targets_carry_the_pooled_slope(gpu):
    """targets/*.toml's memory_dynamic_w is share x (tdp - idle) / 0.9 with the share pooled from
    measurements.toml: change a reading and this fails until the targets are rewritten from it."""
    g = load_gpu_target(gpu, "test")
    assert g.power.memory_dynamic_w == pytest.approx(slope(g, pooled_share()), abs=0.05)


def test_an_implied_share_reproduces_its_reading():
    """Hand check of the linear solve: with the slope a point implies, the model draws the measured watts."""
    point = POWER[0]
    g = load_gpu_target(point.gpu, "test")
    assert predict(point, slope(g, implied_share(point))) == pytest.approx(point.value, rel=1e-9)


def test_batch_1_power_is_within_20_percent_on_a_study_the_slope_never_saw():
    """Issue 51: GPU power at batch 1 within 20% of published readings, scored leave-one-study-out."""
    rows = [r for r in leave_one_study_out() if r["batch"] == 1]
    assert rows and all(abs(r["held_out_error"]) <= 0.20 for r in rows), rows
    assert all(r["share"] != pooled_share() for r in rows)  # scored with the other studies' share, not the shipped
