"""Per-CT power of a replay window: every joule of the window lands on one CT or off the dies."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from primal_compiler.executor.metrics import metrics
from primal_compiler.thermal.drive import drive


def test_ct_power_adds_up_to_the_reports_decode_power(thermal_replay):
    rp = thermal_replay
    d = drive(rp, "decode")
    m = metrics(rp)
    assert d.ct_w.shape == (rp.topo.num_cts,) and (d.ct_w > 0).all()
    assert d.ct_w.sum() + d.offdie_w == pytest.approx(m["power_w"], rel=1e-9)
    assert d.offdie_w < 0.05 * d.ct_w.sum()  # the controller's issue energy is a small part


def test_a_generation_past_the_replayed_steps_adds_up_to_the_reports_power(small_target):
    """Three replayed steps of a settled decode generating 40 tokens: the report repeats the middle step 37
    times and so does the drive (each repeat: that step's records and one period of every CT's static
    energy), so its watts still add up to the report's power_w, over the report's longer window."""
    from primal_compiler.api import compile_model
    from primal_compiler.compiled import Compiled
    from primal_compiler.executor.metrics import decode_steady
    from primal_compiler.executor.replay import replay
    from primal_compiler.frontend import load_model

    program = compile_model(load_model("tiny-llama", "q,v:8"), small_target,
                            "lower-tiles,blocking,zcurve-order,kv-ring{context=64},codegen{steps=3},srpg")
    c = Compiled.of(program, small_target)
    rp = replay(c.meta, c.arrays, c.stream, c.target)
    st = decode_steady(rp, 0, 40)
    assert st.repeated == 37 and st.period_cycles > 0
    d, m = drive(rp, "decode", steady=st), metrics(rp, generate=40)
    assert d.ct_w.sum() + d.offdie_w == pytest.approx(m["power_w"], rel=1e-9)
    assert d.window_s > drive(rp, "decode").window_s
    assert drive(rp, "decode").ct_w.sum() + drive(rp, "decode").offdie_w != pytest.approx(m["power_w"], rel=1e-9)


def test_prefill_power_adds_up_to_the_reports_prefill_energy(thermal_replay):
    rp = thermal_replay
    d = drive(rp, "prefill")
    assert (d.ct_w.sum() + d.offdie_w) * d.window_s == pytest.approx(metrics(rp)["prefill_energy_j"], rel=1e-9)


def test_a_transfer_between_cts_heats_both_ends(thermal_replay):
    rp = thermal_replay
    d = drive(rp, "decode")
    r = rp.stream.records
    n = rp.topo.num_cts
    dec = rp.section("decode:0")
    rec = dec[(r["ct"][dec] < n) & (r["dst_ct"][dec] < n) & (r["ct"][dec] != r["dst_ct"][dec])]
    assert len(rec), "the fixture's decode has transfers between CTs"
    i = int(rec[0])
    src, dst = int(r["ct"][i]), int(r["dst_ct"][i])
    moved = {k: v.copy() for k, v in rp.energy_pj.items()}
    moved["links"][i] += 2e12  # two more joules on one transfer...
    step = (drive(replace(rp, energy_pj=moved), "decode").ct_w - d.ct_w) * d.window_s
    assert step[src] == pytest.approx(1.0) and step[dst] == pytest.approx(1.0)  # ...one to each end
    assert np.delete(step, [src, dst]) == pytest.approx(0.0, abs=1e-9)


def test_an_unknown_phase_is_refused(thermal_replay):
    with pytest.raises(ValueError, match="unknown phase"):
        drive(thermal_replay, "idle")
