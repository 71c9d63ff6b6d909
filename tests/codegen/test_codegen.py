"""codegen: the prefill and decode stream follows the placement and the dataflow."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.api import compile_model
from primal_compiler.codegen.check import check_configs, check_kv_appends
from primal_compiler.errors import InputError
from primal_compiler.frontend import load_model
from primal_compiler.ir.tiles import Macro
from primal_compiler.isa.opcodes import CONTROLLER, NONE16, NONE32, ActFn, BufKind, DmacOp, Flag, Opcode, buf
from primal_compiler.passmgr import PassManager, parse_pipeline

PLACE = "lower-tiles,blocking,zcurve-order"


def _section(p, name):
    return p.stream.section(name)


def test_same_input_gives_identical_stream(emitted, small_target):
    again = compile_model(load_model("tiny-llama", "q,v:8"), small_target,
                          f"{PLACE},kv-ring{{context=64,batch=2}},codegen{{requests=0;1;1}}")
    assert again.stream.records.tobytes() == emitted.stream.records.tobytes()
    assert again.stream.group_ct.tobytes() == emitted.stream.group_ct.tobytes()
    assert again.stream.sections == emitted.stream.sections


def test_indices_are_within_the_target(emitted, small_target):
    s, n_ct = emitted.stream, emitted.layout.num_cts
    pes = small_target.ct.mesh_rows * small_target.ct.mesh_cols
    rec = s.records
    assert ((rec["ct"] < n_ct) | (rec["ct"] == CONTROLLER)).all()
    assert ((rec["pe"] < pes) | (rec["ct"] == CONTROLLER)).all()
    assert ((rec["dst_ct"] < n_ct) | np.isin(rec["dst_ct"], (NONE16, CONTROLLER))).all()
    assert ((rec["group"] < s.num_groups) | (rec["group"] == NONE32)).all()
    assert (s.group_ct < n_ct).all() and (s.group_pe < pes).all() and (rec["count"] >= 1).all()
    bounds = [(x.start, x.stop) for x in s.sections]
    assert bounds[0][0] == 0 and bounds[-1][1] == len(s)
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert [x.name for x in s.sections] == ["adapter:0", "prefill:0", "decode:0", "adapter:1", "prefill:1",
                                            "decode:1", "prefill:2", "decode:2"]


@pytest.mark.parametrize("pipeline", [True, False])
def test_every_crossbar_fires_once_per_pass_at_its_placed_pe(emitted, small_target, pipeline):
    """Pipelined (the default), each decode step has one pass per sequence of the batch of 2 and the prefill
    one pass of both prompts deciding each sequence's token apart; else one pass carries both everywhere."""
    program = emitted if pipeline else compile_model(
        load_model("tiny-llama", "q,v:8"), small_target,
        f"{PLACE},kv-ring{{context=64,batch=2}},codegen{{requests=0;1;1,pipeline=false}}")
    t = program.tiles
    rram = np.flatnonzero(t.macro == Macro.RRAM)
    decode_passes = 2 if pipeline else 1
    for name, passes, vectors, head in (("prefill:0", 1, 63 * 2, 2), ("decode:0", decode_passes, 2 // decode_passes,
                                                                       2 // decode_passes)):
        rec = _section(program, name)
        smac = rec[rec["op"] == Opcode.SMAC_RRAM]
        assert sorted(zip(smac["ct"].tolist(), smac["pe"].tolist())) == sorted(
            list(zip(t.ct[rram].tolist(), t.pe[rram].tolist())) * passes)
        last = smac["layer"] == program.model.num_layers
        assert (smac["count"][~last] == vectors).all() and (smac["count"][last] == head).all()
        argmax = rec[(rec["op"] == Opcode.ACT) & (rec["ct"] == CONTROLLER) & (rec["arg"] == ActFn.ARGMAX)]
        assert sorted(argmax["dst_buf"].tolist()) == [buf(BufKind.TOKEN, s) for s in range(0, 2, 2 // decode_passes)]


def test_column_reductions_gather_exactly_their_column(emitted):
    t, s = emitted.tiles, emitted.stream
    rec = _section(emitted, "decode:0")
    red = rec[(rec["op"] == Opcode.REDUCE) & (rec["src_buf"] == buf(BufKind.PSUM, 0))]
    rram = np.flatnonzero(t.macro == Macro.RRAM)
    col_of = {(int(t.ct[r]), int(t.pe[r])): (int(t.layer[r]), int(t.role[r]), int(t.bcol[r])) for r in rram}
    seen = set()
    for r in red:
        g = int(r["group"])
        members = zip(s.group_ct[s.group_ptr[g]:s.group_ptr[g + 1]].tolist(),
                      s.group_pe[s.group_ptr[g]:s.group_ptr[g + 1]].tolist())
        cols = {col_of[m] for m in members}
        assert len(cols) == 1 and r["dst_ct"] == r["ct"]
        seen |= cols
    assert seen == set(col_of.values())


def test_attention_work_matches_the_causal_context(emitted):
    attn = emitted.model.layers[0].attention
    L, B, H, hd, P = emitted.model.num_layers, 2, attn.num_heads, attn.head_dim, 63
    for name, pairs in (("prefill:0", P * (P + 1) // 2), ("decode:0", P + 1)):
        rec = _section(emitted, name)
        qk = rec[(rec["op"] == Opcode.DMAC) & ((rec["arg"] & 0xFF) == DmacOp.QK)]
        assert int(qk["count"].sum()) == L * B * H * pairs * hd
    dec = _section(emitted, "decode:0")
    app = dec[dec["op"] == Opcode.KV_APPEND]
    assert len(app) == L * B * attn.num_kv_heads * 2 and (app["count"] == 1).all()
    pre = _section(emitted, "prefill:0")
    assert int(pre[pre["op"] == Opcode.KV_APPEND]["count"].sum()) == L * B * attn.num_kv_heads * 2 * P
    check_kv_appends(emitted.stream)


def test_adapter_loads_only_when_the_adapter_changes(emitted):
    t = emitted.tiles
    n_sram = int((t.macro == Macro.SRAM).sum())
    for name in ("adapter:0", "adapter:1"):
        rec = _section(emitted, name)
        assert (rec["op"] == Opcode.CONFIG).sum() == n_sram and rec["op"][-1] == Opcode.SYNC
    assert not any(x.name == "adapter:2" for x in emitted.stream.sections)
    check_configs(emitted.stream)


def test_zero_lora_blocks_are_masked_not_loaded_and_skipped(emitted, small_target):
    t = emitted.tiles
    sram = np.flatnonzero(t.macro == Macro.SRAM)
    zero = t.zero.copy()
    zero[sram] = 0
    zero[sram[::2]] = 1
    masked = emitted.evolve(tiles=t.with_columns(zero=zero), stream=None)
    p = PassManager(parse_pipeline("codegen")).run(masked, small_target)
    rec = _section(p, "adapter:0")
    assert (rec["op"] == Opcode.MASK).sum() == len(sram[::2])
    assert (rec["op"] == Opcode.CONFIG).sum() == len(sram) - len(sram[::2])
    dec = _section(p, "decode:0")
    smac = dec[dec["op"] == Opcode.SMAC_SRAM]
    assert ((smac["flags"] & Flag.SKIPPED) != 0).sum() == len(sram[::2]) * p.kv.batch  # one pass per sequence
    check_configs(p.stream)


def test_prompt_longer_than_the_cache_is_an_error(small_target):
    with pytest.raises(InputError, match="exceeds the KV context 64"):
        compile_model(load_model("tiny-llama"), small_target, f"{PLACE},kv-ring{{context=64}},codegen{{prompt=64}}")
    with pytest.raises(InputError, match="requests"):
        parse_pipeline("codegen{requests=a;b}")


def test_a_generation_the_stream_cannot_cover_is_refused_before_compiling():
    with pytest.raises(InputError, match="pass codegen: generate 2 is below steps 3"):
        parse_pipeline("codegen{steps=3,generate=2}")
    with pytest.raises(InputError, match="generate 5 needs at least 2 decode steps in the stream"):
        parse_pipeline("codegen{generate=5}")
    assert parse_pipeline("codegen{steps=2,generate=5}")[0].generate == 5


@pytest.mark.parametrize("name,lora", [("tiny-mistral", "q,v:8"), ("gpt2", "qkv:4")])
def test_other_architectures_emit_consistent_streams(name, lora, small_target, target):
    tgt = small_target if name.startswith("tiny") else target
    p = compile_model(load_model(name, lora), tgt, f"{PLACE},kv-ring{{context=64}},codegen,srpg")
    from primal_compiler.codegen.check import check_power

    check_power(p.stream)
    check_configs(p.stream)
    check_kv_appends(p.stream)


def test_a_head_straddling_column_blocks_is_appended_in_pieces_and_a_size_off_the_unit_is_refused(tmp_path):
    """Heads of 24 on 16-column crossbars: k and v (24 wide, one kv head) come in two KV_APPEND pieces, head
    elements 0..15 and 16..23, which the slot check tells apart; a head size no multiple of 8 is refused."""
    import onnx

    from primal_compiler.target import load_target, with_overrides
    from tests.frontend.families import family_decoder
    from tests.functional.conftest import PLACE

    target = with_overrides(load_target("primal-7nm"), {"ct.mesh_rows": 4, "ct.mesh_cols": 4, "rram.rows": 16,
                                                        "rram.cols": 16, "rram.rows_active_per_read": 8,
                                                        "rram.adcs_per_macro": 4, "sram.rows": 16,
                                                        "router.scratchpad_bytes": 2048})

    def compiled(name, **kw):
        onnx.save(family_decoder("swiglu", **kw), tmp_path / name)
        return compile_model(load_model(str(tmp_path / name)), target, PLACE.format(opts="", context=32))

    stream = compiled("hd24.onnx", hidden=48, heads=2, kv_heads=1).stream
    appends = stream.records[stream.records["op"] == Opcode.KV_APPEND]
    assert sorted(set((appends["arg"] >> 24).tolist())) == [0, 2]  # head elements 0 and 16, in units of 8
    assert sorted(set(appends["nbytes"] // np.maximum(appends["count"], 1))) == [16, 32]  # 8 and 16 two-byte values
    check_kv_appends(stream)
    with pytest.raises(InputError, match="head size 12 is not a multiple of 8"):
        compiled("hd12.onnx", hidden=48, heads=4, kv_heads=2)
