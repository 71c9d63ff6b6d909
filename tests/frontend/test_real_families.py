"""Real exports of current model families (``tests/fixtures/make_families.py``): read exactly, or refused.

The in-process builders of ``families.py`` imitate these graph forms; here the exporter made them. A
family the frontend reads must import as its config says and replay to ONNX Runtime's logits; a family
it does not understand must be refused in one line saying what, never imported as something else.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest

from primal_compiler.errors import InputError
from primal_compiler.frontend.onnx_import import load_onnx
from primal_compiler.ir.model import Activation, NormKind, Positional, Role
from tests.frontend.families import llama3_inv_freq

FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "onnx" / "families"
ALL = sorted(p.stem for p in FAMILIES.glob("*.onnx"))
READ = [n for n in ALL if json.loads((FAMILIES / f"{n}.json").read_text())["expect"] == "read"]
REFUSED = [n for n in ALL if n not in READ]


def sidecar(name: str) -> dict:
    return json.loads((FAMILIES / f"{name}.json").read_text())


def test_the_set_has_the_families_and_stays_small():
    assert READ == ["bloom", "falcon", "falcon_grouped", "gemma", "gemma2", "gpt_neox", "gptj", "llama3", "llama_yarn",
                    "mpt", "olmo", "phi2", "phi3", "qwen2", "qwen3"]
    assert REFUSED == ["olmo2"]  # Gemma-2 and Qwen3 were refused until their norms were read
    assert sum(p.stat().st_size for p in FAMILIES.glob("*.onnx")) < 2.5 * 1024 * 1024


@pytest.mark.parametrize("name", REFUSED)
def test_a_refused_family_is_refused_naming_what(name):
    """Never imported as something else: OLMo-2's norms after the branches (and none before) are named."""
    with pytest.raises(InputError) as err:
        load_onnx(FAMILIES / f"{name}.onnx")
    assert err.value.problem.startswith(sidecar(name)["expect"]), err.value.problem


@pytest.mark.parametrize("name", READ)
def test_a_read_family_imports_as_its_config_says(name):
    truth, model = sidecar(name), load_onnx(FAMILIES / f"{name}.onnx")
    att = model.attention
    assert (model.num_layers, model.hidden_size, model.vocab_size) == (truth["num_layers"], truth["hidden_size"],
                                                                       truth["vocab_size"])
    assert (att.num_heads, att.num_kv_heads, att.head_dim) == (truth["num_heads"], truth["num_kv_heads"],
                                                               truth["head_dim"])
    assert model.intermediate_size == truth["intermediate_size"]
    assert model.tie_word_embeddings == truth["tie_word_embeddings"]
    assert model.base_params == truth["base_params"]


def test_each_family_keeps_what_makes_it_different():
    qwen2, phi3, gemma, llama3 = (load_onnx(FAMILIES / f"{n}.onnx") for n in ("qwen2", "phi3", "gemma", "llama3"))
    assert [lin.bias for lin in qwen2.layers[0].linears][:3] == [True, True, True]  # q, k, v biases
    assert qwen2.layers[0].linear(Role.O).bias is False
    layer = phi3.layers[0]
    assert layer.linear(Role.QKV).out_features == 96 and layer.linear(Role.GATE).out_features == 64
    assert gemma.embed_scale == pytest.approx(math.sqrt(32)) and gemma.layers[0].activation == Activation.GELU_NEW
    inv = np.array(llama3.rope_inv_freq)  # read from the graph: transformers' llama3 scaling, not theta's series
    assert not np.allclose(inv, 500000.0 ** (-np.arange(0, 8, 2) / 8))
    np.testing.assert_allclose(inv, llama3_inv_freq(8, original=16), rtol=1e-6)
    phi2 = load_onnx(FAMILIES / "phi2.onnx")  # parallel block, half the head rotated, biases, LM head bias
    assert all(x.parallel and x.num_norms == 1 for x in phi2.layers) and phi2.rope_dim == 4
    assert len(phi2.rope_inv_freq) == 2 and phi2.lm_head_bias and phi2.layers[0].linear(Role.Q).bias
    neox = load_onnx(FAMILIES / "gpt_neox.onnx")  # parallel with two norms, a quarter rotated, qkv head by head
    assert all(x.parallel and x.num_norms == 2 for x in neox.layers) and neox.rope_dim == 4
    assert neox.qkv_layout == "per-head" and neox.layers[0].linear(Role.QKV).out_features == 192
    assert qwen2.qkv_layout == phi3.qkv_layout == ""
    gptj = load_onnx(FAMILIES / "gptj.onnx")  # one shared norm, half the head rotated in pairs from a table
    assert all(x.parallel and x.num_norms == 1 for x in gptj.layers) and gptj.rope_dim == 4
    assert gptj.rope_interleaved and not any(m.rope_interleaved for m in (qwen2, phi3, gemma, llama3, phi2, neox))
    np.testing.assert_allclose(gptj.rope_inv_freq, [1.0, 0.01], rtol=1e-6)  # 10000 ** (-2i / 4), from the table
    falcon = load_onnx(FAMILIES / "falcon.onnx")  # multi-query qkv cut along its heads axis: q | k | v as stored
    assert falcon.layers[0].linear(Role.QKV).out_features == 48 and falcon.qkv_layout == ""
    assert all(x.parallel and x.num_norms == 1 for x in falcon.layers)
    grouped = load_onnx(FAMILIES / "falcon_grouped.onnx")  # [kv groups, 2 queries + k + v, head_dim]
    assert grouped.qkv_layout == "per-group" and grouped.attention.num_kv_heads == 2
    assert all(x.parallel and x.num_norms == 2 for x in grouped.layers)  # ln_attn and ln_mlp
    bloom = load_onnx(FAMILIES / "bloom.onnx")  # ALiBi, a norm on the embeddings, qkv as [heads, 3, head_dim]
    assert bloom.positional == Positional.ALIBI and bloom.embed_norm and bloom.qkv_layout == "per-head"
    assert bloom.alibi_slopes == (0.25, 0.0625, 0.015625, 0.00390625)  # 2 ** (-8 (h + 1) / heads)
    yarn = load_onnx(FAMILIES / "llama_yarn.onnx")  # YaRN: its frequencies, and both tables x its attention factor
    assert yarn.rope_attention_scale == pytest.approx(0.1 * math.log(4.0) + 1.0, rel=1e-6)
    assert all(m.rope_attention_scale == 1.0 for m in (qwen2, phi3, gemma, llama3, phi2, neox, gptj))
    mpt = load_onnx(FAMILIES / "mpt.onnx")  # ALiBi sliced from a precomputed table, LayerNorms without bias
    assert mpt.alibi_slopes == bloom.alibi_slopes and not mpt.norm_bias and not mpt.embed_norm
    assert bloom.norm_bias and all(m.norm_bias for m in (qwen2, phi3, gemma, llama3, phi2, neox, gptj, falcon))
    olmo = load_onnx(FAMILIES / "olmo.onnx")  # LayerNorms without parameters: none counted (base_params above)
    assert not olmo.norm_weights and not olmo.norm_bias and olmo.norm == NormKind.LAYER


@pytest.mark.parametrize("name", READ)
def test_a_read_family_replays_to_onnxruntime(name):
    pytest.importorskip("onnxruntime")
    from primal_compiler.report.check import check_onnx
    from primal_compiler.target import load_primal_target

    info = check_onnx(str(FAMILIES / f"{name}.onnx"), load_primal_target("primal-7nm"))
    assert info["verdict"] == "OK" and info["relative_error"] < 1e-5, info


def test_an_adapter_on_a_per_head_qkv_computes_as_the_merged_weights(tmp_path):
    """LoRA on GPT-NeoX's query_key_value: B's columns follow the file's head-by-head order, as W's do. The
    replay with the unmerged adapter must equal onnxruntime on a copy of the file with W + scale * A @ B."""
    pytest.importorskip("onnxruntime")
    from tests.frontend.merged import replay_and_merged
    from tests.frontend.test_weights import write_adapter

    path = FAMILIES / "gpt_neox.onnx"
    factors = write_adapter(tmp_path / "adapter", load_onnx(path), roles=(Role.QKV,), rank=4, alpha=8.0,
                            names={Role.QKV: "attention.query_key_value"}, prefix="base_model.model.gpt_neox.layers")
    # W is MatMul's right operand (in x out), its columns as the file runs them
    got, want, plain = replay_and_merged(path, tmp_path / "adapter", factors, lambda a, b: 2.0 * a @ b, tmp_path)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() / scale < 1e-5
    assert np.abs(plain - want).max() / scale > 1e-3  # the adapter moves the logits



def test_gptj_read_as_rotating_halves_would_be_wrong(tmp_path):
    """GPT-J rotates adjacent pairs: with its q and k sharpened (x8, so positions decide the logits) the replay
    matches onnxruntime, and the same program reading the pairs as rotate_half's halves does not."""
    pytest.importorskip("onnxruntime")
    from dataclasses import replace

    import onnx
    from onnx import numpy_helper

    from primal_compiler.frontend.onnx_import import recognise_onnx
    from primal_compiler.functional import compile_for_replay, replay_functional
    from primal_compiler.report.check import ort_greedy
    from primal_compiler.target import load_primal_target

    found = recognise_onnx(FAMILIES / "gptj.onnx")
    sharpen = {p.weight for (_, role), p in found.projections.items() if role in (Role.Q, Role.K)}
    edited = onnx.load(FAMILIES / "gptj.onnx")
    for t in edited.graph.initializer:
        if t.name in sharpen:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * np.float32(8), t.name))
    path = tmp_path / "gptj_sharp.onnx"
    onnx.save(edited, path)
    target, prompt = load_primal_target("primal-7nm"), [5, 17, 3, 60, 41]
    want = ort_greedy(path, prompt, 3)
    scale = np.abs(want).max()
    model = load_onnx(path)
    for m, agrees in ((model, True), (replace(model, rope_interleaved=False), False)):
        got = replay_functional(compile_for_replay(m, target, len(prompt), 3, "fast"), target, str(path),
                                prompt=prompt, generate=3)
        assert (np.abs(got.logits - want).max() / scale < 1e-5) == agrees


@pytest.mark.parametrize("edit,message", [
    (lambda t: np.concatenate([t[:, :1], t[:, 1:] * np.float32(1.001)], axis=1), "rows are not sin(p f) | cos(p f)"),
    (lambda t: t[..., [2, 3, 0, 1]], "its first row is not sin 0 | cos 0"),  # cos | sin
])
def test_a_position_table_that_is_not_sin_cos_is_refused(tmp_path, edit, message):
    import onnx
    from onnx import numpy_helper

    model = onnx.load(FAMILIES / "gptj.onnx")
    table = next(t for t in model.graph.initializer if list(t.dims) == [1, 64, 4])
    table.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(edit(numpy_helper.to_array(table))), table.name))
    onnx.save(model, tmp_path / "edited.onnx")
    with pytest.raises(InputError, match="unsupported position table at node") as err:
        load_onnx(tmp_path / "edited.onnx")
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name,message", [
    ("falcon", r"its 6 heads of 8 are cut into q \[0, 1, 2, 3\], k \[5\], v \[4\]"),
    ("falcon_grouped", r"its columns are grouped as \[\.\.\., 2, 4, 8\] and cut into q \[0, 1\], k \[3\], "
                       r"v \[2\] of each group"),
])
def test_a_heads_axis_qkv_cut_in_another_order_is_refused(tmp_path, name, message):
    """Falcon picks its key head at index -2 and its value head at -1 of the heads axis (of each group, with
    the new decoder architecture); swapped, the columns are no longer where the IR puts k and v, and the
    frontend says so instead of reading them as such."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(FAMILIES / f"{name}.onnx")
    gathers = {n.input[1] for n in model.graph.node if n.op_type == "GatherND"}
    for t in model.graph.initializer:
        if t.name in gathers:
            value = numpy_helper.to_array(t)
            t.CopyFrom(numpy_helper.from_array(np.where(value == -2, -1, -2).astype(value.dtype), t.name))
    onnx.save(model, tmp_path / "swapped.onnx")
    with pytest.raises(InputError, match="unsupported fused qkv at node .*: " + message):
        load_onnx(tmp_path / "swapped.onnx")


def test_a_second_norm_before_the_first_layer_is_refused_not_read_as_its_norm(tmp_path):
    """Bloom norms its embeddings before the first layer's own norm. Inserted into GPT-2 that second
    LayerNormalization fell inside layer 0's norm region and the model imported with the wrong norm (0.37 of
    the logit scale off onnxruntime); it is refused, naming both nodes."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(FAMILIES.parent / "gpt2_dynamo.onnx")
    g = model.graph
    add = next(n for n in g.node if n.op_type == "Add" and any(x.startswith("embedding") for x in n.input))
    hidden = next(int(t.dims[1]) for t in g.initializer if t.name == "lm_head.weight")
    g.initializer.extend([numpy_helper.from_array(np.full(hidden, 1.5, np.float32), "eln_w"),
                          numpy_helper.from_array(np.full(hidden, 0.1, np.float32), "eln_b")])
    for node in g.node:
        node.input[:] = ["emb_ln" if x == add.output[0] else x for x in node.input]
    g.node.insert(list(g.node).index(add) + 1, helper.make_node(
        "LayerNormalization", [add.output[0], "eln_w", "eln_b"], ["emb_ln"], name="emb_ln_node", axis=-1))
    onnx.save(model, tmp_path / "embln.onnx")
    with pytest.raises(InputError, match="unsupported norms at nodes emb_ln_node and .*: two norms in a row"):
        load_onnx(tmp_path / "embln.onnx")


def test_bloom_without_alibi_or_its_embedding_norm_would_be_wrong():
    """The replay adds slope_h * key position to the scores and norms the embeddings; a program without either
    misses onnxruntime. With ALiBi, every QK score costs one more multiply-accumulate than head_dim."""
    pytest.importorskip("onnxruntime")
    from dataclasses import replace

    from primal_compiler.functional import compile_for_replay, replay_functional
    from primal_compiler.isa.opcodes import DmacOp, Opcode
    from primal_compiler.report.check import ort_greedy
    from primal_compiler.target import load_primal_target

    path, target, prompt = FAMILIES / "bloom.onnx", load_primal_target("primal-7nm"), [5, 17, 3, 60]
    want = ort_greedy(path, prompt, 3)
    scale = np.abs(want).max()
    model = load_onnx(path)
    errors = []
    for m in (model, replace(model, alibi_slopes=(1e-9,) * 4), replace(model, embed_norm=False)):
        program = compile_for_replay(m, target, len(prompt), 3, "fast")
        got = replay_functional(program, target, str(path), prompt=prompt, generate=3)
        errors.append(float(np.abs(got.logits - want).max() / scale))
    assert errors[0] < 1e-5 and min(errors[1:]) > 1e-3, errors
    r = compile_for_replay(model, target, len(prompt), 3, "fast").stream.records
    dmac = r[r["op"] == Opcode.DMAC]
    qk, pv = (dmac["count"][(dmac["arg"] & 0xFF) == op].astype(np.int64).sum() for op in (DmacOp.QK, DmacOp.PV))
    assert qk * 8 == pv * 9  # head_dim 8: 9 MACs per score against 8 per weighted value


def test_a_bias_on_the_scores_that_is_not_alibi_is_refused(tmp_path):
    """Bloom's key positions squared (a Mul of the position term by itself) is no linear bias: refused."""
    import onnx
    from onnx import helper

    model = onnx.load(FAMILIES / "bloom.onnx")
    g = model.graph
    cumsum = next(n for n in g.node if n.op_type == "CumSum")
    sub = next(n for n in g.node if cumsum.output[0] in n.input)
    for node in g.node:
        node.input[:] = ["squared" if x == sub.output[0] else x for x in node.input]
    g.node.insert(list(g.node).index(sub) + 1, helper.make_node("Mul", [sub.output[0], sub.output[0]], ["squared"]))
    onnx.save(model, tmp_path / "squared.onnx")
    with pytest.raises(InputError, match=r"unsupported bias on the attention scores at node .*: not ALiBi's"):
        load_onnx(tmp_path / "squared.onnx")


def test_a_term_that_is_zero_on_every_attended_key_is_a_mask_not_alibi(tmp_path):
    """Bloom's bias with its slopes zeroed is 0 wherever a key is attended: read as a mask (the replay's own
    causal mask), so the model has no position encoding left and is refused for that, not as a bad ALiBi."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(FAMILIES / "bloom.onnx")
    slopes = next(t for t in model.graph.initializer if list(t.dims) == [4, 1])
    slopes.CopyFrom(numpy_helper.from_array(np.zeros((4, 1), np.float32), slopes.name))
    onnx.save(model, tmp_path / "zero_slopes.onnx")
    with pytest.raises(InputError, match="unsupported position encoding: neither"):
        load_onnx(tmp_path / "zero_slopes.onnx")


def test_gemma2_sandwich_norms_caps_and_window_are_read():
    """Gemma-2: four norms a layer, soft-capped logits, and layer 0's 32-key sliding window (transformers' mask
    ``key > query - 32``, read from the graph); with a 40-token prompt and 30 generated tokens the window bites in
    the prefill and in every decode step, and the replay still matches onnxruntime (0.56 of the logit scale off
    while the window was ignored)."""
    pytest.importorskip("onnxruntime")
    from primal_compiler.report.check import check_onnx
    from primal_compiler.target import load_primal_target

    gemma2 = load_onnx(FAMILIES / "gemma2.onnx")
    assert [(x.post_norms, x.num_norms, x.window) for x in gemma2.layers] == [(True, 4, 32), (True, 4, 0)]
    assert gemma2.logit_softcap == pytest.approx(30.0)  # (its SDPA export leaves the scores uncapped)
    info = check_onnx(str(FAMILIES / "gemma2.onnx"), load_primal_target("primal-7nm"), prompt=list(range(1, 41)),
                      generate=30)
    assert info["verdict"] == "OK" and info["relative_error"] < 1e-5, info


def test_a_window_longer_than_the_model_positions_is_refused(monkeypatch):
    """Gemma-2's 32-key window in a model that holds 16 positions (as a learned table of 16 rows would say): a
    window that never bites is not read as one; refused naming the node."""
    from primal_compiler.frontend import onnx_import

    real = onnx_import._positional
    monkeypatch.setattr(onnx_import, "_positional", lambda *args: (*real(*args)[:2], 16))
    with pytest.raises(InputError, match=r"layer 0 at node .*: a sliding window of 32 keys, longer than the "
                                         r"model's 16 positions"):
        load_onnx(FAMILIES / "gemma2.onnx")


def test_qwen3_head_norms_are_read():
    """Qwen3's q_norm and k_norm (8 values each, every head of q and k): read as head norms in both layers, their
    weights among the norms (the replay matching onnxruntime is the parametrized test above)."""
    from primal_compiler.frontend.onnx_import import recognise_onnx

    found = recognise_onnx(FAMILIES / "qwen3.onnx")
    assert all(x.qk_norm for x in found.model.layers)
    assert sorted(k for k in found.norms if k[1] >= 4) == [(0, 4), (0, 5), (1, 4), (1, 5)]


def test_an_offset_position_comparison_that_is_no_window_is_refused(tmp_path):
    """Gemma-2's window mask with its offset negated (``key > query + 5``): no sliding window, refused naming it."""
    model = onnx.load(str(FAMILIES / "gemma2.onnx"))
    for t in model.graph.initializer:
        if t.name == "val_70":  # the window: Sub(arange, 32)
            t.CopyFrom(onnx.numpy_helper.from_array(np.asarray(-5, np.int64), t.name))
    onnx.save(model, str(tmp_path / "shifted.onnx"))
    with pytest.raises(InputError, match=r"unsupported attention mask in layer 0 at node node_gt: a position "
                                         r"comparison with offset 5, not a sliding window"):
        load_onnx(tmp_path / "shifted.onnx")


def test_a_mask_fill_that_masks_nothing_is_refused(tmp_path):
    """Qwen3's mask is ``Where(allowed, 0, finfo.min)``: with its fill set to 0 it masks nothing, which the causal
    replay would silently contradict; refused naming the Where."""
    model = onnx.load(str(FAMILIES / "qwen3.onnx"))
    for t in model.graph.initializer:
        if t.name == "val_194":
            t.CopyFrom(onnx.numpy_helper.from_array(np.asarray(0.0, np.float32), t.name))
    onnx.save(model, str(tmp_path / "unmasked.onnx"))
    with pytest.raises(InputError, match=r"unsupported attention mask in layer 0 at node node_Where_195: it chooses "
                                         r"between 0 and 0, not 0 and a large negative"):
        load_onnx(tmp_path / "unmasked.onnx")
