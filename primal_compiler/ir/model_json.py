"""A Model as plain JSON data and back, so a program file carries the model it was compiled from.

``model_from_dict(model_to_dict(m)) == m`` for every Model: enums are stored
by value, tuples as lists, and the dataclass constructors re-check every value.
"""

from __future__ import annotations

from dataclasses import asdict

from primal_compiler.ir.model import (
    Activation, Attention, DecoderLayer, Linear, LoRA, Model, NormKind, Positional, Role,
)
from primal_compiler.ir.precision import Precision
from primal_compiler.ir.quant import WeightQuant


def model_to_dict(model: Model) -> dict:
    """Plain data; ``weight_quant`` only when the file was quantized, ``rope_dim`` only for partial rotary,
    ``qkv_layout`` only when per head, ``rope_interleaved``, ``alibi_slopes``, ``embed_norm`` and a layer's
    ``parallel``, ``post_norms``, ``window`` and ``qk_norm`` only when set, ``norm_bias`` and ``norm_weights`` only when False,
    ``rope_attention_scale``, ``logit_scale`` and ``residual_multiplier`` only when not 1, ``logit_softcap``,
    ``attention_scale``, ``attn_softcap``, ``qkv_clip`` and ``static_activations`` only when set, a LoRA's ``dora``
    only when True (older program files lack them)."""
    d = asdict(model)
    for key in ("weight_quant", "rope_dim", "qkv_layout", "rope_interleaved", "alibi_slopes", "embed_norm"):
        if not d[key]:
            del d[key]
    for key in ("norm_bias", "norm_weights"):
        if d[key]:
            del d[key]
    for key, plain in (("rope_attention_scale", 1.0), ("logit_scale", 1.0), ("logit_softcap", 0.0),
                       ("attention_scale", 0.0), ("attn_softcap", 0.0), ("residual_multiplier", 1.0),
                       ("qkv_clip", 0.0), ("static_activations", 0)):
        if d[key] == plain:
            del d[key]
    for layer in d["layers"]:
        if not layer["parallel"]:
            del layer["parallel"]
        if layer["rope"]:
            del layer["rope"]
        for key in ("post_norms", "window", "qk_norm"):
            if not layer[key]:
                del layer[key]
        for linear in layer["linears"]:
            if linear["lora"] and not linear["lora"]["dora"]:
                del linear["lora"]["dora"]
    return d


def _linear(d: dict) -> Linear:
    lora = LoRA(**d["lora"]) if d.get("lora") else None
    return Linear(role=Role(d["role"]), in_features=d["in_features"], out_features=d["out_features"],
                  bias=d["bias"], lora=lora)


def _layer(d: dict) -> DecoderLayer:
    return DecoderLayer(index=d["index"], attention=Attention(**d["attention"]),
                        linears=tuple(_linear(x) for x in d["linears"]), norm=NormKind(d["norm"]),
                        activation=Activation(d["activation"]), num_norms=d["num_norms"],
                        parallel=bool(d.get("parallel", False)), rope=bool(d.get("rope", True)),
                        post_norms=bool(d.get("post_norms", False)), window=int(d.get("window", 0)),
                        qk_norm=bool(d.get("qk_norm", False)))


def model_from_dict(d: dict) -> Model:
    """The Model of :func:`model_to_dict`; KeyError/ValueError on malformed data."""
    rest = {k: v for k, v in d.items() if k not in ("layers", "positional", "norm", "precision", "weight_quant")}
    return Model(layers=tuple(_layer(x) for x in d["layers"]), positional=Positional(d["positional"]),
                 norm=NormKind(d["norm"]), precision=Precision(**d["precision"]),
                 weight_quant=tuple(WeightQuant(**q) for q in d.get("weight_quant", ())), **rest)
