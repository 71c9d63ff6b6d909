"""The numbers a compiled program computes with, checked against the program's model.

:func:`load_params` reads base weights, biases, embeddings and norms from
the model's ONNX file and the LoRA factors from that file or from a PEFT
adapter directory (which then replaces the file's own factors), through
:mod:`primal_compiler.frontend.weights` (the only place that decodes ONNX).
Everything is float32 in the ``y = x @ W`` convention; a quantized file's
projections also keep its integer codes and scales, which hardware mode
stores in the crossbars as they are when they fit (``precision``). The
columns of query, key and fused qkv projections are put in the order the
crossbars store them (``ir.columns``: q | k | v, rotation pairs adjacent),
adapters' B included. Every projection,
bias, LoRA factor, embedding table and norm the program's model has must be
present with the shape it expects, and nothing else may carry LoRA; any
mismatch is a one-line :class:`InputError` naming the file. The LoRA scale
(alpha / rank) is folded into B, as the adapter's CONFIG writes it; a DoRA
adapter's column scale is kept apart (``ACT DORA`` applies it at the roots). Several
adapter directories give adapter ids 0, 1, ... (a CONFIG names the one it loads);
one of a smaller rank, or without a role the program adapts, is padded with
zeros to the program's LoRA.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.frontend.onnx_weights import load_onnx_weights
from primal_compiler.frontend.peft import load_peft_adapter
from primal_compiler.frontend.weights import check_lora
from primal_compiler.ir.columns import head_order, stored_order
from primal_compiler.ir.model import Model, NormKind, Positional, Role


@dataclass(frozen=True, eq=False)
class Params:
    """Float32 parameters of one model, keyed like the model IR.

    ``w``/``bias`` are keyed ``(layer, role)``, the LM head under
    ``(num_layers, LM_HEAD)``; ``lora[k]`` is adapter k's ``(a, b)``, keyed
    the same way, ``b`` already carrying its LoRA scale (one adapter, the
    file's own or the one directory given, unless several are).
    ``norms`` is keyed ``(layer, 0)`` (before attention), ``(layer, 1)``
    (before the MLP), ``(layer, 2)`` and ``(layer, 3)`` (a sandwich's norms of
    the attention's and the MLP's outputs), ``(num_layers, 0)`` (final norm)
    and ``(-1, 0)`` (the embedding norm, when the model has one), ``(layer, 4)``
    and ``(layer, 5)`` (the q and k head norms, ``head_dim`` each): (scale, bias).
    """

    w: dict[tuple[int, Role], np.ndarray]
    bias: dict[tuple[int, Role], np.ndarray]
    lora: tuple[tuple[dict[tuple[int, Role], np.ndarray], dict[tuple[int, Role], np.ndarray]], ...]
    embed: np.ndarray
    pos_embed: np.ndarray | None
    norms: dict[tuple[int, int], tuple[np.ndarray, np.ndarray | None]]
    source: str
    # the file's own integer codes and scales of a quantized ``w`` (codes minus zero points, in x out),
    # keyed like ``w``; only where the zero points are integers
    stored: dict[tuple[int, Role], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    dora: dict[tuple[int, Role], np.ndarray] = field(default_factory=dict)  # DoRA's column scales, keyed like ``w``


def _dims(shape) -> str:
    return "x".join(str(int(d)) for d in shape)


def _expect(where: str, what: str, value: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
    if value is None:
        raise InputError(where, f"has no {what}, which the program needs ({_dims(shape)})")
    if value.shape != shape:
        raise InputError(where, f"{what} is {_dims(value.shape)}, the program expects {_dims(shape)}")
    return np.ascontiguousarray(value, dtype=np.float32)


def load_params(model: Model, weights_path: str | Path,
                adapter_dir: str | Path | Sequence[str | Path] | None = None) -> Params:
    """Parameters of ``model`` from ``weights_path`` (ONNX) and optionally PEFT adapter directories (adapter
    ids 0, 1, ... in order), each checked against the model's LoRA."""
    path = Path(weights_path)
    if path.suffix.lower() != ".onnx" or not path.is_file():
        problem = "no such file" if not path.exists() else "not an ONNX file (expected MODEL.onnx)"
        raise InputError(str(path), problem)
    onnx = load_onnx_weights(path)
    where, recognised, tables = onnx.source, onnx.model, onnx.tables
    if recognised is None or tables is None:  # never: load_onnx_weights recognises the file or refuses it
        raise InputError(where, "holds no recognised model")
    if recognised.num_layers != model.num_layers:
        have = recognised.num_layers
        raise InputError(where, f"has {have} decoder layers, the program's model has {model.num_layers}")
    if onnx.rope_unread is not None and model.positional == Positional.ROPE:
        raise InputError(where, f"node {onnx.rope_unread}: RoPE from cos/sin caches is not read, so the replay "
                                "cannot compute this file's rotation")
    dirs = [adapter_dir] if isinstance(adapter_dir, (str, Path)) else list(adapter_dir or ())
    sources = [load_peft_adapter(d) for d in dirs] or [onnx]
    for src in sources:
        if model.lora_targets or src.lora:
            check_lora(src, model, padded=len(sources) > 1)
    w: dict[tuple[int, Role], np.ndarray] = {}
    bias: dict[tuple[int, Role], np.ndarray] = {}
    stored: dict[tuple[int, Role], tuple[np.ndarray, np.ndarray]] = {}
    dora: dict[tuple[int, Role], np.ndarray] = {}
    lora: tuple[tuple[dict[tuple[int, Role], np.ndarray], dict[tuple[int, Role], np.ndarray]], ...] = tuple(
        ({}, {}) for _ in sources)
    L, h = model.num_layers, model.hidden_size
    for n, layer in enumerate(model.layers):
        for lin in layer.linears:
            key, label = (n, lin.role), f"layer {n} {lin.role.value}"
            got = onnx.get(n, lin.role)
            if got is None:
                raise InputError(where, f"has no {label} projection, which the program's model has")
            w[key] = _expect(where, f"{label} weight", got.w, (lin.in_features, lin.out_features))
            _keep_codes(stored, key, got)
            if lin.bias:
                bias[key] = _expect(where, f"{label} bias", got.bias, (lin.out_features,))
            elif got.bias is not None:
                raise InputError(where, f"{label} has a bias, the program's model has none")
            if lin.lora is not None:
                for src, (a, b) in zip(sources, lora):
                    a[key], b[key] = _padded(src.get(n, lin.role), lin)
                _dora_scale(dora, key, label, lin, sources, w[key])
    head = onnx.get(L, Role.LM_HEAD)
    if head is None:
        raise InputError(where, "has no LM head projection, which the program's model has")
    w[(L, Role.LM_HEAD)] = _expect(where, "LM head weight", head.w, (h, model.vocab_size))
    _keep_codes(stored, (L, Role.LM_HEAD), head)
    if model.lm_head_bias:
        bias[(L, Role.LM_HEAD)] = _expect(where, "LM head bias", head.bias, (model.vocab_size,))
    embed = _expect(where, "token embedding", tables.embed, (model.vocab_size, h))
    pos = None
    if model.positional == Positional.LEARNED:
        pos = _expect(where, "position embedding", tables.pos_embed, (model.num_pos_embeddings, h))
    _in_stored_order(model, w, bias, stored, lora, dora)
    return Params(w, bias, lora, embed, pos, _norms(model, tables.norms, where), where, stored, dora)


def _in_stored_order(model: Model, w: dict, bias: dict, stored: dict, lora: tuple, dora: dict) -> None:
    """Put the columns of every projection ``ir.columns.stored_order`` reorders in that order: its weight,
    bias, stored codes and scales, DoRA column scale, and every adapter's B."""
    for n in range(model.num_layers):
        for role in (Role.Q, Role.K, Role.QKV):
            order, key = stored_order(model, n, role), (n, role)
            if order is None:
                continue
            w[key] = np.ascontiguousarray(w[key][:, order])
            if key in bias:
                bias[key] = np.ascontiguousarray(bias[key][order])
            if key in dora:
                dora[key] = np.ascontiguousarray(dora[key][order])
            if key in stored:
                stored[key] = tuple(np.ascontiguousarray(x[:, order]) for x in stored[key])
            for _, b in lora:
                if key in b:
                    b[key] = np.ascontiguousarray(b[key][:, order])


def _dora_scale(dora: dict, key: tuple[int, Role], label: str, lin, sources: list, w: np.ndarray) -> None:
    """The column scale of ``lin``'s DoRA adapter into ``dora``: the ONNX file's own, or a PEFT adapter's
    magnitude over the column norms of ``w + scale A B`` (as PEFT computes it, the norm over the input axis); an
    InputError where the program's model and the adapters disagree on DoRA, or where several adapters would
    share a program with one."""
    got = [src.get(*key) for src in sources]
    has = [p is not None and (p.dora is not None or p.magnitude is not None) for p in got]
    if any(has) != lin.lora.dora or (lin.lora.dora and not all(has)):
        src = sources[has.index(not lin.lora.dora)]
        what = "has a DoRA column scale" if not lin.lora.dora else "has no DoRA column scale (magnitude vector)"
        raise InputError(src.source, f"{label} {what}, but the program's model {'does' if lin.lora.dora else 'has none'}")
    if lin.lora.dora and len(sources) > 1:
        raise InputError(sources[0].source, "DoRA adapters are replayed one at a time: several adapter directories "
                                            "cannot share a program with DoRA")
    if lin.lora.dora:
        p = got[0]
        scale = p.dora if p.dora is not None else p.magnitude / np.linalg.norm(w + np.float32(p.scale) * (p.a @ p.b),
                                                                              axis=0)
        dora[key] = _expect(sources[0].source, f"{label} DoRA column scale", scale, (lin.out_features,))
        if not np.isfinite(dora[key]).all():
            raise InputError(sources[0].source, f"{label} DoRA column scale is not finite (a column of W + s A B "
                                                "has a zero norm)")


def _padded(p, lin) -> tuple[np.ndarray, np.ndarray]:
    """An adapter's A and scaled B for ``lin``, padded with zeros to the program's rank (zeros where the
    adapter does not adapt ``lin``): the update ``x A B`` is the adapter's own."""
    rank = lin.lora.rank
    a = np.zeros((lin.in_features, rank), np.float32)
    b = np.zeros((rank, lin.out_features), np.float32)
    if p is not None and p.a is not None:
        r = p.a.shape[1]
        a[:, :r] = p.a
        b[:r] = p.b * np.float32(p.scale)
    return a, b


def _keep_codes(stored: dict, key: tuple[int, Role], got) -> None:
    if got.stored is not None and got.stored.codes is not None:
        stored[key] = (got.stored.codes, got.stored.scale)


def _norms(model: Model, found: dict, where: str) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray | None]]:
    keys = [(n, k) for n, layer in enumerate(model.layers) for k in range(layer.num_norms)] + [(model.num_layers, 0)]
    keys += [(-1, 0)] if model.embed_norm else []
    keys += [(n, k) for n, layer in enumerate(model.layers) if layer.qk_norm for k in (4, 5)]
    out = {}
    for key in keys:
        label = {model.num_layers: "final norm", -1: "embedding norm"}.get(key[0], f"layer {key[0]} norm {key[1]}")
        scale, bias = found.get(key, (None, None))
        h = model.hidden_size if key[1] < 4 else model.attention.head_dim  # 4, 5: the q and k head norms
        kind = model.norm if key[0] in (-1, model.num_layers) else model.layers[key[0]].norm
        layer_norm = key[1] < 4 and kind == NormKind.LAYER  # (a head norm is an RMSNorm)
        if layer_norm and not model.norm_bias:  # a LayerNorm without a bias (MPT) adds zeros
            if bias is not None:
                raise InputError(where, f"{label} has a bias, the program's model has none")
            bias = np.zeros(h, np.float32)
        scale = _expect(where, f"{label} scale", scale, (h,))
        out[key] = (scale if key[1] < 4 else scale[head_order(model)],  # a head norm's weight in stored order
                    _expect(where, f"{label} bias", bias, (h,)) if layer_norm else None)
    return out
