"""The decode-step traffic model: every dataflow edge is present with its byte count."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from primal_compiler.api import compile_model
from primal_compiler.frontend import load_model
from primal_compiler.ir.model import Role
from primal_compiler.ir.tiles import ROLE_INDEX, Macro
from primal_compiler.mapping.traffic import FlowClass, layer_flows
from primal_compiler.mapping.lower import geometry


def _flows(name: str, lora: str | None, target, context: int = 64):
    model = load_model(name, lora)
    program = compile_model(model, target, "lower-tiles")
    t = program.tiles
    rows = np.flatnonzero(t.layer == 0)
    return model, t, rows, layer_flows(model, 0, t, rows, geometry(program.model, target), context)


def _by_class(flows):
    total = defaultdict(float)
    for f in flows:
        total[f.cls] += f.bytes
    return total


@pytest.mark.parametrize(("name", "lora"), [("tiny-llama", "q,v:8"), ("tiny-mistral", "q,v:8"), ("gpt2", "qkv:8")])
def test_kv_append_carries_one_k_and_one_v_per_kv_head(name, lora, target):
    model, t, _, flows = _flows(name, lora, target)
    attn = model.layers[0].attention
    appends = [f for f in flows if f.cls == FlowClass.KV_APPEND]
    kv_bytes = model.precision.kv_bits / 8
    assert sum(f.bytes for f in appends) == pytest.approx(2 * attn.num_kv_heads * attn.head_dim * kv_bytes)
    roles = {f.src.split(":")[1] for f in appends}
    assert roles == ({"qkv"} if name == "gpt2" else {"k", "v"})
    for f in appends:  # from a root to a tile of that root's own column
        _, role, j = f.src.split(":")
        assert isinstance(f.dst, int) and t.role[f.dst] == ROLE_INDEX[Role(role)] and t.bcol[f.dst] == int(j)


def test_attention_meets_at_the_roots_and_scales_with_context(target):
    model, _, _, short = _flows("tiny-mistral", None, target, context=64)
    *_, long = _flows("tiny-mistral", None, target, context=128)
    attn = model.layers[0].attention
    act = model.precision.activation_bits / 8
    q_to_k = [f for f in short if f.cls == FlowClass.ATTN and f.src.startswith("root:q:")]
    assert all(f.dst.startswith("root:k:") for f in q_to_k)
    assert sum(f.bytes for f in q_to_k) == pytest.approx(attn.num_heads * attn.head_dim * act)
    scores = lambda fl: sum(f.bytes for f in fl if f.cls == FlowClass.ATTN and f.src.startswith("root:k:"))
    assert scores(short) == pytest.approx(attn.num_heads * 64 * act)
    assert scores(long) == pytest.approx(2 * scores(short))
    o_inputs = {f.src for f in short if f.cls == FlowClass.BCAST and isinstance(f.dst, int)} & {
        f.dst for f in short if f.cls == FlowClass.ATTN
    }
    assert o_inputs and all(s.startswith("root:v:") for s in o_inputs)


def test_broadcast_and_reduce_bytes_match_the_tiles(target):
    model, t, rows, flows = _flows("tiny-llama", "q,v:8", target)
    rram = rows[t.macro[rows] == Macro.RRAM]
    act, psum = model.precision.activation_bits / 8, model.precision.psum_bits / 8
    total = _by_class(flows)
    assert total[FlowClass.BCAST] == pytest.approx(t.rows[rram].sum() * act)
    assert total[FlowClass.REDUCE] == pytest.approx(t.cols[rram].sum() * psum)
    lora_a = rows[(t.macro[rows] == Macro.SRAM) & (t.role[rows] == ROLE_INDEX[Role.Q])]
    assert total[FlowClass.LORA] > 0 and len(lora_a)
    assert set(total) == set(FlowClass) - {FlowClass.HANDOFF}
