"""Repricing a replay for changed energy constants gives what replaying under them gives."""

from __future__ import annotations

import pytest

from primal_compiler.executor.metrics import metrics
from primal_compiler.executor.replay import energy_only, replay, reprice
from primal_compiler.target import with_overrides


def _numbers(m: dict, prefix: str = "") -> dict[str, float]:
    out = {}
    for k, v in m.items():
        if k == "replay_s":
            continue
        if isinstance(v, dict):
            out.update(_numbers(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[prefix + k] = float(v)
    return out


@pytest.mark.parametrize("key", ["sram.leakage_uw", "router.energy_pj_per_bit_hop", "router.dmac_energy_pj_per_op",
                                 "power_gating.gated_leakage_fraction", "power_gating.wakeup_energy_pj",
                                 "rram.row_driver_energy_pj"])
def test_repricing_equals_replaying(compiled, replayed, small_target, key):
    assert energy_only(key)
    program, meta, arrays = compiled
    changed = with_overrides(small_target, {key: small_target.ranges[key][1]})
    want = _numbers(metrics(replay(meta, arrays, program.stream, changed)))
    got = _numbers(metrics(reprice(replayed, changed)))
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-12, abs=1e-15), k
    assert got["tokens_per_j"] != _numbers(metrics(replayed))["tokens_per_j"]  # the key moves the figure


def test_timing_keys_are_not_energy_only():
    for key in ("router.hop_latency_cycles", "router.buffer_flits", "system.nmc_issue_cycles", "rram.rows"):
        assert not energy_only(key)
