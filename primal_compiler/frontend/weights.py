"""Numeric weights of a model: from an ONNX file or a PEFT LoRA adapter directory.

Everything is returned in the IR's ``y = x @ W`` convention, as float32:
W is ``in x out``, a LoRA adapter is A (``in x r``) and B (``r x out``) with
``delta W = scale * A @ B``, a bias has ``out`` elements. Keys are
``(layer, role)`` as in the :class:`~primal_compiler.ir.model.Model`.

* :func:`load_onnx_weights` reads the initializers behind the projections
  that :func:`~primal_compiler.frontend.onnx_import.recognise_onnx` found
  (never by initializer name), undoing a ``Transpose`` in front of the
  weight and Gemm's ``transB``. External-data files are read when present;
  an absent one is an :class:`InputError` (shape-only import still works),
  and so is a weight, bias, embedding or norm holding a NaN or an infinity.
* :func:`load_peft_adapter` reads a PEFT adapter directory
  (``adapter_config.json`` + ``adapter_model.safetensors``; see ``peft``).
* :func:`check_lora` compares loaded LoRA factors with a model: the same
  roles, the same layers, the shapes the model expects.

Every problem is a one-line :class:`InputError` naming the file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from primal_compiler.errors import InputError, one_line
from primal_compiler.frontend.lora_spec import LAYER_ROLES
from primal_compiler.frontend.quant_codes import Decoded, decode
from primal_compiler.ir.model import Model, Role


@dataclass(frozen=True, eq=False)
class ProjectionWeights:
    """Weights of one projection; a field is None when absent or not loaded."""

    w: np.ndarray | None = None  # in x out
    bias: np.ndarray | None = None  # out
    a: np.ndarray | None = None  # LoRA A, in x r
    b: np.ndarray | None = None  # LoRA B, r x out
    scale: float = 1.0  # LoRA alpha / rank (alpha / sqrt(rank) with rsLoRA)
    module: str = ""  # where it came from: PEFT module name or ONNX node name
    stored: Decoded | None = None  # the file's own quantization of ``w`` (in x out codes and scales), if any

    @property
    def rank(self) -> int | None:
        return None if self.a is None else int(self.a.shape[1])


@dataclass(frozen=True, eq=False)
class ModelTables:
    """The parameters outside projections: embeddings and norms (float32)."""

    embed: np.ndarray  # vocab x hidden
    pos_embed: np.ndarray | None  # rows x hidden (learned positions), else None
    norms: dict[tuple[int, int], tuple[np.ndarray | None, np.ndarray | None]]  # (layer, 0|1) / (L, 0): scale, bias


@dataclass(frozen=True, eq=False)
class ModelWeights:
    """Weights per ``(layer, role)``; ``kind`` is ``onnx`` or ``adapter``."""

    source: str  # the file read (ONNX file or adapter_model.safetensors)
    kind: str
    projections: dict[tuple[int, Role], ProjectionWeights] = field(default_factory=dict)
    model: Model | None = None  # the model recognised in an ONNX file
    tables: ModelTables | None = None  # embeddings and norms of an ONNX file read with ``base=True``
    rope_unread: str | None = None  # a node whose RoPE frequencies are not read (cos/sin caches of RotaryEmbedding)

    def get(self, layer: int, role: Role) -> ProjectionWeights | None:
        return self.projections.get((layer, role))

    @property
    def lora(self) -> dict[tuple[int, Role], ProjectionWeights]:
        """The projections carrying LoRA factors, in key order."""
        keys = sorted((k for k, p in self.projections.items() if p.a is not None), key=lambda k: (k[0], k[1].value))
        return {k: self.projections[k] for k in keys}

    @property
    def lora_roles(self) -> tuple[Role, ...]:
        return tuple(sorted({role for _, role in self.lora}, key=LAYER_ROLES.index))


# --------------------------------------------------------------------------- ONNX


def load_onnx_weights(path: str | Path, *, base: bool = True) -> ModelWeights:
    """W (and bias) of every recognised projection, and A, B of its unmerged LoRA.

    ``base=False`` skips base weights, biases and :class:`ModelTables` (only
    LoRA factors are read), which avoids decoding gigabytes when only the
    adapters matter.
    """
    from primal_compiler.frontend.onnx_import import recognise_onnx
    from primal_compiler.frontend.onnx_params import read_tables

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
        scale = 1.0
        if p.lora is not None:
            rank, alpha = p.lora
            a = _matmul_weight(g, p.lora_nodes[0], (p.in_features, rank), f"{label} lora_A", where)[0]
            b = _matmul_weight(g, p.lora_nodes[1], (rank, p.out_features), f"{label} lora_B", where)[0]
            scale = alpha / rank
        out[(layer, role)] = ProjectionWeights(w, bias, a, b, scale, node.name or f"node {p.node}", stored)
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


def _read(g, tensor, label: str, where: str) -> np.ndarray:
    """An initializer as float32 (a quantized one dequantized); absent external data and values that are not
    finite are InputErrors."""
    value = _decoded(g, tensor, label, where).w if _quantized(g, tensor) else _raw(g, tensor, label, where)
    return _finite(value.astype(np.float32), tensor, label, where)


def _finite(value: np.ndarray, tensor, label: str, where: str) -> np.ndarray:
    if not np.isfinite(value).all():
        raise InputError(where, f"{label}: initializer {tensor.name!r} holds NaN or infinite values")
    return value


def _quantized(g, tensor) -> bool:
    return g.quant is not None and tensor.name in g.quant.weights


def _decoded(g, tensor, label: str, where: str) -> Decoded:
    """A quantized constant's codes, scales and float values, from the tensors the file stores."""
    from primal_compiler.frontend.onnx_graph import PatternError

    try:
        return decode(g.quant.weights[tensor.name], lambda name: _raw(g, g.inits[name], label, where))
    except PatternError as exc:
        raise InputError(where, f"{label}: {exc}") from None


def _raw(g, tensor, label: str, where: str) -> np.ndarray:
    """An initializer's values as stored; absent external data is an InputError."""
    from onnx import TensorProto, numpy_helper

    if tensor.data_location == TensorProto.EXTERNAL:
        if g.external_file(tensor) is None:
            location = next(e.value for e in tensor.external_data if e.key == "location")
            raise InputError(
                where, f"{label}: initializer {tensor.name!r} is in external data file {location!r}, which is absent"
            )
        tensor = _sized(tensor, label, where)
    try:
        return numpy_helper.to_array(tensor, base_dir=str(g.base_dir))
    except Exception as exc:  # noqa: BLE001 - onnx raises many types for unreadable data
        detail = f"{type(exc).__name__}: {one_line(exc, 200)}"
        raise InputError(where, f"{label}: cannot read initializer {tensor.name!r} ({detail})") from None


def _sized(tensor, label: str, where: str):
    """An external float tensor with the ``length`` its shape needs, so no read goes past its bytes."""
    from onnx import TensorProto

    from primal_compiler.frontend.onnx_graph import ITEMSIZE

    size = ITEMSIZE.get(tensor.data_type)
    if size is None:
        return tensor  # onnx reads at most the rest of a file already checked to be regular and bounded
    need = math.prod(tensor.dims) * size
    info = {e.key: e.value for e in tensor.external_data}
    if "length" in info:
        if int(info["length"]) != need:
            raise InputError(where, f"{label}: initializer {tensor.name!r} has {int(info['length']):,} bytes of "
                                    f"external data, its shape needs {need:,}")
        return tensor
    sized = TensorProto()
    sized.CopyFrom(tensor)
    sized.external_data.add(key="length", value=str(need))
    return sized


def _matmul_weight(g, node_index: int, shape: tuple[int, int], label: str, where: str,
                   columns: tuple[int, int] | None = None) -> tuple[np.ndarray, Decoded | None]:
    """The ``in x out`` matrix a MatMul/Gemm multiplies by (as the projection finder sees it), its
    ``columns`` range only when given, and the file's own codes and scales of it when quantized."""
    node = g.nodes[node_index]
    tensor, transposed = _tensor_behind(g, node.input[1])
    if tensor is None:
        raise InputError(where, f"{label}: the weight of node {node.name or node_index} is not a constant")
    stored = _decoded(g, tensor, label, where) if _quantized(g, tensor) else None
    value = _read(g, tensor, label, where) if stored is None else _finite(stored.w, tensor, label, where)
    if value.ndim != 2:
        raise InputError(where, f"{label}: initializer {tensor.name!r} is not 2-D")
    if transposed != bool(node.op_type == "Gemm" and _attr(node, "transB")):
        value = value.T
        stored = None if stored is None else Decoded(stored.w.T, _t(stored.codes), stored.scale.T, stored.bits)
    if value.shape != shape:  # the frontend found these shapes from the same tensors
        raise InputError(where, f"{label}: weight is {_dims(value.shape)}, expected {_dims(shape)}")
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
    from primal_compiler.frontend.onnx_graph import SHAPE_OPS, TRANSPARENT

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
    value = _read(g, tensor, f"{label} bias", where).reshape(-1)
    return value if value.size == out_features else None


def _attr(node, name: str, default: int = 0) -> int:
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    return default


def _dims(shape) -> str:
    return "x".join(str(int(d)) for d in shape)


# --------------------------------------------------------------------------- PEFT adapters


def load_peft_adapter(path: str | Path) -> ModelWeights:
    """LoRA A (``in x r``) and B (``r x out``) per ``(layer, role)`` from a PEFT adapter directory (``peft``)."""
    from primal_compiler.frontend.peft import load_peft_adapter as load

    return load(path)


# --------------------------------------------------------------------------- checks


def check_lora(weights: ModelWeights, model: Model, padded: bool = False) -> None:
    """Raise :class:`InputError` unless ``weights`` has exactly the model's LoRA factors, shaped as it expects;
    ``padded`` (one of several adapters) also accepts a subset of the roles and ranks up to the model's."""
    where = weights.source
    if weights.model is not None and weights.model.num_layers != model.num_layers:
        have = weights.model.num_layers
        raise InputError(where, f"has {have} decoder layers, model {model.name} has {model.num_layers}")
    lora = weights.lora
    expected = {
        (n, lin.role): lin for n, layer in enumerate(model.layers) for lin in layer.linears if lin.lora is not None
    }
    have_roles = set(weights.lora_roles)
    want_roles = set(model.lora_targets)
    if have_roles != want_roles and not (padded and have_roles <= want_roles):
        if weights.kind == "adapter":
            names = sorted({p.module.rsplit(".", 1)[-1] for p in lora.values()})
            what = f"adapter targets {', '.join(names)}"
        else:
            what = f"file has LoRA on {_roles(have_roles) or 'nothing'}"
        model_has = f"model has LoRA on {_roles(want_roles)}" if want_roles else "model has no LoRA (see --lora)"
        raise InputError(where, f"{what}, {model_has}")
    for layer, role in lora:
        if (layer, role) not in expected:
            if layer >= model.num_layers:
                layers = f"model {model.name} has {model.num_layers} layers"
                raise InputError(where, f"has LoRA on layer {layer} {role.value}, {layers}")
            raise InputError(where, f"has LoRA on layer {layer} {role.value}, the model has none there")
    for (layer, role), lin in expected.items():
        got = lora.get((layer, role))
        if got is None and padded and role not in have_roles:
            continue  # stored as zeros
        if got is None:
            raise InputError(where, f"has no LoRA weights for layer {layer} {role.value}, which has LoRA in the model")
        rank = got.a.shape[1] if padded and got.a.ndim == 2 and 0 < got.a.shape[1] <= lin.lora.rank else lin.lora.rank
        for part, value, shape in (
            ("lora_A", got.a, (lin.in_features, rank)),
            ("lora_B", got.b, (rank, lin.out_features)),
        ):
            if value.shape != shape:
                what = f"layer {layer} {role.value} {part}"
                raise InputError(where, f"{what} is {_dims(value.shape)}, model expects {_dims(shape)}")
    for (layer, role), p in weights.projections.items():
        if p.w is None or layer >= model.num_layers:
            continue
        lin = model.layers[layer].linear(role)
        if lin is not None and p.w.shape != (lin.in_features, lin.out_features):
            shape = (lin.in_features, lin.out_features)
            what = f"layer {layer} {role.value} weight"
            raise InputError(where, f"{what} is {_dims(p.w.shape)}, model expects {_dims(shape)}")


def _roles(roles: set[Role]) -> str:
    return ",".join(r.value for r in sorted(roles, key=LAYER_ROLES.index))
