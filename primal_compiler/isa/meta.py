"""The metadata of a compiled program file, and the check of its keys (``isa/schema.py`` checks the rest).

:func:`meta_issue` checks the meta keys' types and ranges (``STRINGS``,
``seed``, ``package_cols``, ``KV_KEYS`` and ``kv.rings``, a strictly typed
``model_ir`` agreeing with ``num_layers`` and ``kv``); :func:`kv_units`
gives the KV units of each layer that ``kv`` describes, which the arrays
``kv_ct``, ``kv_pe`` and ``kv_slot`` list layer by layer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any, NamedTuple

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.ir.model_json import model_from_dict

COMPILED = "primal-program"  # meta ``format`` of a program written by primal compile
INT_MAX = 2**31 - 1  # every count in the model IR and the KV layout fits an int32
STRINGS = ("package_version", "model", "target", "target_hash", "pipeline")
KV_INTERLEAVES = ("token", "word")
"""How a KV chunk's tokens sit in a scratchpad's banks (``codegen/kvmap.py``): whole token vectors round the
banks (the seed's interleave), or the chunk contiguous with its bank words round the banks."""
KV_KEYS = ("context", "batch", "chunk_tokens", "kv_heads", "head_dim", "kv_bytes", "banks", "chunk_slots")
"""The KV map's keys; ``rings`` (tokens of each layer's ring) is there only where a layer's is not the context."""


class Issue(NamedTuple):
    """Why a program is not a compiled program: ``kind`` is meta/array/section/end, ``key`` the name."""

    kind: str
    key: str
    message: str


def kv_rings(kv: Mapping[str, Any], num_layers: int) -> list[int]:
    """Tokens of each layer's ring: ``kv.rings``, written only where one differs from the context, else the
    context for every layer."""
    return list(kv.get("rings", [kv["context"]] * num_layers))


def kv_units(kv: Mapping[str, Any], num_layers: int) -> np.ndarray:
    """int64 KV units of each layer: its ring's chunks (:func:`kv_rings`) x batch x KV heads x 2."""
    return np.asarray(kv_rings(kv, num_layers), np.int64) // kv["chunk_tokens"] * kv["batch"] * kv["kv_heads"] * 2


def _int(value: object, low: int, high: int = INT_MAX) -> bool:
    return type(value) is int and low <= value <= high


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def meta_issue(meta: Mapping[str, Any]) -> Issue | None:
    def bad(key: str, problem: str) -> Issue:
        return Issue("meta", key, f"meta {key}: {problem}")

    if meta.get("format") != COMPILED:
        return bad("format", f"{_show(meta.get('format'))}, not {COMPILED!r}: run, viz and the functional replay "
                             "need a program written by primal compile")
    for key in STRINGS:
        if type(meta.get(key)) is not str:
            return bad(key, f"expected a string, got {_show(meta.get(key))}")
    if "seed" not in meta or not (meta["seed"] is None or type(meta["seed"]) is int):
        return bad("seed", f"expected an integer or null, got {_show(meta.get('seed'))}")
    if not _int(meta.get("package_cols"), 1, meta["num_cts"]):
        return bad("package_cols", f"expected an integer in 1..num_cts {meta['num_cts']}, got "
                                   f"{_show(meta.get('package_cols'))}")
    kv = meta.get("kv")
    if not isinstance(kv, dict) or sorted(set(kv) - {"rings"}) != sorted(KV_KEYS + ("interleave",)):
        return bad("kv", f"expected an object with exactly {', '.join(KV_KEYS)}, interleave (and rings), got "
                         f"{_show(kv)}")
    if kv["interleave"] not in KV_INTERLEAVES:
        return bad("kv.interleave", f"expected one of {', '.join(KV_INTERLEAVES)}, got {_show(kv['interleave'])}")
    for key in KV_KEYS:
        if not _int(kv[key], 1):
            return bad(f"kv.{key}", f"expected an integer in 1..{INT_MAX}, got {_show(kv[key])}")
    if kv["context"] % kv["chunk_tokens"]:
        return bad("kv.context", f"{kv['context']} is not a multiple of kv.chunk_tokens {kv['chunk_tokens']}")
    rings, chunk = kv.get("rings", []), kv["chunk_tokens"]
    if "rings" in kv and (type(rings) is not list or len(rings) != meta["num_layers"]
                          or any(not _int(r, chunk, kv["context"]) or r % chunk for r in rings)):
        return bad("kv.rings", f"expected one ring per layer ({meta['num_layers']}), each a multiple of "
                               f"kv.chunk_tokens {chunk} up to kv.context {kv['context']}, got {_show(rings)}")
    d = meta.get("model_ir")
    if not isinstance(d, dict):
        return bad("model_ir", f"expected a JSON object, got {_show(d)}")
    try:
        model = model_from_dict(d)
    except InputError as exc:  # a size over the IR's limits
        return bad("model_ir", exc.problem)
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        return bad("model_ir", f"not a model description ({type(exc).__name__}: {exc})")
    problem = _typed(model, "model_ir")
    if problem is not None:
        return Issue("meta", "model_ir", f"meta {problem}")
    if model.num_layers != meta["num_layers"]:
        return bad("num_layers", f"{meta['num_layers']}, but model_ir has {model.num_layers} layers")
    for i, (layer, ring) in enumerate(zip(model.layers, kv_rings(kv, model.num_layers), strict=True)):
        if layer.index != i:
            return bad(f"model_ir.layers[{i}].index", f"{layer.index}, expected {i}")
        if ring < kv["context"] and not layer.window:  # only a sliding layer keeps less than the context
            return bad(f"kv.rings[{i}]", f"{ring} tokens, shorter than kv.context {kv['context']}, but layer {i} "
                                         "has no sliding window")
        if ring < kv["context"] and ring < layer.window:
            return bad(f"kv.rings[{i}]", f"{ring} tokens, shorter than layer {i}'s sliding window of {layer.window}")
    attn = model.layers[0].attention
    for key, want in (("kv_heads", attn.num_kv_heads), ("head_dim", attn.head_dim),
                      ("kv_bytes", model.precision.kv_bits // 8)):
        if kv[key] != want:
            return bad(f"kv.{key}", f"{kv[key]}, but the model's layer 0 needs {want}")
    return None


def _typed(obj: Any, path: str) -> str | None:
    """Where a model dataclass holds a value of the wrong JSON type or out of range (ints 0..INT_MAX, finite floats)."""
    for f in fields(obj):
        value, where = getattr(obj, f.name), f"{path}.{f.name}"
        kind = f.type if isinstance(f.type, str) else f.type.__name__  # a string: the models' annotations are postponed
        ok = {"int": lambda v: _int(v, 0), "bool": lambda v: type(v) is bool, "str": lambda v: type(v) is str,
              "float": lambda v: type(v) in (int, float) and math.isfinite(v)}.get(kind)
        if ok is not None and not ok(value):
            return f"{where}: expected {'an int in 0..' + str(INT_MAX) if kind == 'int' else 'a ' + kind}, " \
                   f"got {_show(value)}"
        for k, item in enumerate(value if isinstance(value, tuple) else (value,)):
            if is_dataclass(item):
                problem = _typed(item, f"{where}[{k}]" if isinstance(value, tuple) else where)
                if problem is not None:
                    return problem
    return None
