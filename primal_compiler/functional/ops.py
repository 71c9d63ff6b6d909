"""Float32 math of the activation path and the attention DMACs, vectorized over token vectors.

Conventions follow Hugging Face: RMSNorm ``x / sqrt(mean(x^2) + eps) * w``;
LayerNorm with the biased variance; ``gelu_new`` is the tanh approximation;
RoPE rotates pairs of columns, the first by ``x cos - y sin``, the second by
``y cos + x sin``, at ``position * inv_freq[j]`` for the pair's frequency
``j`` (``theta ** (-2j / head_dim)`` unless the file gives its own).
Attention partials are flash-decoding triples ``(o, m, l)``: the
unnormalised softmax-weighted sum of values, the running maximum score and
the running sum of ``exp(score - m)``; a partial over no key has ``m = -inf``
and ``l = 0``.
"""

from __future__ import annotations

import math

import numpy as np

from primal_compiler.ir.model import Activation

_erf = np.vectorize(math.erf, otypes=[np.float64])


def norm_stats(x: np.ndarray, with_sum: bool) -> np.ndarray:
    """A hub shard's norm statistics, float32: the sum of squares of each vector's elements (V x 1), after
    their sum (V x 2) ``with_sum``."""
    squares = (x * x).sum(axis=-1, keepdims=True)
    return (np.concatenate([x.sum(axis=-1, keepdims=True), squares], axis=-1) if with_sum else squares).astype(np.float32)


def rms_norm(x: np.ndarray, w: np.ndarray, total: np.ndarray, n: int, eps: float) -> np.ndarray:
    """RMSNorm of a shard ``x`` of an ``n``-element vector whose sum of squares summed over every shard is
    ``total`` (V x 1, :func:`norm_stats`), with the shard's weights ``w``."""
    var = total[:, 0:1] / np.float32(n)
    return (x / np.sqrt(var + np.float32(eps)) * w).astype(np.float32)


def head_rms_norm(x: np.ndarray, w: np.ndarray, hd: int, eps: float) -> np.ndarray:
    """Every ``hd``-element head of the vectors ``x`` (V x a multiple of ``hd``) RMS-normalised, times ``w``."""
    heads = x.reshape(len(x), -1, hd)
    var = (heads * heads).mean(axis=-1, keepdims=True, dtype=np.float32)
    return (heads / np.sqrt(var + np.float32(eps)) * w).reshape(x.shape).astype(np.float32)


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, total: np.ndarray, n: int, eps: float) -> np.ndarray:
    """LayerNorm of a shard (as :func:`rms_norm`, ``total`` V x 2 with the sum): the variance is
    E[x^2] - E[x]^2 of the summed statistics."""
    mean = total[:, 0:1] / np.float32(n)
    var = np.maximum(total[:, 1:2] / np.float32(n) - mean * mean, np.float32(0))
    return ((x - mean) / np.sqrt(var + np.float32(eps)) * w + b).astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    return (x / (1.0 + np.exp(-x))).astype(np.float32)


def activation(kind: Activation, x: np.ndarray) -> np.ndarray:
    """The MLP activation ``kind`` (GELU / gelu_new / ReLU / squared ReLU / SiLU), of an ungated MLP or of a gated
    one's gate."""
    if kind == Activation.RELU:
        return np.maximum(x, 0).astype(np.float32)
    if kind == Activation.RELU_SQUARED:
        return np.square(np.maximum(x, 0)).astype(np.float32)
    if kind == Activation.GELU_NEW:
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)
        return (0.5 * x * (1.0 + np.tanh(inner))).astype(np.float32)
    if kind == Activation.GELU:
        return (0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))).astype(np.float32)
    return silu(x)


def logit_cap(x: np.ndarray, scale: float, cap: float) -> np.ndarray:
    """Logits times ``scale``, then ``cap * tanh(x / cap)`` when ``cap`` > 0, in float32 as exporters compute
    them (the scale and 1/cap folded into one factor, as one multiply)."""
    x = x.astype(np.float32)
    if cap <= 0:
        return x * np.float32(scale)
    return np.float32(cap) * np.tanh(x * np.float32(scale / cap))


def inverse_frequencies(theta: float, head_dim: int) -> np.ndarray:
    """``theta ** (-2i / head_dim)`` for i < head_dim/2, in float32 as Hugging Face computes them."""
    exponent = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    return (np.float32(1.0) / np.float32(theta) ** exponent).astype(np.float32)


def rope(x: np.ndarray, positions: np.ndarray, freq: np.ndarray, partner: np.ndarray, leading: np.ndarray,
         inv_freq: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """Rotate columns of ``x`` (T x E) in pairs: ``freq`` is each column's frequency index (-1: not
    rotated), ``partner`` the column it pairs with, ``leading`` whether it is the pair's first (which
    takes ``- partner * sin``); ``positions`` has T entries; ``scale`` multiplies the rotated columns'
    cosines and sines (YaRN's attention factor)."""
    rotated = freq >= 0
    angle = positions.astype(np.float32)[:, None] * inv_freq[np.where(rotated, freq, 0)][None, :]
    cos = np.where(rotated, np.cos(angle) * np.float32(scale), 1.0).astype(np.float32)
    sin = np.where(rotated, np.sin(angle) * np.float32(scale), 0.0).astype(np.float32)
    sign = np.where(leading, -1.0, 1.0).astype(np.float32)
    return (x * cos + sign * x[:, partner] * sin).astype(np.float32)


def live_keys(q_pos: np.ndarray, k_pos: np.ndarray, window: int) -> np.ndarray:
    """Which keys (T x C) each query attends: a key counts when it was written (position >= 0), is not
    after the query and is among the last ``window`` positions."""
    return (k_pos[None, :] >= 0) & (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] > q_pos[:, None] - window)


def scores(q: np.ndarray, k: np.ndarray, live: np.ndarray, scale: float = 0.0, cap: float = 0.0) -> np.ndarray:
    """Scores (T x heads x C) of queries q (T x heads x hd) against keys k (C x hd), times ``scale`` (0: over
    sqrt(hd), the model's default), then soft-capped, ``cap * tanh(s / cap)``, when ``cap`` > 0; keys a query
    does not attend (``live``, T x C, from :func:`live_keys`) score ``-inf``."""
    dot = np.einsum("thd,cd->thc", q, k)
    s = dot * np.float32(scale) if scale else dot / np.float32(math.sqrt(q.shape[-1]))
    if cap:
        s = np.float32(cap) * np.tanh(s / np.float32(cap))
    return np.where(live[:, None, :], s, -np.inf).astype(np.float32)


def partial(s: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The (o, m, l) partial (T x heads x hd+2) of scores s (T x heads x C) over values v (C x hd)."""
    m = s.max(axis=-1)
    p = np.exp(s - np.where(np.isfinite(m), m, 0.0)[..., None])
    o = p @ v
    return np.concatenate([o, m[..., None], p.sum(axis=-1)[..., None]], axis=-1).astype(np.float32)


def merge(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Two (o, m, l) partials of the same queries combined."""
    m = np.maximum(a[..., -2], b[..., -2])
    safe = np.where(np.isfinite(m), m, 0.0)
    wa = np.where(np.isfinite(a[..., -2]), np.exp(a[..., -2] - safe), 0.0)
    wb = np.where(np.isfinite(b[..., -2]), np.exp(b[..., -2] - safe), 0.0)
    o = a[..., :-2] * wa[..., None] + b[..., :-2] * wb[..., None]
    l = a[..., -1] * wa + b[..., -1] * wb  # noqa: E741
    return np.concatenate([o, m[..., None], l[..., None]], axis=-1).astype(np.float32)


def normalized(p: np.ndarray) -> np.ndarray:
    """Attention output o / l of a merged partial."""
    return (p[..., :-2] / p[..., -1:]).astype(np.float32)
