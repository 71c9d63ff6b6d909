"""The order in which the crossbars store a projection's output columns, as indices into the file's columns.

Two layouts differ from the file's column order:

* a fused qkv whose columns run head by head (``Model.qkv_layout ==
  "per-head"``, GPT-NeoX and Bloom, ``[q_h | k_h | v_h]`` for each head h)
  or group by group (``"per-group"``, Falcon's new decoder architecture,
  the group's query heads then its key and value head) is stored
  q | k | v, the IR's order;
* every rotary query and key head is stored with its rotation pairs next to
  each other: dimension ``i`` of a head, for ``i < rot / 2``, is followed by
  its partner ``i + rot / 2`` (``rotate_half``, Llama and GPT-NeoX; ``rot``
  is ``Model.rope_dim`` or the head size), and the unrotated dimensions
  follow in their order. Files that already rotate adjacent pairs
  (``Model.rope_interleaved``, GPT-J's ``rotate_every_two``) keep theirs.

Pairs of adjacent columns never straddle a crossbar's column block (whose
width is even), so the activation unit at a root rotates its block alone,
whatever the head size. Query and key heads are permuted alike, so every
score ``q . k`` is unchanged; values and every other projection keep the
file's order. :func:`stored_order` is the one place this order is defined;
the functional replay's parameters and the LoRA sparsity pass both read it,
and the replay's ``ROPE`` pairs column ``2j`` of a head with ``2j + 1``.
"""

from __future__ import annotations

import numpy as np

from primal_compiler.ir.model import Model, Positional, Role


def pair_order(head_dim: int, rot: int) -> np.ndarray:
    """Dimensions of one head in stored order: ``0, rot/2, 1, rot/2 + 1, ...``, then ``rot .. head_dim-1``."""
    half = rot // 2
    pairs = np.stack([np.arange(half), half + np.arange(half)], axis=1).reshape(-1)
    return np.concatenate([pairs, np.arange(rot, head_dim)])


def head_order(model: Model) -> np.ndarray:
    """Dimensions of one query or key head in stored order (a q/k head norm's weight is read through it)."""
    hd = model.attention.head_dim
    if model.positional == Positional.ROPE and not model.rope_interleaved:
        return pair_order(hd, model.rope_dim or hd)
    return np.arange(hd)


def stored_order(model: Model, layer: int, role: Role) -> np.ndarray | None:
    """File column of each stored output column of ``role`` in ``layer``; None when they are the same."""
    lin = model.layers[layer].linear(role) if layer < model.num_layers else None
    if lin is None or role not in (Role.Q, Role.K, Role.QKV):
        return None
    att = model.layers[layer].attention
    hd = att.head_dim
    order = np.arange(lin.out_features)
    if role == Role.QKV and model.qkv_layout == "per-head":
        order = np.concatenate([h * 3 * hd + part * hd + np.arange(hd)
                                for part in range(3) for h in range(att.num_heads)])
    elif role == Role.QKV and model.qkv_layout == "per-group":
        grp = att.num_heads // att.num_kv_heads
        width = (grp + 2) * hd  # one group's columns
        q = [j * width + h * hd + np.arange(hd) for j in range(att.num_kv_heads) for h in range(grp)]
        kv = [j * width + (grp + part) * hd + np.arange(hd) for part in range(2) for j in range(att.num_kv_heads)]
        order = np.concatenate(q + kv)
    if model.positional == Positional.ROPE and not model.rope_interleaved:
        heads = {Role.Q: att.num_heads, Role.K: att.num_kv_heads, Role.QKV: att.num_heads + att.num_kv_heads}[role]
        within = head_order(model)
        rotary = (np.arange(heads)[:, None] * hd + within[None, :]).reshape(-1)
        order = np.concatenate([order[rotary], order[heads * hd:]])  # a fused qkv's v keeps its order
    return None if np.array_equal(order, np.arange(lin.out_features)) else order
