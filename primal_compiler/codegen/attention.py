"""Attention over the KV ring buffer: appends, split-K scores and a flash-decoding merge.

For each sequence and KV head: the K and V roots append the new tokens' k and
v to the chunk routers the ring pointer gives (KV_APPEND, one record per
chunk written); each Q root multicasts its queries of that group to every K
chunk router holding context (BCAST into ``QVEC``); each K chunk router scores
its tokens (DMAC QK, causal), sends the scores to its V chunk router
(UNICAST), which forms its partial softmax-weighted sum (DMAC PV; a router
holding several chunks of the same head accumulates); the V routers' partials
are merged (REDUCE SOFTMAX_MERGE) into the O-projection input block.
A head whose elements straddle a root's column block (or an O input block)
is moved in one piece per block: two KV_APPENDs (the second writing from
the head element where the first stopped), two query multicasts, two
merges (each carrying the partials of every head it touches).
``count`` of a DMAC is its multiply-accumulates (with ALiBi one more per
score in QK: the head's slope times the key position), of a router record
the token vectors it moves, of a KV_APPEND the tokens it writes.
"""

from __future__ import annotations

import numpy as np

from primal_compiler.codegen.block import Block
from primal_compiler.codegen.kvmap import KvMap, keys_seen
from primal_compiler.codegen.layer import offsets
from primal_compiler.codegen.routes import LayerRoutes
from primal_compiler.ir.model import DecoderLayer, Role
from primal_compiler.ir.tiles import ROLE_INDEX
from primal_compiler.isa.opcodes import BufKind, DmacOp, Flag, Opcode, ReduceOp, buf
from primal_compiler.mapping.traffic import part_root, root_pieces


def reduce_arg(op: ReduceOp, src: int, dst: int) -> int:
    """REDUCE ``arg``: op in bits 0-3, source and destination offsets (8-element units) in 4-17 and 18-31."""
    if src % 8 or dst % 8 or max(src, dst) >= 8 << 14:
        raise ValueError(f"merge offsets {src}/{dst} are not encodable")
    return int(op) | (src // 8) << 4 | (dst // 8) << 18


def kv_append_arg(src: int, first: int) -> int:
    """KV_APPEND ``arg`` without its token slot: source offset in bits 16-23 and the first element of the head
    it writes in bits 24-31 (units of 8)."""
    if src % 8 or first % 8 or max(src, first) >= 8 << 8:
        raise ValueError(f"KV append offsets {src}/{first} are not encodable (multiples of 8 below 2048)")
    return (src // 8) << 16 | (first // 8) << 24


def _root_tag(name: str) -> int:
    _, role, j = name.split(":")
    return buf(BufKind.ROOT, ROLE_INDEX[Role(role)] << 8 | int(j))


def causal_pairs(chunks: np.ndarray, chunk_tokens: int, start: int, tokens: int, window: int = 0) -> np.ndarray:
    """(query, key) pairs with key in each chunk and key <= query, queries at start..start+tokens-1; with a
    ``window``, also key > query - window (a key is seen by the queries before key + window)."""
    k = chunks[:, None] * chunk_tokens + np.arange(chunk_tokens)[None, :]
    end = start + tokens
    last = np.minimum(end, k + window) if window else end
    return np.maximum(last - np.maximum(k, start), 0).sum(axis=1)


def ring_pairs(start: int, tokens: int, window: int, ring: int, chunk_tokens: int) -> np.ndarray:
    """(query, key) pairs per chunk of a ring of ``ring`` tokens, queries at ``start .. start+tokens-1`` each
    reading its keys back ``window`` positions (the ring's length when 0 or longer): position ``k`` sits in
    chunk ``k % ring // chunk_tokens``. ValueError when the pass overwrites a key one of its queries reads."""
    seen, end = keys_seen(window, ring), start + tokens
    if end - max(0, start - seen + 1) > ring:
        raise ValueError(f"{tokens} tokens from position {start} overwrite keys they read in a ring of {ring}")
    absolute = np.arange(max(0, start - seen + 1) // chunk_tokens, (end - 1) // chunk_tokens + 1)
    pairs = causal_pairs(absolute, chunk_tokens, start, tokens, seen)
    return np.bincount(absolute % (ring // chunk_tokens), weights=pairs, minlength=ring // chunk_tokens).astype(np.int64)


class AttentionEmitter:
    def __init__(self, routes: LayerRoutes, layer: DecoderLayer, kv: KvMap, geo, act_bytes: float,
                 alibi: bool = False, softcap_ops: int = 0) -> None:
        self.r, self.ir, self.kv, self.geo, self.act_bytes = routes, layer, kv, geo, act_bytes
        attn = layer.attention
        self.hd, self.grp = attn.head_dim, attn.num_heads // attn.num_kv_heads
        # ALiBi: one more per score, slope x key position; a soft-cap: its operations on every score
        self.score_macs = self.hd + (1 if alibi else 0) + softcap_ops

    def emit(self, start: int, tokens: int, seqs: range) -> Block:
        """Records of sequences ``seqs`` for queries at positions ``start .. start+tokens-1``.

        The layer's ring (``kv.rings``) wraps: a token at position ``p``
        overwrites the slot of ``p - ring``, and the queries read the chunks
        holding their last ``ring`` positions, or a sliding ``window``'s
        last ``window`` when shorter (:func:`ring_pairs`), counting only those
        pairs.
        """
        kv, b, layer = self.kv, Block(), self.r.layer
        pairs = ring_pairs(start, tokens, self.ir.window, kv.rings[layer], kv.chunk_tokens)
        chunks = np.flatnonzero(pairs)  # a sliding window's queries read only the chunks it reaches
        pairs = pairs[chunks]
        written = np.arange(start // kv.chunk_tokens, (start + tokens - 1) // kv.chunk_tokens + 1)
        for seq in seqs:
            for g in range(kv.kv_heads):
                self._append(b, seq, g, written, start, start + tokens)
                self._queries(b, seq, g, chunks, tokens)
                self._chunks(b, seq, g, chunks, pairs, tokens)
                self._merge(b, seq, g, chunks, tokens)
        return b

    def _units(self, seq: int, g: int, chunks: np.ndarray, kind: int):
        u = self.kv.unit(self.r.layer, chunks, seq, g, kind)
        return self.kv.ct[u].astype(np.int64), self.kv.pe[u].astype(np.int64), self.kv.slot[u].astype(np.int64)

    def _append(self, b: Block, seq: int, g: int, written: np.ndarray, start: int, end: int) -> None:
        """KV_APPENDs of positions ``start .. end-1``, one per chunk ``written`` (absolute: position // chunk)."""
        kv = self.kv
        first = np.maximum(written * kv.chunk_tokens, start)
        count = np.minimum((written + 1) * kv.chunk_tokens, end) - first
        for kind, part, tag in ((0, "k", BufKind.KV_K), (1, "v", BufKind.KV_V)):
            ct, pe, slot = self._units(seq, g, written % kv.chunks_of(self.r.layer), kind)
            token_slot = slot * kv.chunk_tokens + first % kv.chunk_tokens
            pieces = root_pieces(self.ir, part, g * self.hd, (g + 1) * self.hd, self.geo.rram_cols)
            for root, off, e, n in pieces:  # a head split over two roots: two pieces
                src = self.r.hub_pos(root)
                d2d = np.where(ct != src[0], Flag.D2D, 0)
                b.add_columns(len(written), op=Opcode.KV_APPEND, ct=src[0], pe=src[1], dst_ct=ct, dst_pe=pe,
                              src_buf=_root_tag(root), dst_buf=int(tag) << 12 | slot, count=count,
                              nbytes=count * n * kv.kv_bytes, arg=kv_append_arg(off, e - g * self.hd) | token_slot,
                              flags=d2d)

    def _queries(self, b: Block, seq: int, g: int, chunks: np.ndarray, tokens: int) -> None:
        ct, pe, _ = self._units(seq, g, chunks, 0)
        members = np.unique(np.stack([ct, pe], 1), axis=0)
        g0 = g * self.grp * self.hd
        for root, off, e, n in root_pieces(self.ir, "q", g0, g0 + self.grp * self.hd, self.geo.rram_cols):
            src = self.r.hub_pos(root)
            grp = b.add_group(members[:, 0], members[:, 1])
            d2d = Flag.D2D if (members[:, 0] != src[0]).any() else 0
            b.add(op=Opcode.BCAST, ct=src[0], pe=src[1], group=grp, src_buf=_root_tag(root),
                  dst_buf=buf(BufKind.QVEC, g), count=tokens, nbytes=int(tokens * n * self.act_bytes),
                  arg=offsets(off, e - g0), flags=d2d)

    def _chunks(self, b: Block, seq: int, g: int, chunks: np.ndarray, pairs: np.ndarray, tokens: int) -> None:
        """Per chunk, in order: QK at the K router, scores to the V router, PV there."""
        kct, kpe, kslot = self._units(seq, g, chunks, 0)
        vct, vpe, vslot = self._units(seq, g, chunks, 1)
        n = len(chunks)
        qk_macs, pv_macs = pairs * self.grp * self.score_macs, pairs * self.grp * self.hd
        key = vct * 65536 + vpe
        _, first = np.unique(key, return_index=True)
        acc = np.full(n, int(Flag.ACCUMULATE))
        acc[first] = 0
        score, attn = buf(BufKind.SCORE, g), buf(BufKind.ATTN, g)
        cols = {
            "op": np.stack([np.full(n, Opcode.DMAC), np.full(n, Opcode.UNICAST), np.full(n, Opcode.DMAC)], 1),
            "ct": np.stack([kct, kct, vct], 1), "pe": np.stack([kpe, kpe, vpe], 1),
            "dst_ct": np.stack([np.full(n, 0xFFFF), vct, np.full(n, 0xFFFF)], 1),
            "dst_pe": np.stack([np.full(n, 0xFFFF), vpe, np.full(n, 0xFFFF)], 1),
            "src_buf": np.stack([np.full(n, buf(BufKind.QVEC, g)), np.full(n, score), np.full(n, score)], 1),
            "dst_buf": np.stack([np.full(n, score), np.full(n, score), np.full(n, attn)], 1),
            "count": np.stack([np.maximum(qk_macs, 1), np.full(n, tokens), np.maximum(pv_macs, 1)], 1),
            "nbytes": np.stack([np.zeros(n, np.int64), pairs * self.grp * self.kv.kv_bytes, np.zeros(n, np.int64)], 1),
            "arg": np.stack([DmacOp.QK | kslot << 8, np.zeros(n, np.int64), DmacOp.PV | vslot << 8], 1),
            "flags": np.stack([np.zeros(n, np.int64), np.where(kct != vct, Flag.D2D, 0), acc], 1),
        }
        b.add_columns(3 * n, **{k: v.ravel() for k, v in cols.items()})

    def _merge(self, b: Block, seq: int, g: int, chunks: np.ndarray, tokens: int) -> None:
        vct, vpe, _ = self._units(seq, g, chunks, 1)
        members = np.unique(np.stack([vct, vpe], 1), axis=0)
        g0 = g * self.grp * self.hd
        for e, n, i, dst_root, heads in merge_pieces(self.ir, g, self.geo.rram_rows, self.geo.rram_cols):
            dst = self.r.hub_pos(dst_root)
            grp = b.add_group(members[:, 0], members[:, 1])
            d2d = Flag.D2D if (members[:, 0] != dst[0]).any() else 0
            b.add(op=Opcode.REDUCE, ct=int(members[0, 0]), pe=int(members[0, 1]), dst_ct=dst[0], dst_pe=dst[1],
                  group=grp, src_buf=buf(BufKind.ATTN, g), dst_buf=buf(BufKind.OBLK, i), count=tokens,
                  nbytes=int(tokens * heads * (self.hd + 2) * 2),
                  arg=reduce_arg(ReduceOp.SOFTMAX_MERGE, e - g0, e - i * self.geo.rram_rows), flags=d2d)


def merge_pieces(layer: DecoderLayer, g: int, rows: int, cols: int) -> list[tuple[int, int, int, str, int]]:
    """The softmax merges of KV head ``g``'s partials: (first element, elements, O input block, the V root
    it lands at, heads it carries) per piece, cut where an O input block ends (a head may feed two)."""
    attn = layer.attention
    hd, grp = attn.head_dim, attn.num_heads // attn.num_kv_heads
    g0, out = g * grp * hd, []
    e = g0
    while e < g0 + grp * hd:
        i = e // rows
        n = min(g0 + grp * hd, (i + 1) * rows) - e
        dst_root = part_root(layer, "v", ((i * rows // hd) // grp) * hd, cols)
        out.append((e, n, i, dst_root, (e + n - 1) // hd - e // hd + 1))
        e += n
    return out


def unit_flows(layer: DecoderLayer, g: int, rows: int, cols: int, act_bytes: float, kv_bytes: int,
               chunks: int) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(root, bytes) of every transfer between a root and one K unit, and one V unit, of KV head ``g`` in a
    decode step over a full ring: the query multicast and the merge (every unit, every step) and the
    append (one chunk in ``chunks`` each step, so 1/``chunks`` of it). The same pieces :class:`AttentionEmitter`
    emits; the score transfer from a K unit to its V unit is not listed (it joins two units)."""
    attn = layer.attention
    hd, grp = attn.head_dim, attn.num_heads // attn.num_kv_heads
    g0 = g * grp * hd
    k_unit = [(root, n * act_bytes) for root, _, _, n in root_pieces(layer, "q", g0, g0 + grp * hd, cols)]
    v_unit: list[tuple[str, float]] = []
    for part, side in (("k", k_unit), ("v", v_unit)):
        side += [(root, n * kv_bytes / chunks) for root, _, _, n in root_pieces(layer, part, g * hd, (g + 1) * hd, cols)]
    v_unit += [(root, heads * (hd + 2) * 2) for _, _, _, root, heads in merge_pieces(layer, g, rows, cols)]
    return k_unit, v_unit
