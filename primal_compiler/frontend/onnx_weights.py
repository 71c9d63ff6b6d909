"""Weights of an ONNX file: the initializers behind the projections the frontend recognised, and DoRA's
column scales as the file computes them (``onnx_dora.column_scale``).

:func:`load_onnx_weights` reads the initializers behind the projections
that :func:`~primal_compiler.frontend.onnx_import.recognise_onnx` found
(never by initializer name), undoing a ``Transpose`` in front of the weight
and Gemm's ``transB``. External-data files are read when present; an absent
one is an :class:`InputError` (shape-only import still works), and so is a
weight, bias, embedding or norm holding a NaN or an infinity.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.frontend.onnx_dora import column_scale
from primal_compiler.frontend.onnx_graph import SHAPE_OPS, TRANSPARENT, PatternError
from primal_compiler.frontend.onnx_import import recognise_onnx
from primal_compiler.frontend.onnx_params import read_tables
from primal_compiler.frontend.onnx_tensors import decoded, finite, quantized, read_tensor
from primal_compiler.frontend.quant_codes import Decoded
from primal_compiler.frontend.weights import ModelWeights, ProjectionWeights, dims_text
from primal_compiler.ir.model import Role


def load_onnx_weights(path: str | Path, *, base: bool = True) -> ModelWeights:
    """W (and bias) of every recognised projection, and A, B of its unmerged LoRA.

    ``base=False`` skips base weights, biases and :class:`ModelTables` (only
    LoRA factors are read), which avoids decoding gigabytes when only the
    adapters matter.
    """
    where = str(path)
    found = recognise_onnx(path)
    g = found.graph
    out: dict[tuple[int, Role], ProjectionWeights] = {}
    for (layer, role), p in found.projections.items():
        node = g.nodes[p.node]
        label = f"layer {layer} {role.value}" if role != Role.LM_HEAD else "lm_head"
        w = bias = a = b = stored = None
        if base:
            lo, hi, full = p.split or (0, p.out_features, p.out_features)  # a fused gate/up: its column range
            w, stored = _matmul_weight(g, p.node, (p.in_features, full), label, where, (lo, hi))
            if p.bias:
                bias = _bias(g, p.node, full, label, where)
                bias = None if bias is None else bias[lo:hi]
        scale, dora = 1.0, None
        if p.lora is not None:
            rank, alpha = p.lora
            a = _matmul_weight(g, p.lora_nodes[0], (p.in_features, rank), f"{label} lora_A", where)[0]
            b = _matmul_weight(g, p.lora_nodes[1], (rank, p.out_features), f"{label} lora_B", where)[0]
            scale = alpha / rank
        if p.dora is not None:
            try:
                dora = column_scale(g, p.dora, p.out_features, label, where)
            except PatternError as exc:
                raise InputError(where, str(exc)) from None
        out[(layer, role)] = ProjectionWeights(w, bias, a, b, scale, node.name or f"node {p.node}", stored, dora)
    tables = read_tables(found, where) if base else None
    return ModelWeights(where, "onnx", out, found.model, tables, found.rope_unread)


def _tensor_behind(g, name: str) -> tuple[Any, bool]:
    """The constant tensor a weight input reads, through Identity/Cast/Transpose, and whether transposed."""
    transposed = False
    for _ in range(16):
        tensor = g.constant_tensor(name)
        if tensor is not None:
            return tensor, transposed
        node = g.node_of(name)
        if node is None:
            break
        if node.op_type == "Transpose":
            transposed = not transposed
        elif node.op_type not in ("Cast", "Identity", "CastLike"):
            break
        name = node.input[0]
    return None, transposed


def _matmul_weight(g, node_index: int, shape: tuple[int, int], label: str, where: str,
                   columns: tuple[int, int] | None = None) -> tuple[np.ndarray, Decoded | None]:
    """The ``in x out`` matrix a MatMul/Gemm multiplies by (as the projection finder sees it), its
    ``columns`` range only when given, and the file's own codes and scales of it when quantized."""
    node = g.nodes[node_index]
    tensor, transposed = _tensor_behind(g, node.input[1])
    if tensor is None:
        raise InputError(where, f"{label}: the weight of node {node.name or node_index} is not a constant")
    stored = decoded(g, tensor, label, where) if quantized(g, tensor) else None
    value = read_tensor(g, tensor, label, where) if stored is None else finite(stored.w, tensor, label, where)
    if value.ndim != 2:
        raise InputError(where, f"{label}: initializer {tensor.name!r} is not 2-D")
    if transposed != bool(node.op_type == "Gemm" and _attr(node, "transB")):
        value = value.T
        stored = None if stored is None else Decoded(stored.w.T, _t(stored.codes), stored.scale.T, stored.bits)
    if value.shape != shape:  # the frontend found these shapes from the same tensors
        raise InputError(where, f"{label}: weight is {dims_text(value.shape)}, expected {dims_text(shape)}")
    if columns is not None:
        lo, hi = columns
        value = value[:, lo:hi]
        if stored is not None:
            codes = None if stored.codes is None else stored.codes[:, lo:hi]
            stored = Decoded(stored.w[:, lo:hi], codes, stored.scale[:, lo:hi], stored.bits)
    return np.ascontiguousarray(value), stored


def _t(codes: np.ndarray | None) -> np.ndarray | None:
    return None if codes is None else codes.T


def _bias(g, node_index: int, out_features: int, label: str, where: str) -> np.ndarray | None:
    """The bias of a projection: Gemm C, or a constant Add right after the matmul."""
    node = g.nodes[node_index]
    name = None
    if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
        name = node.input[2]
    else:
        tensor = node.output[0]
        for _ in range(8):
            users = [i for i in g.consumers.get(tensor, ()) if g.nodes[i].op_type not in SHAPE_OPS]
            if len(users) != 1:
                break
            user = g.nodes[users[0]]
            if user.op_type in TRANSPARENT:
                tensor = user.output[0]
            elif user.op_type == "Add":
                other = user.input[1] if user.input[0] == tensor else user.input[0]
                name = other if g.vector_len(other) == out_features else None
                break
            else:
                break
    if name is None:
        return None
    tensor, _ = _tensor_behind(g, name)
    if tensor is None:
        return None
    value = read_tensor(g, tensor, f"{label} bias", where).reshape(-1)
    return value if value.size == out_features else None


def _attr(node, name: str, default: int = 0) -> int:
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    return default
