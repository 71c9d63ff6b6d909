"""Numeric weights of a model, as one structure whichever file they come from, and their check.

Everything is held in the IR's ``y = x @ W`` convention, as float32: W is
``in x out``, a LoRA adapter is A (``in x r``) and B (``r x out``) with
``delta W = scale * A @ B``, a bias has ``out`` elements. Keys are
``(layer, role)`` as in the :class:`~primal_compiler.ir.model.Model`.
:func:`~primal_compiler.frontend.onnx_weights.load_onnx_weights` fills it
from an ONNX file, :func:`~primal_compiler.frontend.peft.load_peft_adapter`
from a PEFT adapter directory; :func:`check_lora` compares loaded LoRA
factors with a model: the same roles, the same layers, the shapes the model
expects. Every problem is a one-line :class:`InputError` naming the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.frontend.lora_spec import LAYER_ROLES
from primal_compiler.frontend.quant_codes import Decoded
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
    dora: np.ndarray | None = None  # DoRA's column scale c (out): the adapted output is c * (x W + scale x A B)
    magnitude: np.ndarray | None = None  # a PEFT DoRA adapter's m (out): c = m / ||W + scale A B|| per column

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
        if got is None or got.a is None or got.b is None or lin.lora is None:
            raise InputError(where, f"has no LoRA weights for layer {layer} {role.value}, which has LoRA in the model")
        rank = got.a.shape[1] if padded and got.a.ndim == 2 and 0 < got.a.shape[1] <= lin.lora.rank else lin.lora.rank
        for part, value, shape in (
            ("lora_A", got.a, (lin.in_features, rank)),
            ("lora_B", got.b, (rank, lin.out_features)),
        ):
            if value.shape != shape:
                what = f"layer {layer} {role.value} {part}"
                raise InputError(where, f"{what} is {dims_text(value.shape)}, model expects {dims_text(shape)}")
    for (layer, role), p in weights.projections.items():
        if p.w is None or layer >= model.num_layers:
            continue
        base = model.layers[layer].linear(role)
        if base is not None and p.w.shape != (base.in_features, base.out_features):
            shape = (base.in_features, base.out_features)
            what = f"layer {layer} {role.value} weight"
            raise InputError(where, f"{what} is {dims_text(p.w.shape)}, model expects {dims_text(shape)}")


def _roles(roles: set[Role]) -> str:
    return ",".join(r.value for r in sorted(roles, key=LAYER_ROLES.index))


def dims_text(shape) -> str:
    """``4096x128``: a shape as messages write it."""
    return "x".join(str(int(d)) for d in shape)
