"""Built-in architectures match published parameter counts; --lora specs attach adapters."""

from __future__ import annotations

import pytest

from primal_compiler.errors import InputError
from primal_compiler.frontend import load_model
from primal_compiler.frontend.builtin import BUILTIN
from primal_compiler.ir.model import Role


@pytest.mark.parametrize("name", [n for n, c in BUILTIN.items() if c.published_params])
def test_published_parameter_counts(name):
    assert load_model(name).base_params == BUILTIN[name].published_params


def test_llama2_13b_lora():
    m = load_model("llama2-13b", "q,v:8")
    assert (m.num_layers, m.base_params, m.lora_params) == (40, 13_015_864_320, 6_553_600)
    assert m.lora_targets == (Role.Q, Role.V)
    assert m.layers[0].linear(Role.Q).lora.scale == 1.0


def test_lora_variants():
    m = load_model("llama2-70b", "q,k,v,o:16:32")
    q, k = m.layers[0].linear(Role.Q), m.layers[0].linear(Role.K)
    assert q.lora.rank == 16 and q.lora.alpha == 32 and k.out_features == 1024  # GQA: 8 kv heads
    assert load_model("gpt2", "c_attn:4").lora_targets == (Role.QKV,)
    assert set(load_model("mistral-7b", "attn:8;mlp:4").lora_targets) == {Role.Q, Role.K, Role.V, Role.O,
                                                                        Role.GATE, Role.UP, Role.DOWN}


@pytest.mark.parametrize("spec, message", [
    ("q,v", "TARGETS:RANK"), ("q,v:x", "rank 'x' is not a number"), ("q,v:0", "rank must be >= 1"),
    ("zz:8", "unknown target 'zz'"), ("q:8:-1", "alpha > 0"), ("gate:8", "has no gate projection"),
])
def test_bad_lora_specs(spec, message):
    with pytest.raises(InputError, match=message):
        load_model("gpt2" if "gate" in spec else "llama2-7b", spec)


def test_unknown_builtin():
    with pytest.raises(InputError, match="llama9: unknown built-in model"):
        load_model("llama9")


def test_llama3_1_frequencies_follow_its_rope_scaling():
    """Llama-3.1's llama3 scaling (factor 8, low 1, high 4, original 8192), computed in float64 here, equals the
    float32 reference of tests/frontend/families.py (the one a real Llama-3 export's table is checked against);
    Llama-3 and Qwen2.5 keep theta's geometric series."""
    import numpy as np

    from tests.frontend.families import llama3_inv_freq

    freq = np.array(load_model("llama3.1-70b").rope_inv_freq)
    np.testing.assert_allclose(freq, llama3_inv_freq(128), rtol=1e-6)
    assert freq[0] == 1.0 and freq[-1] < 500000.0 ** (-126 / 128) / 7.9  # the longest wavelengths are divided by 8
    assert load_model("llama3-8b").rope_inv_freq == () and load_model("llama3-8b").rope_theta == 500000.0
    qwen = load_model("qwen2.5-7b")
    assert qwen.rope_theta == 1e6 and all(qwen.layers[0].linear(r).bias for r in (Role.Q, Role.K, Role.V))
