"""Functional semantics of the compute records: SMAC on the macros, DMAC attention, ACT functions.

* ``SMAC_RRAM`` multiplies the first ``rows`` elements of each of its
  ``count`` input vectors by the tile placed on its PE (``arg`` must name
  that tile's bit slice); ``SMAC_SRAM`` by SRAM slot ``arg``, which a CONFIG
  must have written, unless the PE's mask register masks the slot: then the
  macro is not fired and the output is zero.
* ``DMAC QK`` scores the queries of its KV group (``QVEC``, the step's
  positions from the controller) against the K chunk in slot ``arg >> 8``,
  causally and within the last positions its layer's ring holds (a
  sliding layer's last ``window``, when shorter), adding ALiBi's
  ``slope_h * key position`` when the model has it; ``DMAC PV`` turns the
  scores into an (o, m, l) partial over the V chunk in slot ``arg >> 8``,
  merged into the one already there with ``ACCUMULATE``.
* ``ACT`` applies ``arg`` (ActFn) to ``src_buf`` into ``dst_buf``. The
  parameters an activation unit holds come with the record's ``layer`` and
  buffers: the norm of ``X`` is the layer's first norm (in place, in layer
  0 of a model with ``embed_norm``: the embedding norm), of ``MID`` its
  second (in a parallel block, of ``RESID``, the layer input, its second or
  its only one), in the LM head the final norm; ``BIAS`` adds the slice of the
  projection's bias that the ROOT buffer's column block holds, ``DORA``
  multiplies it by the slice of its DoRA adapter's column scale; ``GELU``
  is the layer's GELU variant; ``SWIGLU`` gates with the layer's activation
  (SiLU, or GELU for GeGLU); ``ROPE`` rotates the q and k elements of a
  ROOT buffer at the step's positions. ``EMBED`` (controller) embeds the
  prompt or its next chunk (PREFILL: positions from 0, or where the last
  chunk ended) or the last token (at the position
  counter), times the model's ``embed_scale``, adding learned position
  embeddings; ``ARGMAX`` records the logits, picks the next token (the
  host's when it forces tokens), advances the position counter by the
  step's tokens and ends the step.

What each record consumes (for ``Machine(producers=True)``): a SMAC the
elements of its input it multiplies and, for ``SMAC_SRAM``, the slot's mask
bit, and the SRAM slot unless masked (a masked macro's zero output depends
on no input); ``DMAC QK`` its queries and the K rows some query attends
(:func:`ops.live_keys`), ``DMAC PV`` its scores, the V rows with a finite
score and, with ``ACCUMULATE``, the partial it merges into; an ``ACT`` its
whole source (``SWIGLU`` the gate elements it uses) and, for ``SWIGLU`` and
``RESIDUAL_ADD``, its destination; a decode ``EMBED`` the token and position
the last ``ARGMAX`` left (the position counter that KV_APPEND, DMAC and ROPE
use is the controller's issue state, not a consumed value).
"""

from __future__ import annotations

import numpy as np

from primal_compiler.functional import ops
from primal_compiler.functional.machine import (
    ARG, COUNT, CT, CTL, DST_BUF, FLAGS, LAYER, PE, SRC_BUF, Machine, root_block,
)
from primal_compiler.ir.model import Activation, Positional, Role
from primal_compiler.ir.tiles import Part
from primal_compiler.isa.opcodes import (
    STATISTICS, STATS_FN, ActFn, BufKind, DmacOp, Flag, HiddenBuf, buf_name, hidden,
)


def _input(m: Machine, r: tuple, width: int, consumed: bool = True) -> np.ndarray:
    """The first ``width`` elements of the record's ``count`` input vectors (consumed unless told not)."""
    x = m.read((r[CT], r[PE]), r[SRC_BUF], cols=slice(0, width if consumed else 0))
    if x.shape[0] != r[COUNT]:
        raise m.fail(f"count {r[COUNT]} but {buf_name(r[SRC_BUF])} holds {x.shape[0]} vectors")
    if x.shape[1] < width:
        raise m.fail(f"needs {width} input elements, {buf_name(r[SRC_BUF])} holds {x.shape[1]}")
    return x[:, :width]


def smac_rram(m: Machine, r: tuple) -> None:
    pos = (r[CT], r[PE])
    row, xbar = m.crossbar(pos)
    t = m.program.need_tiles()
    if r[ARG] != t.slice[row]:
        raise m.fail(f"names bit slice {r[ARG]} but the crossbar holds slice {t.slice[row]}")
    m.write(pos, r[DST_BUF], m.num.rram(xbar, _input(m, r, int(t.rows[row]))))


def smac_sram(m: Machine, r: tuple) -> None:
    pos, slot = (r[CT], r[PE]), r[ARG]
    row = m.sram_at.get(pos)
    if row is None:
        raise m.fail("no LoRA tile is hosted on this PE")
    t = m.program.need_tiles()
    n_in, n_out = (t.rows[row], t.cols[row]) if t.part[row] == Part.LORA_A else (t.cols[row], t.rows[row])
    masked = m.mask.get(pos, 0) >> slot & 1
    x = _input(m, r, int(n_in), consumed=not masked)  # a masked macro's zero output depends on no input
    m.used_state(("mask", *pos), ("mask", *pos, slot))
    if masked:
        y = np.zeros((x.shape[0], int(n_out)), np.float32)
    else:
        tile = m.sram.get((pos[0], pos[1], slot))
        if tile is None:
            raise m.fail(f"SRAM slot {slot} was never configured")
        y = m.num.sram(tile, x)
        m.used_state(("sram", *pos, slot))
    m.write(pos, r[DST_BUF], y)


def dmac(m: Machine, r: tuple) -> None:
    pos, op, slot, layer = (r[CT], r[PE]), r[ARG] & 0xFF, r[ARG] >> 8, r[LAYER]
    attn = m.model.layers[layer].attention
    hd, grp = attn.head_dim, attn.num_heads // attn.num_kv_heads
    src = m.read(pos, r[SRC_BUF])
    t = src.shape[0]
    if t != m.tokens:
        raise m.fail(f"{buf_name(r[SRC_BUF])} holds {t} vectors, the step has {m.tokens} tokens")
    if op == DmacOp.QK:
        if src.shape[1] < grp * hd:
            raise m.fail(f"queries of {src.shape[1]} elements, the KV group needs {grp * hd}")
        keys, key_pos, _ = m.kv_slot(pos, slot, 0, layer)
        window, ring = m.model.layers[layer].window, m.kv.rings[layer]  # a window shorter than the ring: its last
        live = ops.live_keys(m.step_positions(), key_pos, min(window, ring) if window else ring)
        s = ops.scores(src[:, : grp * hd].reshape(t, grp, hd), keys, live, m.model.attention_scale,
                       m.model.attn_softcap)
        if m.model.alibi_slopes:  # ALiBi: slope_h * key position, the group's heads from its QVEC index
            g = r[SRC_BUF] & 0xFFF
            slopes = np.array(m.model.alibi_slopes[g * grp : (g + 1) * grp], np.float32)
            s = (s + slopes[None, :, None] * key_pos.astype(np.float32)[None, None, :]).astype(np.float32)
        if m.log is not None:
            m.used_kv(pos, slot, np.asarray(live.any(axis=0)))
        m.write(pos, r[DST_BUF], s.reshape(t, -1))
        return
    if op != DmacOp.PV:
        raise m.fail(f"unknown DmacOp {op}")
    if src.shape[1] != grp * m.kv.chunk_tokens:
        raise m.fail(f"scores of {src.shape[1]} elements, expected {grp} heads x {m.kv.chunk_tokens} tokens")
    values, _, _ = m.kv_slot(pos, slot, 1, layer)
    p = ops.partial(src.reshape(t, grp, -1), values)
    if m.log is not None:
        m.used_kv(pos, slot, np.isfinite(src.reshape(t, grp, -1)).any(axis=(0, 1)))
    if r[FLAGS] & Flag.ACCUMULATE:
        p = ops.merge(m.read(pos, r[DST_BUF]).reshape(t, grp, hd + 2), p)
    m.write(pos, r[DST_BUF], p.reshape(t, -1))


# --- ACT ---------------------------------------------------------------------------------------


def _embed(m: Machine, r: tuple) -> None:
    h = m.model.hidden_size
    if r[COUNT] % h:
        raise m.fail(f"count {r[COUNT]} is not a whole number of {h}-element embeddings")
    n = r[COUNT] // h
    if r[FLAGS] & Flag.PREFILL:  # the whole prompt, or its next chunk (codegen{prefill_chunk})
        first = m.prefilled
        if first + n > len(m.prompt):
            raise m.fail(f"prefills tokens {first}..{first + n - 1} but the prompt has {len(m.prompt)}")
        ids, m.position, m.prefilled = m.prompt[first : first + n], first, first + n
    else:
        if n != 1:
            raise m.fail(f"a decode step embeds one token, not {n}")
        seq = _sequence(m, r[SRC_BUF])
        if seq not in m.token:
            raise m.fail(f"embeds the token of sequence {seq}, which no ARGMAX picked")
        ids, m.position = [m.token[seq]], m.next_position[seq]
        m.used_state(("ctl", seq))
    m.tokens = n
    x = m.embed[ids]
    if m.model.embed_scale != 1.0:
        x = x * np.float32(m.model.embed_scale)
    if m.model.positional == Positional.LEARNED:
        if m.pos_embed is None:  # never: load_params reads the table of a model with learned positions
            raise m.fail("the model has learned positions but the weights no position embedding table")
        offset = m.model.num_pos_embeddings - m.model.max_position_embeddings
        x = x + m.pos_embed[offset + m.step_positions()]
    m.write(CTL, r[DST_BUF], x.astype(np.float32))


def _shard(m: Machine, r: tuple) -> tuple[HiddenBuf, int, int]:
    """(kind, first element, elements) of the hub shard a norm or its statistics read."""
    src, n = r[SRC_BUF], r[ARG] >> 8
    if src >> 12 != BufKind.HIDDEN or (src & 0xF) not in HiddenBuf._value2member_map_:
        raise m.fail(f"normalizes {buf_name(src)}, which is no hub shard")
    first = ((src & 0xFFF) >> 4) * m.geo.rram_rows
    if n < 1 or first + n > m.model.hidden_size:
        raise m.fail(f"a shard of {n} elements from element {first} of a {m.model.hidden_size}-element vector")
    return HiddenBuf(src & 0xF), first, n


def _norm_stats(m: Machine, r: tuple) -> None:
    pos = (r[CT], r[PE])
    _, _, n = _shard(m, r)
    x = m.read(pos, r[SRC_BUF])
    if x.shape[1] != n:
        raise m.fail(f"statistics of {n} elements, {buf_name(r[SRC_BUF])} holds {x.shape[1]}")
    stats = ops.norm_stats(x, with_sum=r[ARG] & 0xFF == ActFn.NORM_STATS)
    if r[FLAGS] & Flag.ACCUMULATE:
        stats = (m.read(pos, r[DST_BUF]) + stats).astype(np.float32)
    m.write(pos, r[DST_BUF], stats)


def _norm(m: Machine, r: tuple, fn: ActFn) -> None:
    layer, src, pos = r[LAYER], r[SRC_BUF], (r[CT], r[PE])
    kind, first, n = _shard(m, r)
    which = {HiddenBuf.X: 0, HiddenBuf.MID: 1}.get(kind)
    ir = m.model.layers[layer] if layer < m.model.num_layers else None
    if ir is not None and ir.parallel:  # a parallel block norms its input: X and, for the MLP, RESID
        which = {HiddenBuf.X: 0, HiddenBuf.RESID: ir.num_norms - 1}.get(kind)
    if ir is not None and ir.post_norms and src == r[DST_BUF]:  # sandwich norms, in place on the branches
        which = {HiddenBuf.MID: 2, HiddenBuf.OUT: 3}.get(kind)
    if layer == 0 and src == r[DST_BUF] and kind == HiddenBuf.X and m.model.embed_norm:
        layer, which = -1, 0  # the embedding norm, in place on the first layer's input (Bloom)
    if which is None or (layer == m.model.num_layers and which):
        raise m.fail(f"a norm of {buf_name(src)} has no parameters in layer {layer}")
    scale, bias = m.params.norms[(layer, which)]
    x, total = m.read(pos, src), m.read(pos, hidden(HiddenBuf.TOTAL))
    if x.shape[1] != n or total.shape != (x.shape[0], STATISTICS[fn]):
        raise m.fail(f"normalizes {n} elements with {buf_name(src)} of {x.shape[1]} and statistics {total.shape}")
    h, cut = m.model.hidden_size, slice(first, first + n)
    if fn == ActFn.RMSNORM:
        y = ops.rms_norm(x, scale[cut], total, h, m.model.norm_eps)
    elif bias is None:
        raise m.fail(f"LAYERNORM in layer {layer}, whose norm has no bias (an RMSNorm model)")
    else:
        y = ops.layer_norm(x, scale[cut], bias[cut], total, h, m.model.norm_eps)
    m.write(pos, r[DST_BUF], y)


def _rope(m: Machine, x: np.ndarray, r: tuple) -> np.ndarray:
    """Rotate the q and k elements of a root's block. The crossbars store each head's rotation pairs
    adjacent (``ir.columns``): dimension ``2j`` of a head pairs with ``2j + 1``, turned at frequency ``j``."""
    (role, first), width = root_block(m, r[SRC_BUF]), x.shape[1]
    layer = m.model.layers[r[LAYER]]
    attn, hd = layer.attention, layer.attention.head_dim
    e = first + np.arange(width)
    if role == Role.QKV:
        e = np.where(e < attn.q_size, e, np.where(e < attn.q_size + attn.kv_size, e - attn.q_size, -1))
    elif role not in (Role.Q, Role.K):
        raise m.fail(f"ROPE on a {role.value} root")
    rot = m.model.rope_dim or hd  # partial rotary turns the first rot dimensions of each head
    rotated = (e >= 0) & (e % hd < rot)
    freq = np.where(rotated, e % hd // 2, -1)
    leading = e % 2 == 0
    partner = np.arange(width) + np.where(leading, 1, -1)
    if ((partner < 0) | (partner >= width))[rotated].any():
        raise m.fail(f"a rotation pair straddles the {buf_name(r[SRC_BUF])} column block")
    partner = np.where(rotated, partner, np.arange(width))
    return ops.rope(x, m.step_positions(), freq, partner, leading, m.inv_freq, m.model.rope_attention_scale)


def _bias(m: Machine, r: tuple, x: np.ndarray) -> np.ndarray:
    (role, first), width = root_block(m, r[SRC_BUF]), x.shape[1]
    bias = m.params.bias.get((r[LAYER], role))
    if bias is None or first + width > len(bias):
        raise m.fail(f"layer {r[LAYER]} {role.value} has no bias for elements {first}..{first + width - 1}")
    return x + bias[first : first + width]


def _dora(m: Machine, r: tuple, x: np.ndarray) -> np.ndarray:
    (role, first), width = root_block(m, r[SRC_BUF]), x.shape[1]
    scale = m.params.dora.get((r[LAYER], role))
    if scale is None or first + width > len(scale):
        raise m.fail(f"layer {r[LAYER]} {role.value} has no DoRA column scale for elements {first}..{first + width - 1}")
    return x * scale[first : first + width]


def _qk_norm(m: Machine, r: tuple, x: np.ndarray) -> np.ndarray:
    (role, first), width = root_block(m, r[SRC_BUF]), x.shape[1]
    hd = m.model.layers[r[LAYER]].attention.head_dim
    if role not in (Role.Q, Role.K) or first % hd or width % hd:
        raise m.fail(f"QK_NORM of {buf_name(r[SRC_BUF])}: not whole heads of q or of k")
    return ops.head_rms_norm(x, m.params.norms[(r[LAYER], 4 if role == Role.Q else 5)][0], hd, m.model.norm_eps)


def _argmax(m: Machine, r: tuple) -> None:
    logits = m.read(CTL, r[SRC_BUF])
    if logits.shape != (1, m.model.vocab_size):
        raise m.fail(f"logits of shape {logits.shape}, expected (1, {m.model.vocab_size})")
    seq = _sequence(m, r[DST_BUF])
    step = 0 if r[FLAGS] & Flag.PREFILL else m.request_step.get(seq, 0)  # a prefill starts the sequence's request
    m.logits.append(logits[0].copy())
    m.logit_seq.append(seq)
    forced = m.forced[step] if step < len(m.forced) else None
    m.token[seq] = int(np.argmax(logits[0])) if forced is None else forced
    if m.prefilled not in (0, len(m.prompt)):
        raise m.fail(f"ends the prefill after {m.prefilled} of the prompt's {len(m.prompt)} tokens")
    m.next_position[seq] = m.position + m.tokens
    m.prefilled = 0
    m.steps += 1
    m.request_step[seq] = step + 1
    m.wrote_state(("ctl", seq))
    m.end_step()


def _sequence(m: Machine, tag: int) -> int:
    """The sequence a TOKEN buffer belongs to (a decode EMBED reads it, an ARGMAX writes it)."""
    if tag >> 12 != BufKind.TOKEN:
        raise m.fail(f"names {buf_name(tag)}, not a sequence's TOKEN buffer")
    seq = tag & 0xFFF
    if seq >= m.kv.batch:
        raise m.fail(f"names the token of sequence {seq}; the batch has {m.kv.batch}")
    return seq


def act(m: Machine, r: tuple) -> None:
    fn = r[ARG] & 0xFF
    if fn == ActFn.EMBED:
        return _embed(m, r)
    if fn == ActFn.ARGMAX:
        return _argmax(m, r)
    if fn in (ActFn.RMSNORM, ActFn.LAYERNORM):
        return _norm(m, r, ActFn(fn))
    if fn in STATS_FN.values():
        return _norm_stats(m, r)
    pos = (r[CT], r[PE])
    if fn == ActFn.SWIGLU:
        up = m.read(pos, r[DST_BUF])
        x = m.read(pos, r[SRC_BUF], cols=slice(0, up.shape[1]))  # the gate elements of up's width
        y = ops.activation(m.model.layers[r[LAYER]].activation, x[:, : up.shape[1]]) * up
        m.write(pos, r[DST_BUF], y.astype(np.float32))
        return
    x = m.read(pos, r[SRC_BUF])
    if fn == ActFn.RESIDUAL_ADD:
        other = m.read(pos, r[DST_BUF])
        if other.shape != x.shape:
            raise m.fail(f"adds {buf_name(r[SRC_BUF])} {x.shape} to {buf_name(r[DST_BUF])} {other.shape}")
        branch = m.model.residual_multiplier  # the branch (dst: the O or down roots' blocks) times Granite's
        y = x + (other * np.float32(branch) if branch != 1.0 else other)
    elif fn in (ActFn.SILU, ActFn.GELU, ActFn.RELU, ActFn.RELU_SQUARED):
        kind = {ActFn.SILU: Activation.SILU, ActFn.RELU: Activation.RELU, ActFn.GELU: Activation.GELU,
                ActFn.RELU_SQUARED: Activation.RELU_SQUARED}[ActFn(fn)]
        if fn == ActFn.GELU and m.model.layers[r[LAYER]].activation == Activation.GELU_NEW:
            kind = Activation.GELU_NEW
        y = ops.activation(kind, x)
    elif fn == ActFn.ROPE:
        y = _rope(m, x, r)
    elif fn == ActFn.BIAS:
        y = _bias(m, r, x)
    elif fn == ActFn.DORA:
        y = _dora(m, r, x)
    elif fn == ActFn.SOFTMAX:
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        y = e / e.sum(axis=-1, keepdims=True)
    elif fn == ActFn.LOGIT_CAP:
        y = ops.logit_cap(x, m.model.logit_scale, m.model.logit_softcap)
    elif fn == ActFn.QK_NORM:
        y = _qk_norm(m, r, x)
    elif fn == ActFn.CLIP:
        y = np.clip(x, -np.float32(m.model.qkv_clip), np.float32(m.model.qkv_clip))
    else:
        raise m.fail(f"no functional semantics for ActFn {fn}")
    m.write(pos, r[DST_BUF], y.astype(np.float32))


