"""Metric definitions hold together and follow the power schedule."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.api import compile_model
from primal_compiler.compiled import program_file
from primal_compiler.executor.metrics import metrics
from primal_compiler.executor.power import GATED, domain_leakage_w
from primal_compiler.executor.replay import replay
from primal_compiler.frontend import load_model
from primal_compiler.isa.opcodes import CONTROLLER, ActFn, Opcode

REQUIRED = ("ttft_s", "itl_s", "tokens_per_s", "tokens_per_j", "power_w", "energy_per_token_j", "max_hops",
            "mean_hops", "weighted_hops", "power_breakdown_w")


def test_metrics_are_consistent(replayed):
    m = metrics(replayed)
    for key in REQUIRED:
        assert key in m
    assert m["ttft_s"] > 0 and m["itl_s"] > 0
    r, rp = replayed.stream.records, replayed
    sink = (r["op"] == Opcode.ACT) & (r["arg"] == ActFn.ARGMAX) & (r["ct"] == CONTROLLER)
    pre, dec = (np.flatnonzero(sink[s.start : s.stop]) + s.start for s in rp.stream.sections[1:3])
    assert m["passes"] == len(pre) == 2  # the fixture's batch of 2, pipelined: one pass per sequence
    window = rp.seconds(rp.finish[dec].max() - rp.finish[pre].max())
    assert m["tokens_per_s"] == pytest.approx(m["batch"] * m["decode_steps"] / window)
    assert m["itl_p50_s"] <= m["itl_p99_s"] and m["itl_first_step_s"] == pytest.approx(m["itl_s"])  # one step
    assert m["tokens_per_j"] * m["energy_per_token_j"] == pytest.approx(1.0)
    assert sum(m["power_breakdown_w"].values()) == pytest.approx(m["power_w"])
    assert sum(m["power_by_state_w"].values()) == pytest.approx(m["power_w"])
    assert m["prompt_tokens"] == 63 and m["batch"] == 2 and m["context"] == 64
    assert 0 < m["kv_storage_utilisation"] <= 1
    assert m["area_mm2"]["total"] == pytest.approx(sum(v for k, v in m["area_mm2"].items() if k != "total"))


def test_one_pass_throughput_is_batch_over_itl(compiled, small_target):
    """Pipelining off: one pass carries the batch, so every sequence gets its token at once."""
    program = compile_model(load_model("tiny-llama", "q,v:8"), small_target,
                            "lower-tiles,blocking,zcurve-order,kv-ring{context=64,batch=2},codegen{pipeline=false},srpg")
    meta, arrays = program_file(program, small_target)
    m = metrics(replay(meta, arrays, program.stream, small_target))
    assert m["passes"] == 1 and m["tokens_per_s"] == pytest.approx(m["batch"] / m["itl_s"])


def test_second_request_reuses_nothing_it_should_not(replayed):
    first, second = metrics(replayed, 0), metrics(replayed, 1)
    assert second["itl_s"] == pytest.approx(first["itl_s"], rel=0.2)
    with pytest.raises(KeyError, match="request 7 needs sections"):
        metrics(replayed, 7)


def test_gated_cts_leak_less_than_active_ones(small_target):
    leak = domain_leakage_w(small_target)
    active = sum(v[0] for v in leak.values())
    gated = sum(v[GATED] for v in leak.values())
    assert gated < active


def test_power_gating_saves_static_power(compiled, replayed, small_target):
    program = compiled[0]
    ungated = compile_model(program.model, small_target,
                            "lower-tiles,blocking,zcurve-order,kv-ring{context=64,batch=2},codegen{requests=0;1},"
                            "srpg{gating=false}")
    meta, arrays = program_file(ungated, small_target)
    off = metrics(replay(meta, arrays, ungated.stream, small_target))
    on = metrics(replayed)
    assert on["power_breakdown_w"]["static"] < off["power_breakdown_w"]["static"]
    assert on["power_by_state_w"]["gated"] > 0 and off["power_by_state_w"]["gated"] == 0


def test_timeline_covers_every_ct_without_gaps(replayed):
    tl = replayed.timeline
    for ct in range(replayed.topo.num_cts):
        sel = tl.ct == ct
        begin, end = tl.begin[sel], tl.end[sel]
        assert begin[0] == 0 and end[-1] == replayed.end
        assert np.array_equal(begin[1:], end[:-1])


def test_hops_match_the_mapping_on_a_model(small_target):
    program = compile_model(load_model("tiny-mistral", "q,v:4"), small_target,
                            "lower-tiles,blocking,zcurve-order,kv-ring{context=64},codegen,srpg")
    meta, arrays = program_file(program, small_target)
    m = metrics(replay(meta, arrays, program.stream, small_target))
    assert m["max_hops"] <= 2 * (small_target.ct.mesh_rows - 1)
    assert m["hops"]["inter_ct"]["transfers"] > 0
