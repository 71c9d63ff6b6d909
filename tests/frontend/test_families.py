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
    ("swiglu", {"extra": "softcap"}, r"constant multiplier 30 at node cap_div \(Div\) after the LM head"),
    ("swiglu", {"extra": "attn_scale"}, r"attention scale in layer 0 at node l0_p: scores are scaled by 0\.176777"),
    ("swiglu", {"extra": "rope_factor"}, r"RoPE scaling at node cos_scaled \(Mul of the Cos table by 1\.1"),
    ("relu_squared", {}, r"MLP activation in layer 0 at node l0_relu \(Relu\): it does not compute relu"),
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


def test_a_fused_attention_op_with_another_scale_is_refused(tmp_path):
    from tests.frontend.decoders import fused_decoder

    model = fused_decoder(layers=2)
    for node in model.graph.node:
        if node.op_type == "Attention":
            node.name = f"attention_{len(node.output[0])}"
            node.attribute.append(onnx.helper.make_attribute("scale", 0.25))
    path = tmp_path / "scaled.onnx"
    onnx.save(model, str(path))
    with pytest.raises(InputError, match=r"attention scale in layer 0 at node attention_\d+: scores are scaled by "
                                         r"0\.25, not 1/sqrt\(head_dim\) = 0\.353553"):
        load_model(str(path))
