"""An adapter is plain LoRA or it is refused: the ``adapter_config.json`` fields and tensors that make an adapter
compute more than ``h += scale * x @ A @ B`` (LoRA biases, saved modules, ...) are refused naming the
field or tensor (``peft_config.NOT_PLAIN``; DoRA is read, ``test_dora.py``); ``fan_in_fan_out``, which changes only how PEFT merges, is read, and the
replay with it equals onnxruntime on the weights PEFT's merge gives (``W + transpose(B @ A) * scaling`` on
GPT-2's Conv1D weights, stored ``in x out``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from primal_compiler.cli import main
from primal_compiler.frontend import load_model
from primal_compiler.frontend.peft_config import NOT_PLAIN
from primal_compiler.ir.model import Role
from tests.frontend.test_weights import write_adapter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "onnx"
LLAMA = str(FIXTURES / "llama_dynamo.onnx")
GPT2 = FIXTURES / "gpt2_optimum.onnx"

#: A value PEFT writes for each field that makes the adapter more than plain LoRA.
SET = {"lora_bias": True, "bias": "lora_only", "modules_to_save": ["lm_head"],
       "layer_replication": [[0, 1]], "trainable_token_indices": [1, 2], "target_parameters": ["experts.w1"],
       "use_qalora": True}


def test_every_field_that_is_not_plain_lora_is_known():
    assert set(SET) == set(NOT_PLAIN)


@pytest.mark.parametrize("field", sorted(SET))
@pytest.mark.parametrize("value", ["set", "truthy"])
def test_a_config_asking_for_more_than_plain_lora_is_refused_naming_the_field(field, value, tmp_path, capsys):
    adapter = tmp_path / "ad"
    weird = {"lora_bias": "true", "bias": "all", "modules_to_save": {"x": 1},
             "layer_replication": 0.5, "trainable_token_indices": {"embed": [1]}, "target_parameters": "w",
             "use_qalora": float("nan")}
    write_adapter(adapter, load_model(LLAMA), config={field: SET[field] if value == "set" else weird[field]})
    assert main(["inspect", LLAMA, "--adapter", str(adapter)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"adapter_config.json: {field} is " in err and "does not model" in err, err


@pytest.mark.parametrize("plain", [{"use_dora": False, "lora_bias": False, "bias": "none", "modules_to_save": None,
                                    "layer_replication": None, "fan_in_fan_out": False},
                                   {"modules_to_save": [], "trainable_token_indices": None, "fan_in_fan_out": True}])
def test_plain_values_are_read(plain, tmp_path):
    adapter = tmp_path / "ad"
    write_adapter(adapter, load_model(LLAMA), config=plain)
    assert main(["inspect", LLAMA, "--adapter", str(adapter)]) == 0


@pytest.mark.parametrize("key", ["base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector.weight",
                                 "base_model.model.model.layers.0.self_attn.q_proj.lora_B.bias",
                                 "base_model.model.lm_head.weight"])
def test_a_tensor_that_is_not_a_lora_factor_is_refused_naming_it(key, tmp_path, capsys):
    adapter = tmp_path / "ad"
    write_adapter(adapter, load_model(LLAMA))
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    tensors[key] = np.ones(32, np.float32)
    save_file(tensors, str(adapter / "adapter_model.safetensors"))
    assert main(["inspect", LLAMA, "--adapter", str(adapter)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"holds {key}, which is not a LoRA factor" in err, err


def test_a_use_dora_that_is_not_a_boolean_is_refused(tmp_path, capsys):
    adapter = tmp_path / "ad"
    write_adapter(adapter, load_model(LLAMA), config={"use_dora": 1})
    assert main(["inspect", LLAMA, "--adapter", str(adapter)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "adapter_config.json: use_dora must be true or false, got 1" in err, err


def test_a_fan_in_fan_out_that_is_not_a_boolean_is_refused(tmp_path, capsys):
    adapter = tmp_path / "ad"
    write_adapter(adapter, load_model(LLAMA), config={"fan_in_fan_out": "none"})
    assert main(["inspect", LLAMA, "--adapter", str(adapter)]) == 2
    assert "fan_in_fan_out must be true or false" in capsys.readouterr().err


def test_fan_in_fan_out_replays_as_peft_merges_it_into_gpt2_conv1d(tmp_path):
    """GPT-2's c_fc is a Conv1D (weight ``in x out``); PEFT marks its LoRA ``fan_in_fan_out`` and merges it as
    ``W + transpose(B @ A) * scaling``, which in the IR's layout (``a`` = A.T, ``b`` = B.T) is ``W + a @ b * s``.
    The replay with the unmerged adapter must equal onnxruntime on a copy of the file with that merge."""
    pytest.importorskip("onnxruntime")
    from tests.frontend.merged import replay_and_merged

    factors = write_adapter(tmp_path / "ad", load_model(str(GPT2)), roles=(Role.FC1,), rank=4, alpha=8.0,
                            names={Role.FC1: "mlp.c_fc"}, prefix="base_model.model.transformer.h",
                            config={"fan_in_fan_out": True})
    assert json.loads((tmp_path / "ad" / "adapter_config.json").read_text())["fan_in_fan_out"] is True
    # PEFT's Conv1D merge: W (in x out) + transpose(B @ A) * (alpha / r), B @ A being (a @ b).T
    got, want, plain = replay_and_merged(GPT2, tmp_path / "ad", factors, lambda a, b: (b.T @ a.T).T * 2.0, tmp_path)
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5
    assert np.abs(plain - want).max() / np.abs(want).max() > 1e-3  # the adapter changes the logits
