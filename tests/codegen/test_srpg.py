"""srpg: no instruction touches a gated CT; adapter loads hide behind the previous layer."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.codegen.check import check_configs, check_kv_appends, check_power
from primal_compiler.ir.tiles import Macro
from primal_compiler.isa.opcodes import Opcode
from primal_compiler.passmgr import PassManager, parse_pipeline


def test_gated_stream_never_touches_a_gated_ct(gated):
    check_power(gated.stream)
    check_configs(gated.stream)
    check_kv_appends(gated.stream)


def test_dropping_a_wake_up_is_caught(gated):
    s = gated.stream
    on = np.flatnonzero(s.records["op"] == Opcode.PG_ON)
    broken = s.records.copy()
    broken["op"][on[len(on) // 2]] = Opcode.PG_OFF
    with pytest.raises(AssertionError, match="touches gated CT"):
        check_power(type(s)(broken, s.group_ptr, s.group_ct, s.group_pe, s.sections))


def test_cts_sleep_outside_their_layer_and_wake_before_it(gated):
    s, layout, L = gated.stream, gated.layout, gated.model.num_layers
    dec = next(x for x in s.sections if x.name == "decode:0")
    rec = s.records
    first_of_layer = {n: dec.start + int(np.flatnonzero(rec["layer"][dec.start:dec.stop] == n)[0]) for n in range(L + 1)}
    state = np.ones(layout.num_cts, dtype=bool)
    head_cts = set(np.flatnonzero(layout.ct_layer == L).tolist())
    for i in range(first_of_layer[0] + 1):
        if rec["op"][i] in (Opcode.PG_ON, Opcode.PG_OFF):
            state[rec["ct"][i]] = rec["op"][i] == Opcode.PG_ON
    assert not state[list(head_cts)].any()  # the LM head sleeps while layer 0 computes
    assert state[layout.ct_layer == 0].all() and state[layout.ct_layer == 1].all()  # layer 1 woke early
    assert gated.power["pg_ct"].size and (gated.power["pg_on"] < gated.power["pg_off"]).all()


def test_pipelined_configs_leave_only_layer_0_ahead_of_the_barrier(gated, emitted):
    for p in (gated, emitted):
        adapter = p.stream.section("adapter:1")
        cfg = adapter[adapter["op"] == Opcode.CONFIG]
        layers = set(cfg["layer"].tolist())
        assert layers == ({0} if p is gated else set(range(p.model.num_layers)))
    pre = gated.stream.section("prefill:1")
    moved = np.flatnonzero(pre["op"] == Opcode.CONFIG)
    assert len(moved) and (pre["layer"][moved] >= 1).all()
    first_l0 = int(np.flatnonzero(pre["layer"] == 0)[0])
    assert moved.min() > first_l0


@pytest.mark.parametrize("options,gates,pipelined", [("gating=false", False, True),
                                                      ("pipeline_config=false", True, False)])
def test_each_part_turns_off(emitted, small_target, options, gates, pipelined):
    p = PassManager(parse_pipeline(f"srpg{{{options}}}")).run(emitted, small_target)
    ops = p.stream.records["op"]
    assert (ops == Opcode.PG_OFF).any() == gates
    in_prefill = (p.stream.section("prefill:0")["op"] == Opcode.CONFIG).any()
    assert in_prefill == pipelined
    check_power(p.stream)
    check_configs(p.stream)
    assert (ops == Opcode.SMAC_RRAM).sum() == (emitted.stream.records["op"] == Opcode.SMAC_RRAM).sum()


def _decode_state_changes(p, name: str = "decode:0") -> dict[int, int]:
    """PG_ON records per CT inside section ``name``."""
    part = p.stream.section(name)
    on = part[part["op"] == Opcode.PG_ON]
    return {int(c): int(n) for c, n in zip(*np.unique(on["ct"], return_counts=True))}


def test_a_generation_re_gates_every_ct_between_its_tokens(small_target):
    from primal_compiler.api import compile_model
    from primal_compiler.frontend import load_model

    model = load_model("tiny-llama", "q,v:8")
    head = "lower-tiles,blocking,zcurve-order,kv-ring{context=64},codegen{steps=3}"
    per_step = compile_model(model, small_target, f"{head},srpg")
    per_section = compile_model(model, small_target, f"{head},srpg{{per_step=false}}")
    for p in (per_step, per_section):
        check_power(p.stream)
    layer_cts = np.flatnonzero(per_step.layout.ct_layer < model.num_layers)
    woken = _decode_state_changes(per_step)
    assert all(woken.get(int(c), 0) == 3 for c in layer_cts)  # once per token: gated between the three
    assert all(n == 1 for n in _decode_state_changes(per_section).values())  # awake across the tokens
    sram = per_step.power["pg_sram_off"]  # the macros holding no LoRA weight stay off
    lora = {(int(per_step.tiles.ct[per_step.tiles.host[i]]), int(per_step.tiles.pe[i]))
            for i in np.flatnonzero(per_step.tiles.macro == Macro.SRAM)}
    pes = small_target.ct.mesh_rows * small_target.ct.mesh_cols
    assert sram.tolist() == [pes - sum(1 for c, _ in lora if c == ct) for ct in range(per_step.layout.num_cts)]
