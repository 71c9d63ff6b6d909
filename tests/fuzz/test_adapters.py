"""``--adapter DIR`` with a fuzzed ``adapter_config.json`` or extra tensors in ``adapter_model.safetensors``.

What is guaranteed, besides the streams and the scratch tree of :mod:`tests.fuzz.harness`, for
``inspect --adapter`` and ``compile --adapter``:

- a config that sets a field changing what the adapter computes (:data:`PLAIN`: ``lora_bias``, ``bias``,
  ``modules_to_save``, ``layer_replication``, ``trainable_token_indices``, ``target_parameters``,
  ``use_qalora``) to anything but its plain value is refused with exit 2, in one line naming the field; set
  to its plain value, it is read; ``use_dora: true`` is read only with a magnitude per adapted module, so
  on these magnitude-less adapters it is refused naming ``use_dora`` too (``tests/frontend/test_dora.py``
  reads a whole DoRA adapter);
- ``fan_in_fan_out`` is read, ``true`` or ``false`` (it only says how PEFT merges into a Conv1D weight
  stored in x out; the factors and the unmerged forward are the same), and refused naming the field
  when it is not a boolean;
- a weights file holding a tensor that is not ``*.lora_A.weight`` or ``*.lora_B.weight`` (a LoRA bias, a
  saved module, or a DoRA magnitude when the config does not set ``use_dora``) is refused.

How: :func:`adapter_config` sets, deletes and breaks the config's fields (JSON values compared by type
and value: ``0`` is not ``false``); :data:`EXPLICIT_PLAIN` and :data:`EXPLICIT_REFUSED` are each tried
once; :func:`foreign_tensors` adds one or two tensors of other names to a good adapter.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.fuzz.harness import (FUZZ, Result, check_streams, check_tree, copy_inputs, error_lines, invoke, scratch,
                                snapshot, violation)

BASE_CONFIG = {"peft_type": "LORA", "r": 8, "lora_alpha": 16.0, "target_modules": ["q_proj", "v_proj"],
               "bias": "none"}
#: Fields that change what the adapter computes, with the JSON values that leave it plain LoRA.
PLAIN: dict[str, tuple[str, ...]] = {
    "use_dora": ("false",), "lora_bias": ("false",), "bias": ('"none"',), "modules_to_save": ("null", "[]"),
    "layer_replication": ("null", "[]"), "trainable_token_indices": ("null", "[]", "{}"),
    "target_parameters": ("null", "[]"),
    "use_qalora": ("false",)}
#: Values the rules leave open ("null or empty" for a list field: an empty object or string, neither refused
#: nor required to be read).
UNSETTLED: dict[str, tuple[str, ...]] = {"modules_to_save": ("{}", '""')}
CONFIG_KEYS = tuple(BASE_CONFIG) + tuple(PLAIN) + (
    "fan_in_fan_out", "use_rslora", "rank_pattern", "alpha_pattern", "layers_to_transform", "layers_pattern",
    "init_lora_weights", "lora_dropout", "task_type", "base_model_name_or_path", "inference_mode", "exclude_modules",
    "revision", "auto_mapping", "")
NESTED = "[" * 100_000 + "]" * 100_000
CONFIG_VALUES = ("true", "false", "null", "0", "1", "4", "8", "-1", "2.5", "0.0", str(2**63), "1e308", "1e999", "NaN",
                 "Infinity", "9" * 5000, '"q_proj"', '["q_proj", "v_proj"]', '["q_proj"]', '["lm_head"]',
                 '["embed_tokens", "lm_head"]', "[]", "{}", '{"q_proj": 4}', '{"v_proj": 2.5}',
                 '{"model.layers.0.self_attn.q_proj": 4}', '{"embed_tokens": [1, 2]}', '["experts.gate_up_proj"]',
                 '"all"', '"lora_only"', '"none"', '".*proj"', '"LORA"', '"lora"', '"ADALORA"', '"true"', '"false"',
                 '""', '[[0, 1], [1, 2]]', NESTED, '{"a":' * 20_000 + "1" + "}" * 20_000, '"' + "x" * 10_000 + '"')


def _value(raw: str) -> tuple[str, object] | None:
    """The JSON value as (type, value), so that ``0`` is not ``false`` (None: not readable on its own)."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return type(value).__name__, value


def must_refuse(config: dict[str, str]) -> bool:
    """Whether the rules refuse ``config`` (field name -> JSON text) whatever its other fields hold."""
    not_plain = any(_value(config[k]) not in [_value(p) for p in plain + UNSETTLED.get(k, ())]
                    for k, plain in PLAIN.items() if k in config)
    fan = "fan_in_fan_out" in config and _value(config["fan_in_fan_out"]) not in (("bool", True), ("bool", False))
    return not_plain or fan


@st.composite
def adapter_config(draw) -> tuple[str, bool]:
    """(the config's text, whether it must be refused)."""
    config = {k: json.dumps(v) for k, v in BASE_CONFIG.items()}
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(("set", "set", "semantic", "semantic", "fan", "delete")))
        if how == "delete" and config:
            del config[draw(st.sampled_from(sorted(config)))]
        elif how == "semantic":
            key = draw(st.sampled_from(sorted(PLAIN)))
            config[key] = draw(st.sampled_from(PLAIN[key] + CONFIG_VALUES))
        elif how == "fan":
            config["fan_in_fan_out"] = draw(st.sampled_from(("true", "false") + CONFIG_VALUES))
        else:
            config[draw(st.sampled_from(CONFIG_KEYS))] = draw(st.sampled_from(CONFIG_VALUES))
    text = "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in config.items()) + "}"
    refuse = must_refuse(config)
    return draw(st.sampled_from((text, text, text, text + "\n", NESTED, "[" * 100_000, "\ufeff" + text))), refuse


def adapter_case(assets: Path, verb: str, config: str | None = None,
                 tensors: dict[str, tuple[int, ...]] | None = None) -> Result:
    """``verb --adapter DIR`` on the good adapter with its config replaced by ``config`` and ``tensors``
    (name -> shape) added to its weights."""
    with scratch() as root:
        copy_inputs(assets, root, ("ad",))
        if config is not None:
            (root / "in" / "ad" / "adapter_config.json").write_text(config)
        if tensors:
            import numpy as np
            from safetensors.numpy import load_file, save_file

            weights = root / "in" / "ad" / "adapter_model.safetensors"
            held = load_file(str(weights)) | {k: np.ones(shape, np.float32) for k, shape in tensors.items()}
            save_file(held, str(weights), metadata={"format": "pt"})
        argv = ["inspect", "tiny-llama", "--adapter", f"{root}/in/ad"] if verb == "inspect" else \
            ["compile", "tiny-llama", "-p", "fast", "--adapter", f"{root}/in/ad", "-o", f"{root}/out"]
        before = snapshot(root)
        r = invoke(argv, root)
        r.note = config if tensors is None else f"tensors added: {tensors}"
        check_streams(verb, r)
        check_tree(r, before, snapshot(root), ("out",))
        return r


def _config(**fields: str) -> str:
    """The good config with ``fields`` (name -> JSON text) set."""
    config = {k: json.dumps(v) for k, v in BASE_CONFIG.items()} | fields
    return "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in config.items()) + "}"


@settings(max_examples=40, **FUZZ)
@given(config=adapter_config(), verb=st.sampled_from(("inspect", "inspect", "inspect", "compile")))
@example(config=(_config(use_dora="true"), True), verb="inspect")
@example(config=(_config(fan_in_fan_out="true"), False), verb="compile")
@example(config=(_config(lora_bias="true"), True), verb="inspect")
@example(config=(_config(modules_to_save='["lm_head"]'), True), verb="inspect")
@example(config=('{"peft_type": "LORA", "r": 8, "target_modules": ' + NESTED + "}", False), verb="inspect")
def test_adapter_configs(assets, config, verb):
    text, refuse = config
    r = adapter_case(assets, verb, text)
    if refuse and r.code != 2:
        violation("not-plain-adapter-accepted", "a config asking for more than plain LoRA must be refused", r)


#: (field, JSON value) pairs that leave the adapter plain LoRA: read, exit 0.
EXPLICIT_PLAIN = [(k, v) for k, values in PLAIN.items() for v in values] + [("fan_in_fan_out", "true"),
                                                                           ("fan_in_fan_out", "false")]
#: (field, JSON value) pairs the rules refuse, the line naming the field. The last rows hold values a reader
#: might take for "unset" (null, 0): the rule takes only the plain values as plain (an empty list
#: is plain for a list field).
EXPLICIT_REFUSED = [
    ("use_dora", "true"), ("lora_bias", "true"), ("bias", '"all"'), ("bias", '"lora_only"'),
    ("modules_to_save", '["lm_head"]'), ("layer_replication", "[[0, 1], [1, 2]]"),
    ("trainable_token_indices", '{"embed_tokens": [1, 2]}'), ("trainable_token_indices", "[1, 2]"),
    ("target_parameters", '["experts.gate_up_proj"]'), ("use_qalora", "true"), ("fan_in_fan_out", '"true"'),
    ("fan_in_fan_out", "1"), ("fan_in_fan_out", "null"), ("use_dora", '"false"'),
    ("use_dora", "null"), ("use_dora", "0"), ("lora_bias", "null"), ("bias", "null"), ("bias", "false"),
    ("use_qalora", "0")]


@pytest.mark.parametrize("verb", ["inspect", "compile"])
@pytest.mark.parametrize("field, value", EXPLICIT_PLAIN, ids=[f"{k}={v}" for k, v in EXPLICIT_PLAIN])
def test_plain_fields_are_read(assets, field, value, verb):
    r = adapter_case(assets, verb, _config(**{field: value}))
    if r.code != 0:
        violation("plain-adapter-refused", f"{field}: {value} leaves the adapter plain LoRA and must be read", r)


@pytest.mark.parametrize("field, value", EXPLICIT_REFUSED, ids=[f"{k}={v}" for k, v in EXPLICIT_REFUSED])
def test_fields_beyond_plain_lora_are_refused(assets, field, value):
    r = adapter_case(assets, "inspect", _config(**{field: value}))
    if r.code != 2 or field not in error_lines("inspect", r)[0]:
        violation("not-plain-adapter-accepted", f"{field}: {value} must be refused in one line naming {field}", r)


PREFIX = "base_model.model.model.layers"
#: Tensor names that are not LoRA factors, each with its shape (tiny-llama's q_proj: 64 x 64, rank 8).
FOREIGN = {f"{PREFIX}.0.self_attn.q_proj.lora_magnitude_vector": (64,),
           f"{PREFIX}.1.self_attn.v_proj.lora_magnitude_vector.weight": (64,),
           f"{PREFIX}.0.self_attn.q_proj.lora_B.bias": (64,), f"{PREFIX}.0.self_attn.q_proj.lora_A.bias": (8,),
           f"{PREFIX}.0.self_attn.q_proj.base_layer.weight": (64, 64), "base_model.model.lm_head.weight": (8, 64),
           f"{PREFIX}.0.mlp.gate_proj.modules_to_save.default.weight": (8, 64),
           "base_model.model.model.embed_tokens.lora_embedding_A": (8, 16),
           f"{PREFIX}.0.self_attn.q_proj.lora_A": (8, 64), f"{PREFIX}.0.self_attn.q_proj.lora_A.weight.extra": (8, 64),
           "lora_A.weight": (8, 64)}


@st.composite
def foreign_tensors(draw) -> dict[str, tuple[int, ...]]:
    names = draw(st.lists(st.sampled_from(sorted(FOREIGN)), min_size=1, max_size=2, unique=True))
    return {name: FOREIGN[name] for name in names}


@settings(max_examples=10, **FUZZ)
@given(tensors=foreign_tensors(), verb=st.sampled_from(("inspect", "compile")))
@example(tensors={f"{PREFIX}.0.self_attn.q_proj.lora_magnitude_vector": (64,)}, verb="inspect")
@example(tensors={f"{PREFIX}.0.self_attn.q_proj.lora_B.bias": (64,)}, verb="compile")
def test_adapter_tensors(assets, tensors, verb):
    r = adapter_case(assets, verb, tensors=tensors)
    if r.code != 2:
        violation("foreign-tensor-accepted", "a tensor that is not a LoRA factor must be refused", r)
