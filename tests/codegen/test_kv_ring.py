"""kv-ring: chunked KV placement, ring pointers, bank interleave and its limits."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.api import compile_model, last_details
from primal_compiler.codegen.check import check_kv_map
from primal_compiler.codegen.kvmap import snake_routers
from primal_compiler.errors import InputError
from primal_compiler.frontend import load_model

PLACE = "lower-tiles,blocking,zcurve-order"


def _layer_cts(program):
    return [np.flatnonzero(program.layout.ct_layer == n) for n in range(program.model.num_layers)]


@pytest.mark.parametrize("context,batch", [(64, 1), (256, 4), (2048, 1)])
def test_units_get_distinct_slots_inside_their_layer(context, batch, small_target):
    p = compile_model(load_model("tiny-mistral"), small_target, f"{PLACE},kv-ring{{context={context},batch={batch}}}")
    check_kv_map(p.kv, _layer_cts(p))
    assert p.kv.rings == (context,) * p.model.num_layers and p.kv.chunks_of(1) == context // 32
    assert len(p.kv.ct) == p.kv.units_per_layer()[0] * p.model.num_layers


def test_llama2_13b_holds_2048_tokens_at_batch_1_and_reports_the_limit(target):
    model = load_model("llama2-13b", "q,v:8")
    p = compile_model(model, target, f"{PLACE},kv-ring")
    kv = last_details(p, "kv")
    assert kv["units_per_layer"] == 64 * 40 * 2  # 64 chunks of 32 tokens, 40 heads, K and V
    assert kv["max_tokens_at_batch"] == 2048 and kv["max_batch_at_context"] == 1
    with pytest.raises(InputError, match="largest context at batch 8 is 256 tokens"):
        compile_model(model, target, f"{PLACE},kv-ring{{batch=8}}")


def test_spread_ring_pointer_walks_routers_in_order_and_wraps(small_target):
    p = compile_model(load_model("tiny-llama"), small_target, f"{PLACE},kv-ring{{context=128,placement=spread}}")
    kv = p.kv
    chunk, slot = kv.position(np.array([0, 31, 32, 127, 128, 160]), 0)
    assert chunk.tolist() == [0, 0, 1, 3, 0, 1] and slot.tolist() == [0, 31, 0, 31, 0, 0]
    u = kv.unit(0, np.arange(kv.chunks_of(0)), 0, 0, 0)
    cts = _layer_cts(p)[0]
    router = (np.searchsorted(cts, kv.ct[u]) * 64 + np.argsort(snake_routers(8, 8))[kv.pe[u]])
    assert (np.diff(router.astype(np.int64)) > 0).all()  # later chunks sit further along the ring
    k, v = kv.unit(0, 0, 0, 0, 0), kv.unit(0, 0, 0, 0, 1)  # K and V of one chunk are mesh neighbours
    assert abs(int(kv.pe[k]) % 8 - int(kv.pe[v]) % 8) + abs(int(kv.pe[k]) // 8 - int(kv.pe[v]) // 8) == 1


def test_options_are_checked():
    from primal_compiler.passmgr import make_pass

    with pytest.raises(InputError, match="chunk_tokens"):
        make_pass("kv-ring", {"context": "100"})


@pytest.mark.parametrize("context", [64, 256])
def test_sequences_is_the_largest_batch_that_fits(context, small_target):
    from primal_compiler.transforms.kv_ring import KvRing

    placed = compile_model(load_model("tiny-mistral"), small_target, PLACE)
    most = KvRing(context=context).sequences(placed, small_target)
    assert most >= 1
    compile_model(load_model("tiny-mistral"), small_target, f"{PLACE},kv-ring{{context={context},batch={most}}}")
    with pytest.raises(InputError, match=f"largest batch at context {context} is {most}"):
        compile_model(load_model("tiny-mistral"), small_target, f"{PLACE},kv-ring{{context={context},batch={most + 1}}}")



def test_a_sliding_window_reads_only_the_chunks_it_reaches(small_target):
    """Pairs by hand (chunks of 4): queries 6, 7, 8 with a 3-key window see keys 4-6, 5-7 and 6-8, so chunk 0
    gives none, chunk 1 eight and chunk 2 one (causal alone: 12, 11, 1); past a ring of 8, position 9 sees
    positions 7, 8, 9 in slots 7, 0, 1. In a compiled program the windowed layer reads fewer chunks."""
    from dataclasses import replace

    from primal_compiler.codegen.attention import causal_pairs, ring_pairs
    from primal_compiler.isa.opcodes import DmacOp, Opcode

    assert causal_pairs(np.arange(3), 4, 6, 3, 3).tolist() == [0, 8, 1]
    assert causal_pairs(np.arange(3), 4, 6, 3).tolist() == [12, 11, 1]
    assert ring_pairs(6, 3, 3, 12, 4).tolist() == [0, 8, 1]
    assert ring_pairs(9, 1, 3, 8, 4).tolist() == [2, 1]
    assert ring_pairs(9, 1, 0, 8, 4).tolist() == [4, 4]  # no window: the whole ring, positions 2..9
    plain = load_model("tiny-mistral")
    model = replace(plain, layers=(replace(plain.layers[0], window=32), *plain.layers[1:]))
    s = compile_model(model, small_target, f"{PLACE},kv-ring{{context=128}},codegen{{steps=2}}").stream.records
    qk = (s["op"] == Opcode.DMAC) & ((s["arg"] & 0xFF) == DmacOp.QK)
    assert qk[s["layer"] == 0].sum() < qk[s["layer"] == 1].sum()


def test_a_window_ring_holds_the_window_and_one_pass():
    """By hand, chunks of 4 and a 5-key window: passes of 4 tokens need 5 + 4 - 1 = 8 positions (two chunks);
    in a ring of 12, queries 8-11 read keys 4-11 (10 pairs in chunk 1, 10 in chunk 2) and queries 12-15 keys
    8-15, the ring's chunk 0 again holding positions 12-15; a pass of 9 tokens from 8 would need keys 4-16,
    13 positions, so it overwrites one it reads."""
    from primal_compiler.codegen.attention import ring_pairs
    from primal_compiler.codegen.kvmap import ring_tokens

    assert ring_tokens(5, 64, 4, 4) == 8 and ring_tokens(5, 64, 1, 4) == 8 and ring_tokens(5, 64, 5, 4) == 12
    assert ring_tokens(30, 16, 4, 4) == 16 and ring_tokens(0, 64, 4, 4) == 64  # at most the context; none: it
    assert ring_pairs(8, 4, 5, 12, 4).tolist() == [0, 10, 10]
    assert ring_pairs(12, 4, 5, 12, 4).tolist() == [10, 0, 10]
    assert ring_pairs(8, 4, 5, 8, 4).tolist() == [10, 10]  # the smallest ring that holds them
    with pytest.raises(ValueError, match="overwrite keys they read in a ring of 12"):
        ring_pairs(8, 9, 5, 12, 4)


def test_sliding_layers_get_window_rings_and_the_limits_follow(small_target):
    """tiny-mistral with layer 0 sliding over 32 keys and passes of 8 tokens: layer 0 keeps a ring of 40 tokens
    (5 chunks of 8), layer 1 the context's 256, so the map holds 5/32 + 1 of the units two full rings hold;
    the largest context is bound by layer 1 alone; a longer prefill pass than kv-ring sized for is refused."""
    from dataclasses import replace

    plain = load_model("tiny-mistral")
    model = replace(plain, layers=(replace(plain.layers[0], window=32), *plain.layers[1:]))
    ring = "kv-ring{context=256,chunk_tokens=8,pass_tokens=8}"
    p = compile_model(model, small_target, f"{PLACE},{ring},codegen{{prompt=64,prefill_chunk=8,steps=2}}")
    check_kv_map(p.kv, _layer_cts(p))
    assert p.kv.rings == (40, 256) and p.kv.units_per_layer().tolist() == [5 * 2 * 2, 32 * 2 * 2]
    full = compile_model(plain, small_target, f"{PLACE},kv-ring{{context=256,chunk_tokens=8}}")
    details, whole = last_details(p, "kv"), last_details(full, "kv")
    assert details["ring_tokens"] == [40, 256] and details["kv_bytes"] * 64 == whole["kv_bytes"] * (5 + 32) * 2 // 2
    assert details["max_tokens_at_batch"] == whole["max_tokens_at_batch"]
    every = replace(plain, layers=tuple(replace(x, window=32) for x in plain.layers))
    slides = compile_model(every, small_target, f"{PLACE},{ring}")
    assert slides.kv.rings == (40, 40) and last_details(slides, "kv")["max_tokens_at_batch"] is None  # no bound
    one_pass = compile_model(every, small_target, f"{PLACE},kv-ring{{context=256,chunk_tokens=8}}")  # prefill: 256
    assert one_pass.kv.rings == (256, 256)
    assert last_details(one_pass, "kv")["max_tokens_at_batch"] == whole["max_tokens_at_batch"]
    with pytest.raises(InputError, match=r"codegen.prefill_chunk: a prefill pass of 16 tokens would overwrite keys "
                                         r"it reads in layer 0's ring of 40 tokens .*chunks of at most 9 tokens"):
        compile_model(model, small_target, f"{PLACE},{ring},codegen{{prompt=64,prefill_chunk=16,steps=2}}")


def test_a_strict_fit_never_probes_a_chunk_that_overwrites_its_own_keys():
    """A window of 8 with passes of 5 keeps a ring of 12; a forced 12-token chunk of a 13-token prompt emits
    passes 0-11 and 12 (both legal), but the fit's probes end at the last token, and one of 6 (7-12) would
    read back to position 0 while writing 12: it counts as not fitting, so the refusal is the fit's own
    one line (it was a ValueError traceback)."""
    from dataclasses import replace

    from primal_compiler.target import load_target, with_overrides

    tight = with_overrides(load_target("primal-7nm"), {"ct.mesh_rows": 8, "ct.mesh_cols": 8,
                                                       "router.scratchpad_bytes": 6144})
    plain = load_model("tiny-llama", "q,v:8")
    model = replace(plain, layers=tuple(replace(x, window=8) for x in plain.layers))
    with pytest.raises(InputError, match="prefill chunk 12 does not fit the scratchpads"):
        compile_model(model, tight, "lower-tiles,blocking,zcurve-order,kv-ring{context=64,chunk_tokens=4,"
                                    "reserve_bytes=0,pass_tokens=5},codegen{prompt=13,prefill_chunk=12,memory=strict}")
