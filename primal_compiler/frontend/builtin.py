"""Built-in model architectures (no weights): shapes as published on the Hugging Face hub.

Each entry reproduces the published parameter count exactly (tests check it). A Llama-3.1 model's RoPE
frequencies follow its ``rope_scaling`` (``rope_type`` llama3) as transformers computes them
(``_compute_llama3_parameters``): with wavelength ``2 pi / f`` of the unscaled frequency ``f = theta ** (-2i /
head_dim)``, a wavelength above ``original / low_freq_factor`` is divided by ``factor``, one below ``original /
high_freq_factor`` kept, and one between blended, ``(1 - s) f / factor + s f`` with ``s = (original / wavelength
- low) / (high - low)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from primal_compiler.errors import InputError
from primal_compiler.ir.model import (
    Activation,
    Attention,
    DecoderLayer,
    Linear,
    Model,
    NormKind,
    Positional,
    Role,
    check_size,
)


@dataclass(frozen=True)
class ArchConfig:
    """The handful of numbers a Hugging Face ``config.json`` gives for a decoder."""

    family: str  # "llama" (Llama, Mistral), "gpt2" or "opt"
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    published_params: int = 0
    sliding_window: int = 0  # every layer's queries see only the last this many keys (0: all)
    rope_theta: float = 10000.0
    llama3_scaling: tuple[float, ...] = ()  # Llama-3.1 rope_scaling: factor, low and high freq factors, original
    qkv_bias: bool = False  # q, k and v projections add a bias (Qwen2)


BUILTIN: dict[str, ArchConfig] = {
    "llama2-7b": ArchConfig("llama", 4096, 32, 32, 32, 11008, 32000, 4096, published_params=6_738_415_616),
    "llama2-13b": ArchConfig("llama", 5120, 40, 40, 40, 13824, 32000, 4096, published_params=13_015_864_320),
    "llama2-70b": ArchConfig("llama", 8192, 80, 64, 8, 28672, 32000, 4096, published_params=68_976_648_192),
    # Mistral-7B-v0.1 (rope_theta 10000, sliding_window 4096 in its config.json)
    # Meta-Llama-3-8B: rope_theta 500000, 128,256-token vocabulary, grouped-query attention
    "llama3-8b": ArchConfig("llama", 4096, 32, 32, 8, 14336, 128256, 8192, published_params=8_030_261_248,
                            rope_theta=500000.0),
    # Llama-3.1-70B: as Llama-3, with rope_scaling {factor 8, low_freq_factor 1, high_freq_factor 4,
    # original_max_position_embeddings 8192} and 131,072 positions
    "llama3.1-70b": ArchConfig("llama", 8192, 80, 64, 8, 28672, 128256, 131072, published_params=70_553_706_496,
                               rope_theta=500000.0, llama3_scaling=(8.0, 1.0, 4.0, 8192)),
    # Qwen2.5-7B: biases on q, k and v, rope_theta 1000000, 152,064-token vocabulary, 4 kv heads
    "qwen2.5-7b": ArchConfig("llama", 3584, 28, 28, 4, 18944, 152064, 131072, published_params=7_615_616_512,
                             rope_theta=1000000.0, qkv_bias=True),
    "mistral-7b": ArchConfig("llama", 4096, 32, 32, 8, 14336, 32000, 32768, published_params=7_241_732_096,
                             sliding_window=4096),
    "gpt2": ArchConfig("gpt2", 768, 12, 12, 12, 3072, 50257, 1024, True, published_params=124_439_808),
    "opt-1.3b": ArchConfig("opt", 2048, 24, 32, 32, 8192, 50272, 2048, True, published_params=1_315_758_080),
    # Small architectures for quick experiments and tests (not published models).
    "tiny-llama": ArchConfig("llama", 256, 2, 4, 4, 688, 512, 256),
    "tiny-mistral": ArchConfig("llama", 256, 2, 8, 2, 512, 512, 256),
}


def builtin_names() -> tuple[str, ...]:
    return tuple(BUILTIN)


def build_model(cfg: ArchConfig, name: str, source: str = "builtin") -> Model:
    """Model IR for an architecture config; deterministic and weight-free.

    Sizes over the IR's limits are an :class:`InputError` (the :class:`Model` checks them; the layer count
    is checked first, so an absurd config never loops over 10^12 layers).
    """
    check_size(f"model {name}", "decoder layers", cfg.num_layers)
    head_dim = cfg.hidden_size // cfg.num_heads
    attn = Attention(cfg.num_heads, cfg.num_kv_heads, head_dim)
    h, f = cfg.hidden_size, cfg.intermediate_size
    linears: tuple[Linear, ...]
    if cfg.family == "llama":
        linears = (
            Linear(Role.Q, h, attn.q_size, bias=cfg.qkv_bias),
            Linear(Role.K, h, attn.kv_size, bias=cfg.qkv_bias),
            Linear(Role.V, h, attn.kv_size, bias=cfg.qkv_bias),
            Linear(Role.O, attn.q_size, h),
            Linear(Role.GATE, h, f),
            Linear(Role.UP, h, f),
            Linear(Role.DOWN, f, h),
        )
        norm, act, pos, npos = NormKind.RMS, Activation.SILU, Positional.ROPE, 0
    elif cfg.family == "gpt2":
        linears = (
            Linear(Role.QKV, h, 3 * h, bias=True),
            Linear(Role.O, h, h, bias=True),
            Linear(Role.FC1, h, f, bias=True),
            Linear(Role.FC2, f, h, bias=True),
        )
        norm, act, pos, npos = NormKind.LAYER, Activation.GELU_NEW, Positional.LEARNED, cfg.max_position_embeddings
    elif cfg.family == "opt":
        linears = tuple(Linear(r, h, h, bias=True) for r in (Role.Q, Role.K, Role.V, Role.O)) + (
            Linear(Role.FC1, h, f, bias=True),
            Linear(Role.FC2, f, h, bias=True),
        )
        norm, act, pos, npos = NormKind.LAYER, Activation.RELU, Positional.LEARNED, cfg.max_position_embeddings + 2
    else:
        raise InputError(name, f"unknown architecture family {cfg.family!r}")
    layers = tuple(DecoderLayer(i, attn, linears, norm, act, window=cfg.sliding_window) for i in range(cfg.num_layers))
    return Model(
        name=name,
        hidden_size=h,
        vocab_size=cfg.vocab_size,
        layers=layers,
        positional=pos,
        norm=norm,
        tie_word_embeddings=cfg.tie_word_embeddings,
        max_position_embeddings=cfg.max_position_embeddings,
        num_pos_embeddings=npos,
        source=source,
        rope_theta=cfg.rope_theta,
        rope_inv_freq=llama3_frequencies(head_dim, cfg.rope_theta, *cfg.llama3_scaling) if cfg.llama3_scaling else (),
    )


def llama3_frequencies(head_dim: int, theta: float, factor: float, low: float, high: float,
                       original: float) -> tuple[float, ...]:
    """RoPE inverse frequencies under Llama-3.1's ``rope_scaling`` (module docstring)."""
    out = []
    for i in range(0, head_dim, 2):
        f = theta ** (-i / head_dim)
        wavelength = 2 * math.pi / f
        if wavelength > original / low:
            f = f / factor
        elif wavelength >= original / high:
            s = (original / wavelength - low) / (high - low)
            f = (1 - s) * f / factor + s * f
        out.append(f)
    return tuple(out)


def load_builtin(name: str) -> Model:
    """The built-in model called ``name``; an unknown name is an :class:`InputError`."""
    cfg = BUILTIN.get(name.lower())
    if cfg is None:
        choices = ", ".join(BUILTIN)
        raise InputError(name or "''", f"unknown built-in model; choose one of {choices} or give an .onnx file")
    return build_model(cfg, name.lower())
