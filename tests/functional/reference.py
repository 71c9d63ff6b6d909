"""References the replay is compared with: ONNX Runtime on the fixture files, and a dense numpy model.

The ONNX Runtime runner (``ort_logits``, ``ort_greedy``) lives in
:mod:`primal_compiler.report.check`, which ``primal check`` uses; it is
re-exported here.

The numpy model runs one token at a time with a KV cache that keeps the
last ``window`` positions (a sliding window, what a wrapped KV ring holds),
straight from the parameters, with no stream, tiles or buffers: it checks
the ring buffer past the context, where ONNX Runtime (full causal
attention) no longer applies.
"""

from __future__ import annotations

import math

import numpy as np

from primal_compiler.ir.model import Activation, NormKind, Positional, Role
from primal_compiler.report.check import ort_greedy, ort_logits

__all__ = ["dense_greedy", "ort_greedy", "ort_logits"]


def _norm(model, params, key, x):
    scale, bias = params.norms[key]
    kind = model.norm if key[0] == model.num_layers else model.layers[key[0]].norm
    if kind == NormKind.RMS:
        return x / np.sqrt(np.mean(x * x) + model.norm_eps) * scale
    mu = x.mean()
    return (x - mu) / np.sqrt(np.mean((x - mu) ** 2) + model.norm_eps) * scale + bias


def _linear(params, key, x):
    y = x @ params.w[key]
    if key in params.bias:
        y = y + params.bias[key]
    a, b = params.lora[0]  # the one adapter of these reference runs
    if key in a:
        y = y + (x @ a[key]) @ b[key]
    return y


def _rope(x, pos, model):
    """Rotary embedding of heads stored as the parameters hold them: pairs (2j, 2j + 1) adjacent."""
    hd = x.shape[-1]
    inv = np.array(model.rope_inv_freq) if model.rope_inv_freq else model.rope_theta ** (-np.arange(0, hd, 2) / hd)
    ang = pos * np.repeat(inv, 2)
    rot = np.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)
    return x * np.cos(ang) + rot * np.sin(ang)


def _act(kind, x):
    if kind == Activation.RELU:
        return np.maximum(x, 0)
    if kind == Activation.GELU_NEW:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    if kind == Activation.GELU:
        return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    return x / (1 + np.exp(-x))


def dense_greedy(model, params, prompt: list[int], generate: int, window: int) -> np.ndarray:
    """Logits [generate, vocab] of greedy decoding with a KV cache of the last ``window`` positions."""
    cache = [[] for _ in model.layers]
    ids, out = list(prompt), []
    for pos in range(len(prompt) + generate - 1):
        h = params.embed[ids[pos]].astype(np.float64) * model.embed_scale
        if model.positional == Positional.LEARNED:
            h = h + params.pos_embed[pos + model.num_pos_embeddings - model.max_position_embeddings]
        for n, layer in enumerate(model.layers):
            att = layer.attention
            a = _norm(model, params, (n, 0), h)
            if layer.linear(Role.QKV) is not None:
                qkv = _linear(params, (n, Role.QKV), a)
                q, k, v = np.split(qkv, [att.q_size, att.q_size + att.kv_size])
            else:
                q, k, v = (_linear(params, (n, r), a) for r in (Role.Q, Role.K, Role.V))
            q, k, v = (t.reshape(-1, att.head_dim) for t in (q, k, v))
            if model.positional == Positional.ROPE:
                q, k = _rope(q, pos, model), _rope(k, pos, model)
            cache[n] = (cache[n] + [(k, v)])[-window:]
            keys, values = np.stack([c[0] for c in cache[n]]), np.stack([c[1] for c in cache[n]])
            group = att.num_heads // att.num_kv_heads
            o = []
            for head in range(att.num_heads):
                s = keys[:, head // group] @ q[head] * model.score_scale
                if model.attn_softcap:
                    s = model.attn_softcap * np.tanh(s / model.attn_softcap)
                p = np.exp(s - s.max())
                o.append(p @ values[:, head // group] / p.sum())
            h = h + model.residual_multiplier * _linear(params, (n, Role.O), np.concatenate(o))
            m = _norm(model, params, (n, 1), h)
            if layer.linear(Role.GATE) is not None:
                mid = _act(layer.activation, _linear(params, (n, Role.GATE), m)) * _linear(params, (n, Role.UP), m)
                h = h + model.residual_multiplier * _linear(params, (n, Role.DOWN), mid)
            else:
                h = h + model.residual_multiplier * _linear(params, (n, Role.FC2),
                                                            _act(layer.activation, _linear(params, (n, Role.FC1), m)))
        if pos >= len(prompt) - 1:
            logits = _linear(params, (model.num_layers, Role.LM_HEAD), _norm(model, params, (model.num_layers, 0), h))
            out.append(logits)
            if len(ids) <= pos + 1:
                ids.append(int(np.argmax(logits)))
    return np.stack(out).astype(np.float32)
