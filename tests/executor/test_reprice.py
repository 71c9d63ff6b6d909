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


def test_an_activation_no_record_uses_cannot_move_the_schedule(compiled, replayed, small_target):
    """same_schedule: an act.* op count none of the stream's ACT records uses leaves every busy cycle as it was, so
    repricing is what a replay gives; one the stream uses, or any other timing key, needs the replay."""
    from primal_compiler.executor.replay import same_schedule
    from primal_compiler.isa.opcodes import ActFn, Opcode

    program, meta, arrays = compiled
    r = program.stream.records
    used = {ActFn(int(a) & 0xFF) for a in r["arg"][r["op"] == Opcode.ACT]}
    assert ActFn.GELU not in used and ActFn.RMSNORM in used  # tiny-llama: SwiGLU MLPs, RMSNorm
    unused = with_overrides(small_target, {"act.gelu_ops_per_element": 10})
    assert same_schedule(replayed, unused)
    want = _numbers(metrics(replay(meta, arrays, program.stream, unused)))
    got = _numbers(metrics(reprice(replayed, unused)))
    assert got.keys() == want.keys() and all(got[k] == pytest.approx(want[k], rel=1e-12, abs=1e-15) for k in want)
    assert not same_schedule(replayed, with_overrides(small_target, {"act.rmsnorm_ops_per_element": 3}))
    assert not same_schedule(replayed, with_overrides(small_target, {"router.hop_latency_cycles": 4}))
    assert same_schedule(replayed, with_overrides(small_target, {"sram.leakage_uw": 6.4}))  # energy alone
