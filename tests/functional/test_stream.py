"""The stream semantics the replay needs: decode steps, ring wrap-around, vector counts, biases."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.api import compile_model
from primal_compiler.codegen.check import check_configs, check_kv_appends, check_power
from primal_compiler.errors import InputError
from primal_compiler.frontend import load_model
from primal_compiler.isa.opcodes import ActFn, BufKind, Flag, Opcode
from primal_compiler.passmgr import parse_pipeline
from tests.functional.conftest import fixture

PIPE = "lower-tiles,blocking,zcurve-order,kv-ring{{context=8,chunk_tokens=4,reserve_bytes=0}},codegen{{{opts}}},srpg"


def emit(target, name="llama_dynamo", opts="prompt=5,steps=6"):
    return compile_model(load_model(fixture(name)), target, PIPE.format(opts=opts))


def argmax_records(rec):
    return np.flatnonzero((rec["op"] == Opcode.ACT) & (rec["arg"] == ActFn.ARGMAX))


def test_decode_steps_stay_in_one_section_each_ending_with_argmax(replay_target):
    p = emit(replay_target)
    assert [s.name for s in p.stream.sections] == ["prefill:0", "decode:0"]
    dec = p.stream.section("decode:0")
    ends = argmax_records(dec)
    assert len(ends) == 6 and ends[-1] == len(dec) - 1
    embeds = np.flatnonzero((dec["op"] == Opcode.ACT) & (dec["arg"] == ActFn.EMBED))
    assert len(embeds) == 6 and (embeds[1:] > ends[:-1]).all() and not (dec["flags"] & Flag.PREFILL).any()
    check_power(p.stream)
    check_configs(p.stream)
    check_kv_appends(p.stream)


def test_positions_past_the_context_wrap_around_the_ring(replay_target):
    """Prompt 5 in a context of 8: decode positions 5..10 append to ring slots 5, 6, 7, 0, 1, 2."""
    p = emit(replay_target)
    kv, dec = p.kv, p.stream.section("decode:0")
    ends = np.concatenate([[0], argmax_records(dec) + 1])
    _, within = kv.unit_layers()
    unit_chunk = {(int(c), int(e), int(s)): u // (kv.batch * kv.kv_heads * 2)
                  for u, c, e, s in zip(within.tolist(), kv.ct, kv.pe, kv.slot)}
    for step, (lo, hi) in enumerate(zip(ends[:-1], ends[1:])):
        part = dec[lo:hi]
        app = part[part["op"] == Opcode.KV_APPEND]
        chunk = [unit_chunk[(int(r["dst_ct"]), int(r["dst_pe"]), int(r["dst_buf"] & 0xFFF))] for r in app]
        ring = np.array(chunk) * kv.chunk_tokens + (app["arg"] & 0xFFFF) % kv.chunk_tokens
        assert (ring == (5 + step) % kv.context).all() and (app["count"] == 1).all()
        qk = part[(part["op"] == Opcode.DMAC) & ((part["arg"] & 0xFF) == 0)]
        attended = qk["count"].sum() // (p.model.num_layers * p.model.attention.num_heads * kv.head_dim)
        assert attended == min(6 + step, kv.context)


def test_router_records_count_the_vectors_they_move(replay_target):
    p = emit(replay_target, opts="prompt=5")
    pre = p.stream.section("prefill:0")
    routers = pre[np.isin(pre["op"], (Opcode.BCAST, Opcode.UNICAST, Opcode.REDUCE))]
    head = routers["layer"] == p.model.num_layers
    assert (routers["count"][~head] == 5).all() and (routers["count"][head] == 1).all()


def test_biases_are_added_at_every_root_of_a_biased_projection(replay_target):
    p = emit(replay_target, name="opt_optimum", opts="prompt=5")
    dec = p.stream.section("decode:0")
    bias = dec[(dec["op"] == Opcode.ACT) & (dec["arg"] == ActFn.BIAS)]
    roots = {(int(r["layer"]), int(r["src_buf"])) for r in bias}
    assert all(r["src_buf"] >> 12 == BufKind.ROOT and r["src_buf"] == r["dst_buf"] for r in bias)
    cols = replay_target.rram.cols
    per_layer = sum(-(-lin.out_features // cols) for lin in p.model.layers[0].linears)
    assert len(roots) == len(bias) == p.model.num_layers * per_layer  # OPT's LM head has no bias


def test_steps_must_be_positive():
    with pytest.raises(InputError, match="pass codegen: steps must be >= 1"):
        parse_pipeline("codegen{steps=0}")
