"""Bad input to the functional replay: one-line errors naming the file or option and the problem."""

from __future__ import annotations

import json
import re

import pytest

from primal_compiler.api import compile_model
from primal_compiler.errors import InputError
from primal_compiler.frontend import load_model
from primal_compiler.functional import replay_functional
from tests.functional.conftest import compiled, fixture
from tests.functional.test_exact import write_peft_adapter

PROMPT = [3, 1, 4, 1, 5]
LLAMA_QKVO = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj"}
LLAMA_MLP = {"gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
PREFIX = "base_model.model.model.layers"


@pytest.fixture(scope="module")
def llama(replay_target):
    return compiled("llama_dynamo", replay_target, len(PROMPT), 3)


@pytest.fixture(scope="module")
def llama_qkvo(replay_target):
    return compiled("llama_dynamo", replay_target, len(PROMPT), 3, lora="q,k,v,o:8")


def run(program, target, weights=None, adapter=None, **kw):
    kw.setdefault("prompt", PROMPT)
    kw.setdefault("generate", 3)
    return replay_functional(program, target, weights or fixture("llama_dynamo"), adapter, **kw)


@pytest.mark.parametrize("kwargs,message", [
    ({"prompt": [3, 1, 4]}, "prefill:0 prefills 5 tokens but the prompt has 3; compile for the prompt"),
    ({"generate": 5}, "program llama_dynamo: decode:0 has 2 decode steps; generating 5 tokens needs 4 "
                      "(codegen{steps=4})"),
    ({"generate": 0}, "generate: must be >= 1, got 0"),
    ({"precision": "int4"}, "precision: must be one of exact, hardware, got 'int4'"),
    ({"prompt": [3, 1, 4, 1, 96]}, r"prompt: needs one or more token ids in 0..95"),
    ({"force": [1, -2]}, r"force: token ids must be in 0..95"),
])
def test_bad_run_options(llama, replay_target, kwargs, message):
    with pytest.raises(InputError, match=re.escape(message) if "(" in message else message):
        run(llama, replay_target, **kwargs)


def test_weights_of_another_model(llama, replay_target):
    with pytest.raises(InputError, match=r"mistral_dynamo.onnx: layer 0 q weight is 48x48, the program expects 32x32"):
        run(llama, replay_target, weights=fixture("mistral_dynamo"))


def test_weights_file_that_is_missing_or_not_onnx(llama, replay_target, tmp_path):
    with pytest.raises(InputError, match=r"nope.onnx: no such file"):
        run(llama, replay_target, weights=str(tmp_path / "nope.onnx"))
    (tmp_path / "model.bin").write_bytes(b"x")
    with pytest.raises(InputError, match=r"model.bin: not an ONNX file"):
        run(llama, replay_target, weights=str(tmp_path / "model.bin"))


def test_missing_adapter_file(llama_qkvo, replay_target, tmp_path):
    adapter = tmp_path / "adapter"
    write_peft_adapter(adapter, "llama_lora_qkvo_r8_dynamo", LLAMA_QKVO, PREFIX)
    (adapter / "adapter_model.safetensors").unlink()
    with pytest.raises(InputError, match=r"adapter_model.safetensors: missing: a PEFT adapter directory needs"):
        run(llama_qkvo, replay_target, adapter=adapter)


def test_adapter_for_other_target_modules(llama_qkvo, replay_target, tmp_path):
    adapter = tmp_path / "adapter"
    write_peft_adapter(adapter, "llama_lora_mlp_r4_optimum_past", LLAMA_MLP, PREFIX)
    with pytest.raises(InputError, match=r"adapter targets down_proj, gate_proj, up_proj, model has LoRA on q,k,v,o"):
        run(llama_qkvo, replay_target, adapter=adapter)


def test_adapter_without_lora_in_the_program(llama, replay_target, tmp_path):
    adapter = tmp_path / "adapter"
    write_peft_adapter(adapter, "llama_lora_qkvo_r8_dynamo", LLAMA_QKVO, PREFIX)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["r"] == 8
    with pytest.raises(InputError, match=r"model has no LoRA \(see --lora\)"):
        run(llama, replay_target, adapter=adapter)


def test_positions_beyond_a_learned_table(replay_target):
    program = compiled("gpt2_dynamo", replay_target, len(PROMPT), 3)
    with pytest.raises(InputError, match=r"generate: the last step sits at position 40; model gpt2_dynamo has 40"):
        run(program, replay_target, weights=fixture("gpt2_dynamo"), generate=37)


def test_programs_the_replay_cannot_run(replay_target, llama):
    model = load_model(fixture("llama_dynamo"))
    batched = compile_model(model, replay_target, "lower-tiles,blocking,zcurve-order,"
                            "kv-ring{context=32,chunk_tokens=4,batch=2,reserve_bytes=0},codegen{prompt=5}")
    with pytest.raises(InputError, match=r"program llama_dynamo: was compiled for batch 2 with prefill:0 carrying "
                                         r"several sequences in one pass; the functional replay runs a batch whose"):
        run(batched, replay_target)
    with pytest.raises(InputError, match=r"program llama_dynamo: has no instruction stream"):
        run(llama.evolve(stream=None), replay_target)
    from primal_compiler.target import with_overrides

    tall = with_overrides(replay_target, {"sram.rows": 32})
    with pytest.raises(InputError, match=r"needs rram.rows == rram.cols == sram.rows"):
        run(llama, tall)
