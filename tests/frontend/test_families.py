"""Phi-3, Gemma and Llama-3 shaped decoders (``tests/frontend/families.py``): read as they are, or refused in one
line naming the node. The exact replay of the supported ones is ``tests/functional/test_families.py``."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

from primal_compiler.errors import InputError
from primal_compiler.frontend import load_model
from primal_compiler.frontend.onnx_weights import load_onnx_weights
from primal_compiler.ir.model import Activation, Role
from tests.frontend.families import family_decoder, llama3_inv_freq


def save(tmp_path, mlp: str = "swiglu", **kw) -> str:
    path = tmp_path / f"{mlp}.onnx"
    onnx.save(family_decoder(mlp, **kw), str(path))
    return str(path)


def replays_exactly(path: str) -> None:
    """``primal check``: the functional replay of the file at ``path`` matches onnxruntime to 1e-5."""
    pytest.importorskip("onnxruntime")
    from primal_compiler.report.check import check_onnx
    from primal_compiler.target import load_primal_target

    info = check_onnx(path, load_primal_target("primal-7nm"))
    assert info["verdict"] == "OK" and info["relative_error"] < 1e-5, info


def with_constant(model: onnx.ModelProto, name: str, value: float) -> onnx.ModelProto:
    """``model`` with the float32 initializer ``name`` set to ``value``."""
    for t in model.graph.initializer:
        if t.name == name:
            t.CopyFrom(onnx.numpy_helper.from_array(np.asarray(value, np.float32), t.name))
    return model


def refusal(tmp_path, model: onnx.ModelProto) -> str:
    """The one-line problem reading ``model`` is refused with."""
    path = tmp_path / "refused.onnx"
    onnx.save(model, str(path))
    with pytest.raises(InputError) as err:
        load_model(str(path))
    assert "\n" not in str(err.value)
    return err.value.problem


def mlp_shapes(model) -> list[tuple[Role, int, int]]:
    return [(lin.role, lin.in_features, lin.out_features) for lin in model.layers[0].linears
            if lin.role in (Role.GATE, Role.UP, Role.DOWN, Role.FC1, Role.FC2)]


@pytest.mark.parametrize("mlp", ["fused_split", "fused_slice"])
def test_a_fused_gate_up_is_a_gate_and_an_up_projection(tmp_path, mlp):
    """Phi-3's gate_up_proj: one 32x48 MatMul cut in two halves, the first gating (not an ungated MLP of 48)."""
    model = load_model(save(tmp_path, mlp))
    separate = load_model(save(tmp_path, "swiglu"))
    assert mlp_shapes(model) == [(Role.GATE, 32, 24), (Role.UP, 32, 24), (Role.DOWN, 24, 32)]
    assert model.layers[0].activation == Activation.SILU and model.intermediate_size == 24
    assert model.base_params == separate.base_params
    weights = load_onnx_weights(save(tmp_path, mlp))
    fused = onnx.numpy_helper.to_array(next(t for t in onnx.load(save(tmp_path, mlp)).graph.initializer
                                            if t.name == "l0_Wgu"))
    np.testing.assert_array_equal(weights.get(0, Role.GATE).w, fused[:, :24])
    np.testing.assert_array_equal(weights.get(0, Role.UP).w, fused[:, 24:])


@pytest.mark.parametrize("mlp,activation", [("geglu_tanh", Activation.GELU_NEW), ("geglu_erf", Activation.GELU),
                                             ("gelu_op_tanh", Activation.GELU_NEW), ("gelu_op_erf", Activation.GELU),
                                             ("swiglu", Activation.SILU)])
def test_a_gated_mlp_keeps_its_activation(tmp_path, mlp, activation):
    model = load_model(save(tmp_path, mlp))
    assert mlp_shapes(model) == [(Role.GATE, 32, 24), (Role.UP, 32, 24), (Role.DOWN, 24, 32)]
    assert {layer.activation for layer in model.layers} == {activation}


def test_gemma_embedding_scale_and_one_plus_w_norm(tmp_path):
    path = save(tmp_path, "geglu_tanh", embed_scale=math.sqrt(32), norm_offset=True)
    model = load_model(path)
    assert model.embed_scale == pytest.approx(math.sqrt(32), rel=1e-7)
    assert load_model(save(tmp_path, "swiglu")).embed_scale == 1.0
    tables = load_onnx_weights(path).tables
    raw = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    scale, bias = tables.norms[(0, 0)]
    np.testing.assert_array_equal(scale, raw["l0_n1w"] + np.float32(1))
    assert bias is None


@pytest.mark.parametrize("parallel,norms", [("shared", 1), ("two", 2)])
def test_a_parallel_block_reads_the_layer_input_for_its_mlp(tmp_path, parallel, norms):
    """GPT-J/Falcon/Phi-2 (one shared norm) and GPT-NeoX (a norm each): x + attn(n1(x)) + mlp(n(x))."""
    model = load_model(save(tmp_path, "swiglu", parallel=parallel))
    sequential = load_model(save(tmp_path, "swiglu"))
    assert all(layer.parallel and layer.num_norms == norms for layer in model.layers)
    assert not any(layer.parallel for layer in sequential.layers)
    assert mlp_shapes(model) == mlp_shapes(sequential)
    assert model.base_params == sequential.base_params - (2 - norms) * 32 * model.num_layers
    tables = load_onnx_weights(save(tmp_path, "swiglu", parallel=parallel)).tables
    assert sorted(tables.norms) == sorted([(n, k) for n in range(2) for k in range(norms)] + [(2, 0)])


def test_partial_rotary_turns_the_first_dimensions_of_each_head(tmp_path):
    """GPT-NeoX/Phi-2: half the head rotates (a table of 2 frequencies for head_dim 8); the rest passes."""
    model = load_model(save(tmp_path, "swiglu", rotary_dim=4))
    assert model.rope_dim == 4 and len(model.rope_inv_freq) == 2
    np.testing.assert_allclose(model.rope_inv_freq, 1.0 / 10000.0 ** (np.arange(0, 4, 2) / 4), rtol=1e-6)
    assert load_model(save(tmp_path, "swiglu")).rope_dim == 0  # the whole head


def test_rotating_the_last_dimensions_is_refused(tmp_path):
    with pytest.raises(InputError) as err:
        load_model(save(tmp_path, "swiglu", rotary_dim=4, rotary_last=True))
    assert err.value.problem == ("unsupported partial rotary at node l0_qxc: no query or key head is cut into its "
                                 "first 4 dimensions (rotated) and the rest (passed through)")


def test_llama3_frequencies_are_read_not_rederived(tmp_path):
    inv = llama3_inv_freq(8)
    model = load_model(save(tmp_path, inv_freq=inv))
    assert model.rope_inv_freq == tuple(float(f) for f in inv)
    assert model.rope_theta == 500000.0  # the base, reported from the unscaled first frequencies
    plain = load_model(save(tmp_path))
    assert plain.rope_theta == 10000.0 and len(plain.rope_inv_freq) == 4


@pytest.mark.parametrize("mlp,kw,message", [
    ("swiglu", {"extra": "residual_scale"}, r"constant multiplier 0\.9 at node residual_scale \(Mul\)"),
    ("swiglu", {"extra": "residual_shift"}, r"constant added at node residual_shift \(Add\) on the residual stream"),
    ("swiglu", {"extra": "unknown_op"}, r"unsupported node unknown_sin \(Sin\) in the decoder"),
    ("swiglu", {"extra": "stream_tanh"}, r"node stream_tanh \(Tanh\) outside an MLP activation"),
    ("swiglu", {"extra": "rope_factor"}, r"RoPE scaling at node cos_scaled \(Mul of the Cos table by 1\.1"),
    ("swiglu", {"extra": "two_tables"}, r"RoPE at node cos \(Cos\): it depends on 2 different inverse-frequency"),
    ("quick_gelu", {}, r"MLP activation in layer 0 at node l0_kx \(Mul\): it does not compute silu \(off by 0\.14"),
])
def test_an_unaccounted_node_is_refused_naming_it(tmp_path, mlp, kw, message):
    with pytest.raises(InputError, match=message) as exc:
        load_model(save(tmp_path, mlp, **kw))
    assert "\n" not in str(exc.value)


def test_lora_on_a_fused_gate_up_is_refused(tmp_path):
    with pytest.raises(InputError, match=r"unsupported MLP: LoRA on the fused gate/up projection at node l0_gu$"):
        load_model(save(tmp_path, "fused_split", lora=True))


def test_a_fused_attention_op_with_another_scale_is_read(tmp_path):
    """onnxruntime's fused Attention with ``scale`` 0.25 (head size 8: not 1/sqrt(8)) is the model's
    attention_scale (this decoder's RoPE comes from cos/sin caches the replay does not read, so the exact
    comparison is the unfused family's, above)."""
    from tests.frontend.decoders import fused_decoder

    model = fused_decoder(layers=2)
    for node in model.graph.node:
        if node.op_type == "Attention":
            node.name = f"attention_{len(node.output[0])}"
            node.attribute.append(onnx.helper.make_attribute("scale", 0.25))
    path = tmp_path / "scaled.onnx"
    onnx.save(model, str(path))
    assert load_model(str(path)).attention_scale == 0.25


@pytest.mark.parametrize("kw", [{}, {"rotary_dim": 4}])
def test_a_positionless_layer_is_not_rotated(tmp_path, kw):
    """NoPE layers between RoPE layers (SmolLM3, Llama 4): their queries and keys enter attention unrotated,
    and the replay matches onnxruntime (rotating them misses by ~5% of the logit scale)."""
    pytest.importorskip("onnxruntime")
    from primal_compiler.report.check import check_onnx
    from primal_compiler.target import load_primal_target

    from primal_compiler.report.inspect import inspect_model, render_inspect

    path = save(tmp_path, layers=4, nope_layers=(0, 2), attn_std=1.0, **kw)
    assert [layer.rope for layer in load_model(path).layers] == [False, True, False, True]
    described = inspect_model(load_model(path), load_primal_target("primal-7nm"))
    assert described["nope_layers"] == [0, 2] and "layers 0, 2 positionless (NoPE)" in render_inspect(described)
    info = check_onnx(path, load_primal_target("primal-7nm"))
    assert info["verdict"] == "OK" and info["relative_error"] < 1e-5, info


def test_gemma2_logit_soft_capping_is_read_and_replayed(tmp_path):
    """Gemma 2's final soft-capping (Div by 30, Tanh, Mul by 30 after the LM head): read as the model's
    logit_softcap, and ``primal check`` finds the replay matching onnxruntime (it was refused before)."""
    from primal_compiler.report.inspect import inspect_model, render_inspect
    from primal_compiler.target import load_primal_target

    path = save(tmp_path, extra="softcap")
    model = load_model(path)
    assert (model.logit_scale, model.logit_softcap) == (pytest.approx(1.0), pytest.approx(30.0))
    assert "logits soft-capped at 30" in render_inspect(inspect_model(model, load_primal_target("primal-7nm")))
    replays_exactly(path)


def test_an_attention_scale_other_than_the_head_size_s_is_read_and_replayed(tmp_path):
    """Scores scaled by 0.5/sqrt(head_dim) in every layer (Gemma's query_pre_attn_scalar is such a scale): read
    as the model's attention_scale, and the replay matches onnxruntime (it was refused before)."""
    path = save(tmp_path, extra="attn_scale", attn_std=1.0)
    model = load_model(path)
    assert model.attention_scale == pytest.approx(0.5 / math.sqrt(8)) == pytest.approx(model.score_scale)
    replays_exactly(path)
    plain = load_model(save(tmp_path))
    assert plain.attention_scale == 0 and plain.score_scale == pytest.approx(1 / math.sqrt(8))


def test_a_squared_relu_mlp_is_read_and_replayed(tmp_path):
    """Nemotron's relu(x)^2 (a Relu multiplied by itself): the layers' activation, and the replay matches
    onnxruntime (it was refused as 'not relu' before)."""
    path = save(tmp_path, "relu_squared")
    assert {layer.activation for layer in load_model(path).layers} == {Activation.RELU_SQUARED}
    replays_exactly(path)


def test_soft_capped_attention_scores_are_read_and_replayed(tmp_path):
    """Gemma 2's attention soft-cap (scores divided by 2, Tanh, multiplied by 2, before the softmax): the
    model's attn_softcap, charged act.attn_softcap_ops_per_element more per score on the QK DMACs, and the
    replay matches onnxruntime (a Tanh there was refused before)."""
    from primal_compiler.api import compile_model
    from primal_compiler.isa.opcodes import DmacOp, Opcode
    from primal_compiler.target import load_primal_target

    from primal_compiler.report.inspect import inspect_model, render_inspect

    path = save(tmp_path, extra="attn_softcap", attn_std=1.0)
    model = load_model(path)
    assert model.attn_softcap == pytest.approx(2.0) and model.attention_scale == 0
    target = load_primal_target("primal-7nm")
    assert "attention scores soft-capped at 2" in render_inspect(inspect_model(model, target))
    replays_exactly(path)
    counts = []
    for m in (model, load_model(save(tmp_path))):
        stream = compile_model(m, target, "lower-tiles,blocking,zcurve-order,kv-ring{context=64},codegen").stream
        qk = stream.records[(stream.records["op"] == Opcode.DMAC) & ((stream.records["arg"] & 0xFF) == DmacOp.QK)]
        counts.append(int(qk["count"].astype(int).sum()))
    assert counts[0] * 8 == counts[1] * (8 + target.act.attn_softcap_ops_per_element)  # head size 8 per score


@pytest.mark.parametrize("change, message", [
    ({"l0_acap": 3.0}, r"Tanh on the attention scores of layer 0 at node l0_act: not a soft-cap"),
])
def test_a_tanh_on_the_scores_that_is_not_a_soft_cap_is_refused(tmp_path, change, message):
    model = family_decoder(extra="attn_softcap")
    for t in model.graph.initializer:
        if t.name in change:  # the Div and the Mul share the constant: give the Mul its own
            model.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(change[t.name], np.float32),
                                                                        t.name + "_mul"))
    for node in model.graph.node:
        if node.name == "l0_acm":
            node.input[1] = "l0_acap_mul"
    path = tmp_path / "notcap.onnx"
    onnx.save(model, str(path))
    with pytest.raises(InputError, match=message):
        load_model(str(path))


def test_a_multiplier_on_every_residual_branch_is_read_and_replayed(tmp_path):
    """Granite's residual_multiplier (each attention and MLP output times 0.4 before its residual add): the
    model's residual_multiplier, and the replay matches onnxruntime (refused before)."""
    from primal_compiler.report.inspect import inspect_model, render_inspect
    from primal_compiler.target import load_primal_target

    path = save(tmp_path, extra="branch_scale")
    assert load_model(path).residual_multiplier == pytest.approx(0.4)
    shown = render_inspect(inspect_model(load_model(path), load_primal_target("primal-7nm")))
    assert "residual branches multiplied by 0.4" in shown
    replays_exactly(path)
    assert load_model(save(tmp_path)).residual_multiplier == 1.0


def test_clamped_queries_keys_and_values_are_read_and_replayed(tmp_path):
    """OLMo's clip_qkv (every q, k and v projection clamped to [-0.5, 0.5]): the model's qkv_clip, an ACT CLIP
    at every q, k and v root, and the replay matches onnxruntime (a Clip was an unknown node before)."""
    from primal_compiler.api import compile_model
    from primal_compiler.isa.opcodes import ActFn, Opcode
    from primal_compiler.target import load_primal_target

    path = save(tmp_path, extra="clip_qkv", attn_std=1.0)
    model = load_model(path)
    assert model.qkv_clip == pytest.approx(0.5)
    from primal_compiler.report.inspect import inspect_model, render_inspect

    assert "q/k/v clamped to +-0.5" in render_inspect(inspect_model(model, load_primal_target("primal-7nm")))
    stream = compile_model(model, load_primal_target("primal-7nm"),
                           "lower-tiles,blocking,zcurve-order,kv-ring{context=64},codegen").stream
    clips = (stream.records["op"] == Opcode.ACT) & ((stream.records["arg"] & 0xFF) == ActFn.CLIP)
    assert clips.sum() > 0
    replays_exactly(path)


def test_a_clamp_that_is_not_symmetric_is_refused(tmp_path):
    problem = refusal(tmp_path, with_constant(family_decoder(extra="clip_qkv"), "l0_clo", -0.25))
    assert problem == "unsupported Clip at node l0_clip_q after a q/k/v projection: bounds -0.25 and 0.5, not -c and c"


def test_branches_multiplied_differently_are_refused(tmp_path):
    assert refusal(tmp_path, with_constant(family_decoder(extra="branch_scale"), "l1_bm2", 0.5)) == ("unsupported residual multiplier: the attention branch of layer 0 is multiplied by "
                                 "0.4, the MLP branch of layer 1 by 0.5 (the replay takes one multiplier for every "
                                 "branch)")


def test_layers_that_scale_their_scores_differently_are_refused(tmp_path):
    assert refusal(tmp_path, with_constant(family_decoder(extra="attn_scale"), "l1_scale2", 0.25)) == ("unsupported attention scale: layer 0 scales its scores by 0.176777, layer 1 by "
                                 "0.0883883 (the replay takes one scale for every layer)")


def test_a_model_whose_layers_all_skip_rotary_is_refused(tmp_path):
    with pytest.raises(InputError) as err:
        load_model(save(tmp_path, nope_layers=(0, 1)))
    assert err.value.problem == "unsupported position encoding: no layer rotates its queries and keys"


@pytest.mark.parametrize("mlp,kw", [
    ("swiglu", {}), ("geglu_tanh", {"embed_scale": math.sqrt(32), "norm_offset": True}), ("geglu_erf", {}),
    ("swiglu", {"extra": "yarn"}), ("swiglu", {"rotary_dim": 4}),
])
def test_an_fp16_export_is_read_within_its_constants_rounding(tmp_path, mlp, kw):
    """1/sqrt(8) stored in fp16 is 0.353516 and GELU's constants lose 4 digits: compared within fp16's
    rounding, not float32's; the replay matches onnxruntime's fp16 run."""
    pytest.importorskip("onnxruntime")
    from primal_compiler.report.check import check_onnx
    from primal_compiler.target import load_primal_target
    from tests.frontend.families import to_float16

    path = tmp_path / "half.onnx"
    onnx.save(to_float16(family_decoder(mlp, **kw)), str(path))
    info = check_onnx(str(path), load_primal_target("primal-7nm"))
    assert info["verdict"] == "OK" and info["precision"] == "fp16" and info["relative_error"] < 1e-3, info


def test_an_fp16_position_table_is_read(tmp_path):
    pytest.importorskip("onnxruntime")
    from primal_compiler.report.check import check_onnx
    from primal_compiler.target import load_primal_target
    from tests.frontend.families import to_float16

    path = tmp_path / "gptj_half.onnx"
    onnx.save(to_float16(onnx.load("tests/fixtures/onnx/families/gptj.onnx")), str(path))
    info = check_onnx(str(path), load_primal_target("primal-7nm"))
    assert info["verdict"] == "OK" and info["relative_error"] < 1e-3, info


@pytest.mark.parametrize("scale", [0.352, 0.3])
def test_an_fp16_attention_scale_off_by_more_than_its_rounding_is_refused(tmp_path, scale):
    from tests.frontend.families import to_float16

    model = to_float16(family_decoder())
    for t in model.graph.initializer:
        if t.name == "l0_scale":
            t.CopyFrom(onnx.numpy_helper.from_array(np.array(scale, np.float16), t.name))
    path = tmp_path / "half.onnx"
    onnx.save(model, str(path))
    with pytest.raises(InputError, match=r"unsupported attention scale: layer 0 scales its scores by 0\.3\d*, "
                                         r"layer 1 by 1/sqrt\(head_dim\)"):  # layer 0's alone: the layers differ
        load_model(str(path))


@pytest.mark.parametrize("rank", [32, 64, 96])
def test_a_lora_of_rank_at_or_above_a_projections_width_is_an_adapter(tmp_path, rank):
    """Rank 64 on a 64-wide q (and a 32-wide v): the adapter's A is 64x64, shaped like a projection, but it
    reads the base projection's input and its B's output is added to the base's: an adapter."""
    pytest.importorskip("onnxruntime")
    from primal_compiler.report.check import check_onnx
    from primal_compiler.target import load_primal_target

    path = save(tmp_path, hidden=64, lora_qv=rank)
    loras = {lin.role: lin.lora for lin in load_model(path).layers[0].linears if lin.lora is not None}
    assert {role: (lora.rank, lora.alpha) for role, lora in loras.items()} == {Role.Q: (rank, 2.0 * rank),
                                                                            Role.V: (rank, 2.0 * rank)}
    info = check_onnx(path, load_primal_target("primal-7nm"))
    assert info["verdict"] == "OK" and info["relative_error"] < 1e-5, info


def test_sandwich_norms_are_read_and_replayed(tmp_path):
    """Gemma 2's sandwich (each branch normed, 1 + w, before its residual add): four norms a layer, counted in
    the parameters, a distributed norm at ``mid`` and at ``out`` per layer, and the replay matches onnxruntime
    (refused as "a sandwich norm" before)."""
    from primal_compiler.api import compile_model
    from primal_compiler.isa.opcodes import ActFn, Opcode
    from primal_compiler.report.inspect import inspect_model, render_inspect
    from primal_compiler.target import load_primal_target

    target = load_primal_target("primal-7nm")
    plain = load_model(save(tmp_path, norm_offset=True))
    path = save(tmp_path, extra="sandwich", norm_offset=True)
    model = load_model(path)
    assert [(x.num_norms, x.post_norms) for x in model.layers] == [(4, True), (4, True)]
    assert model.base_params - plain.base_params == 2 * 2 * model.hidden_size
    assert "sandwich norms" in render_inspect(inspect_model(model, target))

    def norms(m):
        s = compile_model(m, target, "lower-tiles,blocking,zcurve-order,kv-ring{context=64},codegen{steps=1}").stream
        return ((s.records["op"] == Opcode.ACT) & ((s.records["arg"] & 0xFF) == ActFn.RMSNORM)).sum()
    assert norms(model) - norms(plain) == 2 * 2 * 2  # two more a layer, two layers, prefill and one decode step
    replays_exactly(path)


def test_a_sandwich_with_one_branch_normed_is_refused(tmp_path):
    model = family_decoder(extra="sandwich")
    for n in model.graph.node:  # layer 0's MLP output bypasses its norm
        if n.name == "l0_h2":
            n.input[1] = "l0_d"
    assert refusal(tmp_path, model) == ("unsupported sandwich norm in layer 0: only the attention output is normed "
                                        "before its residual add")


def test_query_and_key_head_norms_are_read_and_replayed(tmp_path):
    """Qwen3's q/k norms (every head of q and k RMS-normalised before RoPE, one weight each): two head_dim weights
    a layer in the parameters, an ACT QK_NORM at every q and k root, and the replay matches onnxruntime with
    sharp attention (their norm nodes were refused before)."""
    from primal_compiler.api import compile_model
    from primal_compiler.isa.opcodes import ActFn, Opcode
    from primal_compiler.report.inspect import inspect_model, render_inspect
    from primal_compiler.target import load_primal_target

    target = load_primal_target("primal-7nm")
    plain = load_model(save(tmp_path))
    path = save(tmp_path, qk_norm="head", attn_std=1.0)
    model = load_model(path)
    assert all(x.qk_norm for x in model.layers)
    assert model.base_params - plain.base_params == 2 * 2 * model.attention.head_dim
    assert "query and key heads RMS-normalised" in render_inspect(inspect_model(model, target))
    s = compile_model(model, target, "lower-tiles,blocking,zcurve-order,kv-ring{context=64},codegen{steps=1}").stream
    normed = (s.records["op"] == Opcode.ACT) & ((s.records["arg"] & 0xFF) == ActFn.QK_NORM)
    assert normed.sum() == 2 * 2 * 2  # a q and a k root a layer, two layers, prefill and one decode step
    replays_exactly(path)


@pytest.mark.parametrize("kind,message", [
    ("q_only", "unsupported q/k norm in layer 0: its queries are normed, its keys not"),
    ("whole", "unsupported q/k norm in layer 0: the queries' norm spans the whole 32-wide projection, not each "
              "8-wide head"),
])
def test_q_k_norms_that_are_not_head_norms_of_both_are_refused(tmp_path, kind, message):
    assert refusal(tmp_path, family_decoder(qk_norm=kind)) == message


def test_head_norms_of_heads_straddling_two_roots_are_refused(tmp_path):
    """Head size 24 does not divide the 256 crossbar columns: a head would straddle two roots' blocks."""
    from primal_compiler.api import compile_model
    from primal_compiler.target import load_primal_target

    model = load_model(save(tmp_path, qk_norm="head", hidden=48, heads=2, kv_heads=2))
    with pytest.raises(InputError, match=r"q/k head norms need whole heads at each root, and head size 24 does not "
                                         r"divide the crossbar's 256 columns"):
        compile_model(model, load_primal_target("primal-7nm"), "lower-tiles,blocking,zcurve-order,kv-ring{context=64},"
                      "codegen{steps=1}")


def _mask_changed(change) -> onnx.ModelProto:
    model = family_decoder()
    for t in model.graph.initializer:
        if t.name == "mask":
            t.CopyFrom(onnx.numpy_helper.from_array(change(onnx.numpy_helper.to_array(t).copy()), "mask"))
    return model


@pytest.mark.parametrize("change,message", [
    (lambda m: np.where(m < 0, 1e9, m).astype(np.float32), "l0_sm: it adds 1e+09 to scores"),
    (lambda m: np.triu(m, 2).astype(np.float32), "l0_sm: its 64x64 table is not causal"),
])
def test_a_mask_that_is_not_causal_is_refused(tmp_path, change, message):
    """The replay masks causally: a constant mask adding anything but 0 and a large negative, or not causal, is
    refused naming it (it replayed as causal before)."""
    assert refusal(tmp_path, _mask_changed(change)).startswith(f"unsupported attention mask in layer 0 at node "
                                                               f"{message}")


def test_a_norm_that_does_not_square_is_refused(tmp_path):
    model = family_decoder()
    for n in model.graph.node:
        if n.name == "l0_n1sq":  # x * x -> x ** 3
            n.op_type, n.input[1] = "Pow", "three"
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(3.0, np.float32), "three"))
    assert refusal(tmp_path, model) == "unsupported norm at node l0_n1sq: Pow by 3.0, not 2 (a square)"


def test_norms_sharing_one_constant_of_ones_count_no_parameters(tmp_path):
    """OLMo's non-parametric LayerNorm, as an exporter writes it: every norm multiplies by the same constant of
    ones. Those count no parameters (inspect counted hidden per norm before); norms each with a tensor of their
    own, even all ones (a model at its initial weights), are learned and count; both replay exactly."""
    import re

    def ones(shared: bool) -> onnx.ModelProto:
        model = family_decoder(attn_std=1.0)
        for k, n in enumerate(n for n in model.graph.node if n.op_type == "Mul" and re.fullmatch(r"(l\d+_n\d|nf)y",
                                                                                                  n.name)):
            name = "ones" if shared else f"ones{k}"
            if not shared or k == 0:
                model.graph.initializer.append(onnx.numpy_helper.from_array(np.ones(32, np.float32), name))
            n.input[1] = name
        return model

    learned = load_model(save(tmp_path))
    for shared in (True, False):
        path = tmp_path / f"ones_{shared}.onnx"
        onnx.save(ones(shared), str(path))
        model = load_model(str(path))
        assert model.norm_weights is not shared
        assert learned.base_params - model.base_params == (5 * 32 if shared else 0)
        replays_exactly(str(path))
