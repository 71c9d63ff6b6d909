"""Exact mode on Phi-3, Gemma, Llama-3 shaped and parallel-block decoders: the replay computes what ONNX Runtime
computes.

Each variation is also shown to matter: ONNX Runtime's logits move by far more than the tolerance when it is
taken away (the GELU form, the embedding scale and ``1 + w``, the llama3 frequencies), so a replay that
ignored it would fail.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

from primal_compiler.frontend import load_model
from primal_compiler.functional import compile_for_replay, replay_functional
from tests.frontend.families import family_decoder, llama3_inv_freq
from tests.functional.conftest import PLACE
from tests.functional.reference import ort_greedy
from tests.functional.test_exact import PROMPT, TOL, relative_error

GEMMA = {"embed_scale": math.sqrt(32), "norm_offset": True, "mlp_std": 2.0}
CASES = {
    "phi3_split": ("fused_split", {}),
    "phi3_slice": ("fused_slice", {}),
    "gemma_tanh": ("geglu_tanh", GEMMA),
    "gemma_erf": ("geglu_erf", GEMMA),
    "gemma_gelu_op_tanh": ("gelu_op_tanh", GEMMA),
    "gemma_gelu_op_erf": ("gelu_op_erf", GEMMA),
    "llama3": ("swiglu", {"inv_freq": llama3_inv_freq(8), "attn_std": 1.0}),
    "parallel_shared_norm": ("geglu_tanh", {"parallel": "shared"}),  # GPT-J, Falcon, Phi-2
    "parallel_two_norms": ("swiglu", {"parallel": "two"}),  # GPT-NeoX
    "partial_rotary": ("swiglu", {"rotary_dim": 4, "attn_std": 1.0}),
    "partial_rotary_parallel": ("geglu_tanh", {"rotary_dim": 4, "parallel": "shared", "attn_std": 1.0}),  # Phi-2
    "yarn_attention_factor": ("swiglu", {"extra": "yarn", "attn_std": 1.0}),  # cos and sin both x 1.1
    # heads of 24 on 16x16 crossbars straddle column and O input blocks (Phi-3-mini's 96 on 256 columns)
    "heads_straddle_blocks": ("swiglu", {"hidden": 48, "heads": 2, "kv_heads": 1, "attn_std": 1.0}),
    "heads_straddle_fused_qkv_partial": ("fused_split", {"hidden": 48, "heads": 2, "kv_heads": 1, "rotary_dim": 10,
                                                         "attn_std": 1.0}),
}


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    directory = tmp_path_factory.mktemp("families")

    def make(mlp: str, **kw) -> str:
        path = directory / f"{mlp}_{abs(hash(repr(sorted(kw.items(), key=str))))}.onnx"
        if not path.exists():
            onnx.save(family_decoder(mlp, **kw), str(path))
        return str(path)

    return make


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_replay_matches_onnxruntime(name, family, replay_target):
    mlp, kw = CASES[name]
    path = family(mlp, **kw)
    program = compile_for_replay(load_model(path), replay_target, len(PROMPT), 4, PLACE.format(opts="", context=32))
    result = replay_functional(program, replay_target, path, prompt=PROMPT, generate=4)
    want = ort_greedy(path, PROMPT, 4)
    assert relative_error(result.logits, want) < TOL
    assert result.tokens == [int(t) for t in want.argmax(axis=1)]


@pytest.mark.parametrize("with_it,without", [
    (("geglu_tanh", GEMMA), ("swiglu", GEMMA)),  # GELU, not SiLU
    (("geglu_tanh", GEMMA), ("geglu_erf", GEMMA)),  # the tanh form, not erf
    (("geglu_tanh", GEMMA), ("geglu_tanh", {**GEMMA, "embed_scale": None})),
    (("geglu_tanh", GEMMA), ("geglu_tanh", {**GEMMA, "norm_offset": False})),
    (("swiglu", {"inv_freq": llama3_inv_freq(8), "attn_std": 1.0}), ("swiglu", {"attn_std": 1.0})),
    (("swiglu", {"extra": "yarn", "attn_std": 1.0}), ("swiglu", {"attn_std": 1.0})),  # YaRN's factor
])
def test_each_variation_moves_the_logits_beyond_the_tolerance(family, with_it, without):
    a, b = (ort_greedy(family(mlp, **kw), PROMPT, 4) for mlp, kw in (with_it, without))
    assert relative_error(a, b) > 5 * TOL


def test_a_program_file_keeps_the_frequencies_the_scale_and_the_gate(tmp_path, family, replay_target):
    from primal_compiler.compiled import write_compiled
    from primal_compiler.report.collect import load_compiled

    path = family("geglu_tanh", inv_freq=llama3_inv_freq(8), **GEMMA)
    program = compile_for_replay(load_model(path), replay_target, len(PROMPT), 3, PLACE.format(opts="", context=32))
    write_compiled(program, replay_target, tmp_path / "out")
    loaded = load_compiled(tmp_path / "out", replay_target).program()
    assert loaded.model == program.model
    again = replay_functional(loaded, replay_target, path, prompt=PROMPT, generate=3)
    np.testing.assert_array_equal(again.logits, replay_functional(program, replay_target, path, prompt=PROMPT,
                                                                  generate=3).logits)


def test_rope_from_cos_sin_caches_is_refused_by_the_replay(tmp_path, replay_target):
    """RotaryEmbedding ops hold their own cos/sin caches, which the replay does not read: refused, not approximated."""
    from primal_compiler.errors import InputError
    from tests.frontend.decoders import fused_decoder

    path = tmp_path / "fused.onnx"
    onnx.save(fused_decoder(layers=1), str(path))
    program = compile_for_replay(load_model(str(path)), replay_target, len(PROMPT), 2,
                                 PLACE.format(opts="", context=32))
    with pytest.raises(InputError, match=r"node #\d+: RoPE from cos/sin caches is not read"):
        replay_functional(program, replay_target, str(path), prompt=PROMPT, generate=2)


@pytest.mark.parametrize("parallel", ["shared", "two"])
def test_a_parallel_block_read_as_sequential_would_be_wrong(parallel, family, replay_target):
    """The replay follows the flag: the same weights in sequential blocks give other logits."""
    from dataclasses import replace

    path = family("swiglu", parallel=parallel)
    model = load_model(path)
    flat = replace(model, layers=tuple(replace(x, parallel=False, num_norms=2) for x in model.layers))
    pipeline = PLACE.format(opts="", context=32)
    want = ort_greedy(path, PROMPT, 2)
    right = replay_functional(compile_for_replay(model, replay_target, len(PROMPT), 2, pipeline), replay_target,
                              path, prompt=PROMPT, generate=2)
    assert relative_error(right.logits, want) < TOL
    if parallel == "two":  # both norms exist, so the sequential reading runs, and computes something else
        wrong = replay_functional(compile_for_replay(flat, replay_target, len(PROMPT), 2, pipeline), replay_target,
                                  path, prompt=PROMPT, generate=2)
        assert relative_error(wrong.logits, want) > 100 * TOL


def test_partial_rotary_read_as_whole_head_rotary_would_be_wrong(family, replay_target):
    """The replay turns only the first rope_dim dimensions; turning the whole head computes something else."""
    from dataclasses import replace

    path = family("swiglu", rotary_dim=4, attn_std=1.0)
    model = load_model(path)
    inv = tuple(float(v) for v in 1.0 / 10000.0 ** (np.arange(0, 8, 2) / 8))
    whole = replace(model, rope_dim=0, rope_inv_freq=inv)
    pipeline = PLACE.format(opts="", context=32)
    want = ort_greedy(path, PROMPT, 2)
    wrong = replay_functional(compile_for_replay(whole, replay_target, len(PROMPT), 2, pipeline), replay_target,
                              path, prompt=PROMPT, generate=2)
    assert relative_error(wrong.logits, want) > 100 * TOL

