"""Functional semantics of the router and control records: data movement, KV appends, CONFIG, gating.

A router record moves the last ``count`` token vectors of its source buffer
(a hand-off into the LM head moves only the newest token), from element
``src_offset`` to the end of the buffer, into the destination buffer at
``dst_offset`` (offsets from ``arg``, docs/isa.md). ``nbytes`` is the wire
size the cost model charges and plays no part here, except in a UNICAST
from the controller, which holds whole vectors: it sends ``nbytes`` of
activations per vector (a hub shard's slice of the embeddings).

* ``REDUCE SUM`` adds the members' sources (a crossbar's partial sums
  ``PSUM.0`` weighted by ``2 ** (bits_per_cell * slice)`` of the tile on
  that PE) and writes the sum, or adds it to the destination region with
  ``ACCUMULATE``.
* ``REDUCE SOFTMAX_MERGE`` merges the members' attention partials of the
  query heads from ``src_offset / head_dim`` to the end of the KV group and
  writes the normalised outputs from element ``src_offset`` of the group's
  (the head it falls in may have begun in the block before).
* ``KV_APPEND`` writes ``count`` tokens into the token slots
  ``arg & 0xFFFF`` of the destination's K or V chunk, head elements from
  ``(arg >> 24) * 8`` on, as many as the source holds from its offset (a
  head split over two roots comes in two pieces; in hardware mode each
  piece is stored with its own scale); which tokens of the
  step they are follows from the chunk the KV map gives that scratchpad
  slot and the controller's position counter (the NMC's ring pointer), so
  a token at position p lands in ring position ``p mod context``; the slot
  remembers p for the attention mask.
* ``CONFIG`` writes adapter ``arg >> 16``'s LoRA tile hosted on the
  destination PE (as the precision mode stores it) into SRAM slot
  ``arg & 0xFFFF`` and clears that slot's mask bit; ``MASK`` sets the PE's mask register; ``PG_OFF``/``PG_ON`` gate
  and wake a CT (any record using a gated CT is an error); ``SYNC`` orders
  nothing further in a sequential replay.

What each record consumes (for ``Machine(producers=True)``): a move the
vectors and elements it moves; ``REDUCE SUM`` every member's moved elements
(and, with ``ACCUMULATE``, the destination region it adds to); ``REDUCE
SOFTMAX_MERGE`` every member's partials of the heads it merges;
``KV_APPEND`` the elements of the token rows it appends.
``CONFIG`` writes an SRAM slot and that slot's mask bit, ``MASK`` the whole
mask register. Power records and ``SYNC`` consume and produce no value.
"""

from __future__ import annotations

from functools import reduce

import numpy as np

from primal_compiler.functional import ops
from primal_compiler.functional.machine import (
    ARG, COUNT, CT, DST_BUF, DST_CT, DST_PE, FLAGS, GROUP, LAYER, NBYTES, OP, PE, SRC_BUF, Machine,
)
from primal_compiler.isa.opcodes import CONTROLLER, BufKind, Flag, Opcode, ReduceOp, buf, buf_name


def _dst(r: tuple) -> tuple[int, int]:
    return (r[DST_CT], 0) if r[DST_CT] == CONTROLLER else (r[DST_CT], r[DST_PE])


def _vectors(m: Machine, pos: tuple[int, int], tag: int, count: int, offset: int,
             consumed_from: int | None = None, width: int | None = None) -> np.ndarray:
    """The last ``count`` vectors of buffer ``tag`` at ``pos`` from element ``offset`` (``width`` elements of
    them, or to the end); the record consumes them from element ``consumed_from`` (default ``offset``)."""
    first = offset if consumed_from is None else consumed_from
    stop = None if width is None else offset + width
    src = m.read(pos, tag, slice(-count, None), slice(first, stop))
    if count > src.shape[0]:
        raise m.fail(f"moves {count} vectors but its source holds {src.shape[0]}")
    if offset >= src.shape[1] or (stop is not None and stop > src.shape[1]):
        raise m.fail(f"source elements {offset}..{stop or ''} are beyond the {src.shape[1]} elements of its source")
    return src[src.shape[0] - count :, offset:stop]


def _move_args(arg: int) -> tuple[int, int]:
    return (arg >> 16) * 8, (arg & 0xFFFF) * 8


def bcast(m: Machine, r: tuple) -> None:
    so, do = _move_args(r[ARG])
    data = _vectors(m, (r[CT], r[PE]), r[SRC_BUF], r[COUNT], so)
    for member in m.members(r[GROUP]):
        m.write(member, r[DST_BUF], data, do)


def unicast(m: Machine, r: tuple) -> None:
    so, do = _move_args(r[ARG])
    if r[CT] == CONTROLLER:  # the controller holds whole vectors and sends a hub shard its slice
        width = r[NBYTES] // (r[COUNT] * m.model.precision.activation_bits // 8)
        m.write(_dst(r), r[DST_BUF], _vectors(m, (r[CT], 0), r[SRC_BUF], r[COUNT], so, width=width), do)
        return
    m.write(_dst(r), r[DST_BUF], _vectors(m, (r[CT], r[PE]), r[SRC_BUF], r[COUNT], so), do)


def reduce_(m: Machine, r: tuple) -> None:
    arg = r[ARG]
    op, so, do = arg & 0xF, ((arg >> 4) & 0x3FFF) * 8, (arg >> 18) * 8
    members = m.members(r[GROUP])
    merge = op == ReduceOp.SOFTMAX_MERGE  # partials are (hd + 2) wide per head: sliced by head below
    if merge:  # the partials of the merged heads are consumed
        hd = m.model.layers[r[LAYER]].attention.head_dim
        parts = [_vectors(m, p, r[SRC_BUF], r[COUNT], 0, so // hd * (hd + 2)) for p in members]
    else:
        parts = [_vectors(m, p, r[SRC_BUF], r[COUNT], so) for p in members]
    if len({p.shape for p in parts}) != 1:
        raise m.fail(f"its members hold {sorted({p.shape[1] for p in parts})} elements; a reduction needs one width")
    if op == ReduceOp.SUM:
        if r[SRC_BUF] == buf(BufKind.PSUM, 0):
            shift = [2.0 ** (m.num.bits_per_cell * m.tile_slice(p)) for p in members]
            parts = [p * np.float32(s) for p, s in zip(parts, shift)]
        total = reduce(np.add, parts).astype(np.float32)
    elif merge:
        total = _softmax_merge(m, r, parts, so)
    else:
        raise m.fail(f"unknown ReduceOp {op}")
    dst = _dst(r)
    if r[FLAGS] & Flag.ACCUMULATE:
        region = slice(do, do + total.shape[1])
        old = m.read(dst, r[DST_BUF], cols=region)
        if old.shape[0] != total.shape[0] or old.shape[1] < do + total.shape[1]:
            raise m.fail(f"accumulates {total.shape} at offset {do} into {buf_name(r[DST_BUF])} of shape {old.shape}")
        total = old[:, region] + total
    m.write(dst, r[DST_BUF], total, do)


def _softmax_merge(m: Machine, r: tuple, parts: list[np.ndarray], so: int) -> np.ndarray:
    """Normalised outputs of the group from element ``so`` (of head ``so / head_dim``) to its end."""
    attn = m.model.layers[r[LAYER]].attention
    hd, grp = attn.head_dim, attn.num_heads // attn.num_kv_heads
    if so // hd >= grp or parts[0].shape[1] != grp * (hd + 2):
        raise m.fail(f"attention partials of {parts[0].shape[1]} elements do not hold {grp} heads "
                     f"from element offset {so}")
    t = parts[0].shape[0]
    merged = reduce(ops.merge, [p.reshape(t, grp, hd + 2)[:, so // hd :] for p in parts])
    return ops.normalized(merged).reshape(t, -1)[:, so % hd :]


def config(m: Machine, r: tuple) -> None:
    if r[DST_BUF] >> 12 != BufKind.SRAM:
        raise m.fail(f"CONFIG writes {buf_name(r[DST_BUF])}, not an SRAM slot")
    dst, slot, adapter = _dst(r), r[ARG] & 0xFFFF, r[ARG] >> 16
    _, tile = m.sram_block(dst, adapter)
    m.sram[(dst[0], dst[1], slot)] = tile
    m.mask[dst] = m.mask.get(dst, 0) & ~(1 << slot)
    m.wrote_state(("sram", *dst, slot), ("mask", *dst, slot))


def kv_append(m: Machine, r: tuple) -> None:
    kind = {BufKind.KV_K: 0, BufKind.KV_V: 1}.get(r[DST_BUF] >> 12)
    if kind is None:
        raise m.fail(f"KV_APPEND writes {buf_name(r[DST_BUF])}, not a K or V chunk")
    kv, slot = m.kv, r[DST_BUF] & 0xFFF
    token_slot, so, h0, n = r[ARG] & 0xFFFF, (r[ARG] >> 16 & 0xFF) * 8, (r[ARG] >> 24) * 8, r[COUNT]
    t0 = token_slot - slot * kv.chunk_tokens
    if not 0 <= t0 <= kv.chunk_tokens - n:
        raise m.fail(f"token slots {token_slot}..{token_slot + n - 1} are outside chunk slot {slot}")
    values, positions, chunk = m.kv_slot(_dst(r), slot, kind, r[LAYER])
    first = m.position + (chunk * kv.chunk_tokens + t0 - m.position) % kv.rings[r[LAYER]]
    rows = first - m.position + np.arange(n)
    if rows[-1] >= m.tokens:
        raise m.fail(f"ring position {chunk * kv.chunk_tokens + t0} holds no token of this step "
                     f"(positions {m.position}..{m.position + m.tokens - 1})")
    hd = kv.head_dim
    src = m.read((r[CT], r[PE]), r[SRC_BUF], rows, slice(so, so + hd - h0))
    width = min(hd - h0, src.shape[1] - so)  # the rest of the head, or of the root's block
    if h0 >= hd or width <= 0:
        raise m.fail(f"appends head elements from {h0} of {hd}, from offset {so} of a {src.shape[1]}-element buffer")
    values[t0 : t0 + n, h0 : h0 + width] = m.num.kv(src[rows, so : so + width])
    positions[t0 : t0 + n] = first + np.arange(n)
    m.wrote_kv(_dst(r), slot, slice(t0, t0 + n))


def power(m: Machine, r: tuple) -> None:
    if r[OP] == Opcode.PG_OFF:
        m.gated.add(r[CT])
    else:
        m.gated.discard(r[CT])


def mask(m: Machine, r: tuple) -> None:
    m.mask[(r[CT], r[PE])] = r[ARG]
    m.wrote_state(("mask", r[CT], r[PE]))


def sync(m: Machine, r: tuple) -> None:
    """A barrier: a sequential replay already finishes every earlier record first."""

