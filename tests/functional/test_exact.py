"""Exact mode: the replayed stream computes the logits ONNX Runtime computes on the same file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from primal_compiler.frontend.onnx_weights import load_onnx_weights
from primal_compiler.functional import replay_functional
from tests.functional.conftest import compiled, fixture
from tests.functional.reference import ort_greedy

PROMPT = [3, 1, 4, 1, 5]
LONG_PROMPT = [7, 2, 9, 4, 1, 8, 3, 6]  # TorchScript exports run at the traced length of 8 tokens only
TOL = 1e-5  # max abs error relative to the largest reference logit (required: 1e-4; measured: below 4e-7)

DYNAMIC = [
    "llama_dynamo", "llama_optimum", "llama_optimum_past", "llama_lora_qkvo_r8_dynamo",
    "llama_lora_mlp_r4_optimum_past", "mistral_dynamo", "mistral_optimum", "mistral_optimum_past",
    "mistral_lora_qv_r2_dynamo", "gpt2_dynamo", "gpt2_optimum", "gpt2_optimum_past", "gpt2_lora_cattn_r4_dynamo",
    "opt_dynamo", "opt_optimum", "opt_optimum_past", "opt_lora_qv_r4_optimum",
]
FIXED_LENGTH = [
    "llama_torchscript", "llama_lora_qv_r4_torchscript", "mistral_torchscript", "mistral_lora_qv_r2_torchscript",
    "gpt2_torchscript", "gpt2_lora_cattn_r4_torchscript", "gpt2_dynamo_static", "opt_torchscript",
    "opt_lora_qv_r4_torchscript",
]


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("name", DYNAMIC)
def test_prefill_and_greedy_decode_match_onnxruntime(name, replay_target):
    program = compiled(name, replay_target, len(PROMPT), 4)
    result = replay_functional(program, replay_target, fixture(name), prompt=PROMPT, generate=4)
    want = ort_greedy(fixture(name), PROMPT, 4)
    assert result.logits.shape == want.shape
    assert relative_error(result.logits, want) < TOL
    assert result.tokens == [int(t) for t in want.argmax(axis=1)]


SHARP = ["llama_dynamo", "llama_lora_qkvo_r8_dynamo", "mistral_optimum_past", "mistral_lora_qv_r2_dynamo",
         "gpt2_optimum", "gpt2_lora_cattn_r4_dynamo", "opt_dynamo", "opt_lora_qv_r4_optimum"]


@pytest.mark.parametrize("name", SHARP)
def test_sharp_attention_matches_onnxruntime(name, replay_target, sharp):
    """Attention that decides the logits: scores, causal masks, RoPE and GQA grouping are all exercised."""
    program = compiled(name, replay_target, len(PROMPT), 4)
    result = replay_functional(program, replay_target, sharp(name), prompt=PROMPT, generate=4)
    want = ort_greedy(sharp(name), PROMPT, 4)
    assert relative_error(want, ort_greedy(fixture(name), PROMPT, 4)) > 0.1  # the scaling matters
    assert relative_error(result.logits, want) < TOL


@pytest.mark.parametrize("name", FIXED_LENGTH)
def test_prefill_of_fixed_length_exports_matches_onnxruntime(name, replay_target):
    program = compiled(name, replay_target, len(LONG_PROMPT), 1)
    result = replay_functional(program, replay_target, fixture(name), prompt=LONG_PROMPT, generate=1)
    assert relative_error(result.logits, ort_greedy(fixture(name), LONG_PROMPT, 1)) < TOL


def test_bit_sliced_weights_are_shifted_back_by_the_reduction(replay_target):
    """8-bit base weights on 4-bit cells: two crossbar slices per block, recombined by REDUCE."""
    program = compiled("opt_lora_qv_r4_optimum", replay_target, len(PROMPT), 2, lower="base_bits=8")
    assert (program.tiles.slice == 1).any()
    result = replay_functional(program, replay_target, fixture("opt_lora_qv_r4_optimum"), prompt=PROMPT, generate=2)
    assert relative_error(result.logits, ort_greedy(fixture("opt_lora_qv_r4_optimum"), PROMPT, 2)) < TOL


def write_peft_adapter(directory, lora_fixture: str, modules: dict[str, str], prefix: str) -> None:
    """A PEFT adapter directory holding the LoRA factors of ``lora_fixture`` (PEFT layout: A r x in, B out x r)."""
    from safetensors.numpy import save_file

    weights = load_onnx_weights(fixture(lora_fixture), base=False)
    tensors, rank, alpha = {}, 0, 0.0
    for (layer, role), p in weights.lora.items():
        module = f"{prefix}.{layer}.{modules[role.value]}"
        tensors[f"{module}.lora_A.weight"] = np.ascontiguousarray(p.a.T)
        tensors[f"{module}.lora_B.weight"] = np.ascontiguousarray(p.b.T)
        rank, alpha = p.rank, p.scale * p.rank
    directory.mkdir()
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha,
              "target_modules": sorted({m.rsplit(".", 1)[-1] for m in modules.values()})}
    (directory / "adapter_config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("base,lora_fixture,spec,modules,prefix", [
    ("llama_dynamo", "llama_lora_qkvo_r8_dynamo", "q,k,v,o:8",
     {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj"},
     "base_model.model.model.layers"),
    ("gpt2_dynamo", "gpt2_lora_cattn_r4_dynamo", "qkv:4", {"qkv": "attn.c_attn"}, "base_model.model.transformer.h"),
])
def test_a_peft_adapter_directory_supplies_the_lora(tmp_path, replay_target, base, lora_fixture, spec, modules,
                                                    prefix):
    """Base weights from the plain export, LoRA from a PEFT directory = the export with the adapter inside."""
    adapter = tmp_path / "adapter"
    write_peft_adapter(adapter, lora_fixture, modules, prefix)
    program = compiled(base, replay_target, len(PROMPT), 3, lora=spec)
    result = replay_functional(program, replay_target, fixture(base), adapter, prompt=PROMPT, generate=3)
    assert relative_error(result.logits, ort_greedy(fixture(lora_fixture), PROMPT, 3)) < TOL


def test_a_program_file_replays_like_the_compiled_program(tmp_path, replay_target):
    from primal_compiler.compiled import write_compiled
    from primal_compiler.report.collect import load_compiled

    program = compiled("opt_lora_qv_r4_optimum", replay_target, len(PROMPT), 3)
    write_compiled(program, replay_target, tmp_path / "out")
    loaded = load_compiled(tmp_path / "out", replay_target).program()
    path = fixture("opt_lora_qv_r4_optimum")
    again = replay_functional(loaded, replay_target, path, prompt=PROMPT, generate=3, where="out/program.primal")
    first = replay_functional(program, replay_target, path, prompt=PROMPT, generate=3)
    np.testing.assert_array_equal(again.logits, first.logits)


@pytest.mark.parametrize("name", ["llama_dynamo", "gpt2_dynamo", "opt_lora_qv_r4_optimum"])
def test_a_partial_last_hub_shard_matches_onnxruntime(name, replay_target):
    """24-row crossbars cut the 32-element hidden vector into shards of 24 and 8 elements: the distributed
    RMSNorm and LayerNorm (statistics summed over unequal shards) still compute what ONNX Runtime does."""
    from primal_compiler.target import with_overrides

    target = with_overrides(replay_target, {"rram.rows": 24, "rram.cols": 24, "sram.rows": 24})
    program = compiled(name, target, len(PROMPT), 2)
    result = replay_functional(program, target, fixture(name), prompt=PROMPT, generate=2)
    assert relative_error(result.logits, ort_greedy(fixture(name), PROMPT, 2)) < TOL
