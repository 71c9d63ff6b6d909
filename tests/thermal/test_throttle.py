"""The thermal-aware policy: at most k RRAM macros of a CT convert at once, and the largest k that keeps every
die under a limit."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.errors import InputError
from primal_compiler.executor.costs import RRAM_UNIT, throttled
from primal_compiler.executor.metrics import metrics
from primal_compiler.executor.replay import replay
from primal_compiler.thermal.report import thermal_report
from primal_compiler.thermal.throttle import render_throttle, throttle_for_limit


def rram_records(rp) -> np.ndarray:
    pes = rp.topo.pes * rp.topo.num_cts
    return np.flatnonzero((rp.unit >= RRAM_UNIT * pes) & (rp.unit < (RRAM_UNIT + 1) * pes) & (rp.busy > 0))


def most_at_once(rp, rec: np.ndarray) -> int:
    """The most records of ``rec`` running at one moment on one CT, from the schedule's own start and finish."""
    ct = rp.stream.records["ct"][rec].astype(np.int64)
    worst = 0
    for c in np.unique(ct):
        mine = rec[ct == c]
        t = np.concatenate([rp.start[mine], rp.finish[mine]])
        step = np.concatenate([np.ones(len(mine)), -np.ones(len(mine))])
        order = np.lexsort((step, t))  # at one cycle, a finish (-1) frees its macro before a start takes one
        worst = max(worst, int(np.cumsum(step[order]).max()))
    return worst


def test_lanes_deal_a_cts_pes_round_robin_and_keep_each_pe_on_one(thermal_replay):
    rp = thermal_replay
    rec = rram_records(rp)
    lanes = throttled(rp.ctx, rp.unit, 2)
    np.testing.assert_array_equal(np.delete(lanes, rec), np.delete(rp.unit, rec))  # only RRAM MVMs move
    for pe_unit in np.unique(rp.unit[rec]):
        assert len(np.unique(lanes[rec][rp.unit[rec] == pe_unit])) == 1
    ct = rp.unit[rec] // rp.topo.pes
    for c in np.unique(ct):
        assert len(np.unique(lanes[rec][ct == c])) == min(2, len(np.unique(rp.unit[rec][ct == c])))
    assert throttled(rp.ctx, rp.unit, 0) is rp.unit and throttled(rp.ctx, rp.unit, rp.topo.pes) is rp.unit


def test_the_schedule_never_runs_more_macros_of_a_ct_than_the_limit(thermal_compiled):
    c = thermal_compiled
    free = replay(c.meta, c.arrays, c.stream, c.target)
    rec = rram_records(free)
    assert most_at_once(free, rec) > 2  # unthrottled, the tiny model's MVMs overlap
    for k in (1, 2):
        rp = replay(c.meta, c.arrays, c.stream, c.target, max_active_pes=k)
        assert most_at_once(rp, rec) <= k
        assert metrics(rp)["itl_s"] > metrics(free)["itl_s"]
        assert thermal_report(rp)["die_c"]["max"] < thermal_report(free)["die_c"]["max"]


def test_a_limit_the_free_run_meets_costs_nothing(thermal_compiled):
    c = thermal_compiled
    result = throttle_for_limit(c, c.target, 100.0)
    assert result["met"] and result["throttled"]["max_active_pes"] == 64 and result["throughput_cost"] == 0.0
    assert len(result["points"]) == 1


def test_the_policy_finds_the_largest_limit_that_keeps_the_dies_cool_enough(thermal_compiled):
    c = thermal_compiled
    free = thermal_report(replay(c.meta, c.arrays, c.stream, c.target))["die_c"]["max"]
    one = thermal_report(replay(c.meta, c.arrays, c.stream, c.target, max_active_pes=1))["die_c"]["max"]
    limit = (free + one) / 2
    result = throttle_for_limit(c, c.target, limit)
    k = result["throttled"]["max_active_pes"]
    assert result["met"] and result["monotone"] and 1 <= k < 64
    assert result["throttled"]["die_max_c"] <= limit
    above = {p["max_active_pes"]: p for p in result["points"]}[k + 1] if k + 1 < 64 else result["free"]
    assert above["die_max_c"] > limit  # one more macro per CT breaks it
    assert 0.0 < result["throughput_cost"] < 1.0
    assert "tokens/s given up" in render_throttle(result)
    cold = throttle_for_limit(c, c.target, one - 0.01)
    assert not cold["met"] and cold["throttled"] is None and "not met" in render_throttle(cold)


def test_a_limit_outside_the_drift_model_is_refused(thermal_compiled):
    c = thermal_compiled
    with pytest.raises(InputError, match="--limit-c: 130 degC is outside"):
        throttle_for_limit(c, c.target, 130.0)
