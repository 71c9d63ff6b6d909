"""Numeric weights of a model: from an ONNX file or a PEFT LoRA adapter directory.

Everything is returned in the IR's ``y = x @ W`` convention, as float32:
W is ``in x out``, a LoRA adapter is A (``in x r``) and B (``r x out``) with
``delta W = scale * A @ B``, a bias has ``out`` elements. Keys are
``(layer, role)`` as in the :class:`~primal_compiler.ir.model.Model`.

* :func:`load_onnx_weights` reads the initializers behind the projections
  that :func:`~primal_compiler.frontend.onnx_import.recognise_onnx` found
  (never by initializer name), undoing a ``Transpose`` in front of the
  weight and Gemm's ``transB``. External-data files are read when present;
  an absent one is an :class:`InputError` (shape-only import still works).
* :func:`load_peft_adapter` reads a PEFT adapter directory
  (``adapter_config.json`` + ``adapter_model.safetensors``) with the
  ``safetensors`` numpy API. Module names map to roles through
  ``lora_spec.ALIASES`` (GPT-2's ``mlp.c_proj`` is fc2, ``attn.c_proj`` o).
  PEFT stores ``lora_A.weight`` as ``r x in`` and ``lora_B.weight`` as
  ``out x r`` for Linear and GPT-2 Conv1D layers alike; both are transposed
  here.
* :func:`check_lora` compares loaded LoRA factors with a model: the same
  roles, the same layers, the shapes the model expects.

Every problem is a one-line :class:`InputError` naming the file.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.frontend.lora_spec import ALIASES, LAYER_ROLES
from primal_compiler.ir.model import Model, Role

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


@dataclass(frozen=True, eq=False)
class ProjectionWeights:
    """Weights of one projection; a field is None when absent or not loaded."""

    w: np.ndarray | None = None  # in x out
    bias: np.ndarray | None = None  # out
    a: np.ndarray | None = None  # LoRA A, in x r
    b: np.ndarray | None = None  # LoRA B, r x out
    scale: float = 1.0  # LoRA alpha / rank (alpha / sqrt(rank) with rsLoRA)
    module: str = ""  # where it came from: PEFT module name or ONNX node name

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
        w = bias = a = b = None
        if base:
            w = _matmul_weight(g, p.node, (p.in_features, p.out_features), label, where)
            if p.bias:
                bias = _bias(g, p.node, p.out_features, label, where)
        scale = 1.0
        if p.lora is not None:
            rank, alpha = p.lora
            a = _matmul_weight(g, p.lora_nodes[0], (p.in_features, rank), f"{label} lora_A", where)
            b = _matmul_weight(g, p.lora_nodes[1], (rank, p.out_features), f"{label} lora_B", where)
            scale = alpha / rank
        out[(layer, role)] = ProjectionWeights(w, bias, a, b, scale, node.name or f"node {p.node}")
    return ModelWeights(where, "onnx", out, found.model, read_tables(found, where) if base else None)


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
    from onnx import TensorProto, numpy_helper

    if tensor.data_location == TensorProto.EXTERNAL:
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        if not location or not (g.base_dir / location).is_file():
            raise InputError(
                where, f"{label}: initializer {tensor.name!r} is in external data file {location!r}, which is absent"
            )
    try:
        return numpy_helper.to_array(tensor, base_dir=str(g.base_dir)).astype(np.float32)
    except Exception as exc:  # noqa: BLE001 - onnx raises many types for unreadable data
        detail = f"{type(exc).__name__}: {_first_line(exc)}"
        raise InputError(where, f"{label}: cannot read initializer {tensor.name!r} ({detail})") from None


def _matmul_weight(g, node_index: int, shape: tuple[int, int], label: str, where: str) -> np.ndarray:
    """The ``in x out`` matrix a MatMul/Gemm multiplies by (as the projection finder sees it)."""
    node = g.nodes[node_index]
    if node.op_type == "MatMulNBits":
        raise InputError(where, f"{label}: quantized MatMulNBits weights cannot be decoded")
    tensor, transposed = _tensor_behind(g, node.input[1])
    if tensor is None:
        raise InputError(where, f"{label}: the weight of node {node.name or node_index} is not a constant")
    value = _read(g, tensor, label, where)
    if value.ndim != 2:
        raise InputError(where, f"{label}: initializer {tensor.name!r} is not 2-D")
    if transposed:
        value = value.T
    if node.op_type == "Gemm" and _attr(node, "transB"):
        value = value.T
    if value.shape != shape:  # the frontend found these shapes from the same tensors
        raise InputError(where, f"{label}: weight is {_dims(value.shape)}, expected {_dims(shape)}")
    return np.ascontiguousarray(value)


def _bias(g, node_index: int, out_features: int, label: str, where: str) -> np.ndarray | None:
    """The bias of a projection: Gemm C, MatMulNBits input 5, or a constant Add right after the matmul."""
    from primal_compiler.frontend.onnx_graph import SHAPE_OPS, TRANSPARENT

    node = g.nodes[node_index]
    name = None
    if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
        name = node.input[2]
    elif node.op_type == "MatMulNBits" and len(node.input) > 5 and node.input[5]:
        name = node.input[5]
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


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else "no detail"


def _dims(shape) -> str:
    return "x".join(str(int(d)) for d in shape)


# --------------------------------------------------------------------------- PEFT adapters

# base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight (optionally lora_A.<adapter>.weight)
_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<part>[AB])(?:\.(?P<adapter>[^.]+))?\.weight$")
_LAYER_PATH = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(?P<index>\d+)\.(?P<path>.+)$")


def load_peft_adapter(path: str | Path) -> ModelWeights:
    """LoRA A (``in x r``) and B (``r x out``) per ``(layer, role)`` from a PEFT adapter directory."""
    directory = Path(path)
    if not directory.exists():
        raise InputError(str(directory), "no such adapter directory")
    if not directory.is_dir():
        expected = f"{ADAPTER_CONFIG} + {ADAPTER_WEIGHTS}"
        raise InputError(str(directory), f"not a directory; expected a PEFT adapter directory ({expected})")
    config_path, weights_path = directory / ADAPTER_CONFIG, directory / ADAPTER_WEIGHTS
    if not config_path.is_file():
        raise InputError(str(config_path), "missing: a PEFT adapter directory needs adapter_config.json")
    if not weights_path.is_file():
        hint = " (only the pickled adapter_model.bin is there; re-save with safe_serialization=True)" if (
            directory / "adapter_model.bin").exists() else ""
        raise InputError(str(weights_path), f"missing: a PEFT adapter directory needs {ADAPTER_WEIGHTS}{hint}")
    config = _adapter_config(config_path)
    tensors = _safetensors(weights_path)
    where = str(weights_path)

    factors: dict[tuple[int, Role], dict[str, Any]] = {}
    for key, value in tensors.items():
        if ".lora_embedding_" in key:
            raise InputError(where, f"adapter targets an embedding ({key}); only layer projections can have LoRA")
        m = _LORA_KEY.match(key)
        if m is None:
            continue  # lora_B.bias, DoRA magnitudes, modules_to_save copies: not LoRA factors
        module = m["module"]
        leaf = module.rsplit(".", 1)[-1]
        lm = _LAYER_PATH.search(module)
        role = _role_of(leaf, lm["path"] if lm else "")
        if lm is None or role is None:
            raise InputError(where, f"adapter targets {leaf} ({module}), which is not a decoder-layer projection")
        entry = factors.setdefault((int(lm["index"]), role), {"module": module})
        if entry["module"] != module:
            both = f"modules {entry['module']} and {module}"
            raise InputError(where, f"{both} both map to layer {lm['index']} {role.value}")
        if value.ndim != 2:
            raise InputError(where, f"{key} has shape {list(value.shape)}, expected a matrix")
        entry[m["part"]] = value
    if not factors:
        raise InputError(where, "no LoRA weights (no *.lora_A.weight / *.lora_B.weight tensors)")

    out: dict[tuple[int, Role], ProjectionWeights] = {}
    for (layer, role), entry in factors.items():
        label = f"layer {layer} {role.value}"
        if "A" not in entry or "B" not in entry:
            missing = "lora_A" if "A" not in entry else "lora_B"
            raise InputError(where, f"{label} ({entry['module']}) has no {missing}")
        a, b = entry["A"].T, entry["B"].T  # PEFT: A is r x in, B is out x r
        if a.shape[1] != b.shape[0]:
            raise InputError(where, f"{label} lora_A has rank {a.shape[1]} but lora_B has rank {b.shape[0]}")
        rank = a.shape[1]
        if config["rank_default"] and rank != config["r"]:
            raise InputError(where, f"{label} lora_A has rank {rank}, adapter_config.json says r={config['r']}")
        alpha = _pattern(config["alpha_pattern"], entry["module"], config["lora_alpha"])
        scale = alpha / math.sqrt(rank) if config["use_rslora"] else alpha / rank
        out[(layer, role)] = ProjectionWeights(
            a=np.ascontiguousarray(a), b=np.ascontiguousarray(b), scale=float(scale), module=entry["module"]
        )
    return ModelWeights(where, "adapter", out)


def _adapter_config(path: Path) -> dict[str, Any]:
    where = str(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(where, f"not readable JSON ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from None
    if not isinstance(raw, dict):
        raise InputError(where, "not a JSON object")
    kind = raw.get("peft_type", "LORA")
    if str(kind).upper() != "LORA":
        raise InputError(where, f"peft_type is {kind}, not LORA")
    r, alpha = raw.get("r"), raw.get("lora_alpha", raw.get("r"))
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise InputError(where, f"r must be a positive integer, got {r!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise InputError(where, f"lora_alpha must be a number, got {alpha!r}")
    rank_pattern = raw.get("rank_pattern") or {}
    alpha_pattern = raw.get("alpha_pattern") or {}
    if not isinstance(rank_pattern, dict) or not isinstance(alpha_pattern, dict):
        raise InputError(where, "rank_pattern and alpha_pattern must be JSON objects")
    return {
        "r": r,
        "lora_alpha": float(alpha),
        "rank_default": not rank_pattern,  # every module has rank r unless a pattern overrides it
        "alpha_pattern": alpha_pattern,
        "use_rslora": bool(raw.get("use_rslora", False)),
    }


def _pattern(patterns: dict[str, Any], module: str, default: float) -> float:
    """PEFT's per-module override: the first pattern matching the end of the module name."""
    for key, value in patterns.items():
        try:
            hit = re.match(rf"(.*\.)?{key}$", module) is not None
        except re.error:
            hit = module == key or module.endswith("." + key)
        if hit:
            return float(value)
    return default


def _safetensors(path: Path) -> dict[str, np.ndarray]:
    """The LoRA tensors of a safetensors file as float32 (bfloat16 through ml_dtypes, which onnx installs).

    Other tensors (``modules_to_save`` copies of whole layers) are never decoded.
    """
    try:
        import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
    except ImportError:  # pragma: no cover - onnx depends on it
        pass
    try:
        from safetensors import safe_open
    except ImportError:  # pragma: no cover - a declared dependency
        raise InputError(str(path), "reading adapters needs the safetensors package") from None
    out = {}
    try:
        with safe_open(str(path), framework="np") as fh:
            for key in fh.keys():
                if ".lora_" in key:
                    out[key] = np.asarray(fh.get_tensor(key)).astype(np.float32)
    except Exception as exc:  # noqa: BLE001 - SafetensorError, TypeError for unknown dtypes, OSError
        detail = f"{type(exc).__name__}: {_first_line(exc)}"
        raise InputError(str(path), f"not a readable safetensors file ({detail})") from None
    return out


def _role_of(leaf: str, path: str) -> Role | None:
    """The role of a PEFT module leaf name; ``path`` (e.g. ``mlp.c_proj``) disambiguates GPT-2's c_proj."""
    if leaf == "c_proj" and path.split(".")[0] == "mlp":
        return Role.FC2
    roles = ALIASES.get(leaf)
    if roles is not None:
        return roles[0] if len(roles) == 1 else None
    try:
        role = Role(leaf)
    except ValueError:
        return None
    return role if role in LAYER_ROLES else None


# --------------------------------------------------------------------------- checks


def check_lora(weights: ModelWeights, model: Model) -> None:
    """Raise :class:`InputError` unless ``weights`` has exactly the model's LoRA factors, shaped as it expects."""
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
    if have_roles != want_roles:
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
        if got is None:
            raise InputError(where, f"has no LoRA weights for layer {layer} {role.value}, which has LoRA in the model")
        for part, value, shape in (
            ("lora_A", got.a, (lin.in_features, lin.lora.rank)),
            ("lora_B", got.b, (lin.lora.rank, lin.out_features)),
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
