"""What the replay computes with: norm epsilon and RoPE base in the IR, tables and norms from ONNX, checks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from primal_compiler.errors import InputError
from primal_compiler.frontend import load_model
from primal_compiler.frontend.onnx_weights import load_onnx_weights
from primal_compiler.functional.params import load_params
from primal_compiler.ir.model import Role
from tests.functional.conftest import FIXTURES, fixture

ALL = sorted(p.stem for p in FIXTURES.glob("*.onnx"))


@pytest.mark.parametrize("name", ALL)
def test_norm_epsilon_rope_base_and_tables_are_recognised(name):
    facts = json.loads((FIXTURES / f"{name}.json").read_text())
    weights = load_onnx_weights(fixture(name))
    model, tables = weights.model, weights.tables
    rms = facts["norm"] == "rmsnorm"
    assert model.norm_eps == pytest.approx(1e-6 if rms else 1e-5, rel=1e-6)  # HF defaults of these configs
    assert model.rope_theta == 10000.0
    h = facts["hidden_size"]
    assert tables.embed.shape == (facts["vocab_size"], h)
    pos_rows = facts.get("static_seq_len", facts["num_pos_embeddings"])
    assert (tables.pos_embed is None) == (facts["positional"] == "rope")
    assert tables.pos_embed is None or tables.pos_embed.shape == (pos_rows, h)
    assert sorted(tables.norms) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
    for scale, bias in tables.norms.values():
        assert scale.shape == (h,) and (bias is None) == rms and len(np.unique(scale)) > 1


def test_a_tied_head_reads_the_embedding_table():
    params = load_params(load_model(fixture("gpt2_optimum")), fixture("gpt2_optimum"))
    model = load_model(fixture("gpt2_optimum"))
    assert model.tie_word_embeddings
    np.testing.assert_array_equal(params.w[(2, Role.LM_HEAD)], params.embed.T)


def test_weights_of_another_model_are_rejected():
    with pytest.raises(InputError, match=r"mistral_dynamo.onnx: layer 0 q weight is 48x48, the program expects 32x32"):
        load_params(load_model(fixture("llama_dynamo")), fixture("mistral_dynamo"))


def test_lora_missing_from_the_weights_is_rejected():
    with pytest.raises(InputError, match=r"llama_dynamo.onnx: file has LoRA on nothing, model has LoRA on q,v"):
        load_params(load_model(fixture("llama_dynamo"), "q,v:4"), fixture("llama_dynamo"))


def test_rotation_pairs_stored_adjacent_rotate_as_rotate_half_does():
    """Hugging Face's rotate_half on a head in the file's order equals the replay's adjacent-pair rotation
    on the same head in stored order (``ir.columns.pair_order``), whole and partial."""
    from primal_compiler.functional import ops
    from primal_compiler.ir.columns import pair_order

    rng = np.random.default_rng(3)
    for hd, rot in ((8, 8), (24, 24), (16, 4)):
        x = rng.normal(size=(3, hd)).astype(np.float32)
        pos = np.array([0, 5, 17])
        inv = (10000.0 ** (-np.arange(0, rot, 2) / rot)).astype(np.float32)
        ang = pos[:, None] * np.concatenate([inv, inv])[None, :]
        half = np.concatenate([-x[:, rot // 2: rot], x[:, : rot // 2]], axis=1)
        want = np.concatenate([x[:, :rot] * np.cos(ang) + half * np.sin(ang), x[:, rot:]], axis=1)
        order = pair_order(hd, rot)
        d = np.arange(hd)
        freq = np.where(d < rot, d // 2, -1)
        partner = np.where(d < rot, d ^ 1, d)
        got = ops.rope(x[:, order], pos, freq, partner, d % 2 == 0, inv)
        np.testing.assert_allclose(got, want[:, order], atol=1e-5)
