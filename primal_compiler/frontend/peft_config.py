"""A PEFT adapter's ``adapter_config.json``, read and checked: a plain LoRA's rank, alpha and targets, or a
one-line :class:`InputError` naming the file and the field.

Every field that would make the adapter compute more than ``h += scale * x @ A @ B`` on a projection
(:data:`NOT_PLAIN`: LoRA biases, saved modules, ...) is refused unless it holds a plain value, so such
an adapter is never replayed as plain LoRA; ``use_dora`` (DoRA: that sum rescaled per output column) is read. ``fan_in_fan_out`` is read (see :func:`_check_semantics`).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from primal_compiler.errors import InputError, one_line
from primal_compiler.inputs import TEXT_LIMIT_BYTES, read_text

_MODULE_NAME = re.compile(r"\^?[A-Za-z0-9_.]+")


def read_config(path: Path) -> dict[str, Any]:
    """The checked ``adapter_config.json`` at ``path``: ``r``, ``lora_alpha``, ``target_modules``, the rank and
    alpha patterns, ``use_rslora``, ``use_dora``; a config asking for more than plain LoRA is refused (:data:`NOT_PLAIN`)."""
    where = str(path)
    text = read_text(path, TEXT_LIMIT_BYTES, "adapter config")
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, an integer of over 4300 digits, deep nesting

        raise InputError(where, f"not readable JSON ({type(exc).__name__}: {one_line(exc, 200)})") from None
    if not isinstance(raw, dict):
        raise InputError(where, "not a JSON object")
    kind = raw.get("peft_type", "LORA")
    if str(kind).upper() != "LORA":
        raise InputError(where, f"peft_type is {kind}, not LORA")
    if "r" not in raw:
        raise InputError(where, "has no r (the LoRA rank)")
    r = raw["r"]
    alpha = raw["lora_alpha"] if "lora_alpha" in raw else r
    _check_rank(where, "r", r)
    _check_alpha(where, "lora_alpha", alpha)
    rank_pattern = raw.get("rank_pattern") or {}
    alpha_pattern = raw.get("alpha_pattern") or {}
    if not isinstance(rank_pattern, dict) or not isinstance(alpha_pattern, dict):
        raise InputError(where, "rank_pattern and alpha_pattern must be JSON objects")
    for name, patterns, check in (("rank_pattern", rank_pattern, _check_rank),
                                  ("alpha_pattern", alpha_pattern, _check_alpha)):
        for key, value in patterns.items():
            if not _MODULE_NAME.fullmatch(key):
                raise InputError(where, f"{name} key {key!r} is not a module name (regular expressions are "
                                        "not supported)")
            check(where, f"{name}[{key!r}]", value)
    rslora, dora = raw.get("use_rslora", False), raw.get("use_dora", False)
    for name, value in (("use_rslora", rslora), ("use_dora", dora)):
        if not isinstance(value, bool):
            raise InputError(where, f"{name} must be true or false, got {value!r}")
    _check_semantics(where, raw)
    return {
        "r": r,
        "lora_alpha": float(alpha),  # a positive finite number: checked above
        "target_modules": raw.get("target_modules"),
        "rank_pattern": rank_pattern,
        "rank_default": not rank_pattern,  # every module has rank r unless a pattern overrides it
        "alpha_pattern": {key: float(value) for key, value in alpha_pattern.items()},
        "use_rslora": rslora,
        "use_dora": dora,  # weight-decomposed LoRA: the adapter stores a magnitude per output column
    }


#: ``adapter_config.json`` fields that change what the adapter computes beyond ``h += scale * x @ A @ B`` on a
#: projection: the values that leave it plain LoRA (absent is plain too), and what any other value adds (PEFT's
#: ``LoraConfig``). An adapter setting one otherwise is refused naming the field, never replayed as plain LoRA.
NOT_PLAIN: dict[str, tuple[tuple[Any, ...], str]] = {
    "lora_bias": ((False,), "lora_B carries a bias vector"),
    "bias": (("none",), "the adapter trains and stores the base layers' biases"),
    "modules_to_save": ((None, []), "the adapter stores whole replacement modules"),
    "layer_replication": ((None, []), "the adapter duplicates base layers"),
    "trainable_token_indices": ((None, [], {}), "the adapter retrains rows of the embedding"),
    "target_parameters": ((None, []), "LoRA on raw parameters (such as expert weights), not on projections"),
    "use_qalora": ((False,), "QA-LoRA pools the adapter's input by quantization group"),
}


def _same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values, types included (``0`` is not ``false``, ``1.0`` is not ``true``)."""
    return type(a) is type(b) and a == b


def _check_semantics(where: str, raw: dict[str, Any]) -> None:
    """Refuse a config whose adapter is more than plain LoRA factors (:data:`NOT_PLAIN`).

    ``fan_in_fan_out`` is read, not refused: it only tells PEFT to transpose ``B @ A`` when merging it into
    a weight stored ``in x out`` (GPT-2's Conv1D); the factors are stored ``r x in`` and ``out x r`` either way
    and PEFT's unmerged forward, ``lora_B(lora_A(x)) * scaling``, does not read it.
    """
    for field, (plain, meaning) in NOT_PLAIN.items():
        if field in raw and not any(_same_json(raw[field], p) for p in plain):
            shown = " or ".join(json.dumps(p) for p in plain)
            raise InputError(where, f"{field} is {json.dumps(raw[field])[:60]}: {meaning}, which this compiler does "
                                    f"not model; only plain LoRA adapters are read ({field}: {shown})")
    if not isinstance(raw.get("fan_in_fan_out", False), bool):
        raise InputError(where, f"fan_in_fan_out must be true or false, got {raw['fan_in_fan_out']!r}")


def _check_rank(where: str, what: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(where, f"{what} must be a positive integer, got {value!r}")


def _check_alpha(where: str, what: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InputError(where, f"{what} must be a positive finite number, got {value!r}")
