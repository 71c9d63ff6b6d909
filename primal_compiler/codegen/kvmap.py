"""KV-cache ring buffer: where every chunk of K and V lives in the router scratchpads.

A layer's cache stays in that layer's own CTs (so SRPG can gate every other
CT while the layer runs; scratchpads are retained while gated). Its context
is cut into chunks of ``chunk_tokens`` tokens. A *unit* is one chunk of K or
V of one sequence and one KV head; units are numbered chunk-major,

    u = ((chunk * batch + seq) * kv_heads + kv_head) * 2 + kind   (kind 0 = K, 1 = V)

and :func:`build_kv_map` deals them out (``kv-ring{placement=spread}``):
the ring pointer advancing through the context walks the layer's routers in
order and crosses into the next CT at a CT boundary. Routers are ordered CT
by CT, and within a CT along a snake of the mesh, so K and V of a chunk sit on
neighbouring routers. Unit ``u`` goes to router ``u % R`` (R routers in the
layer), scratchpad chunk slot ``u // R``: the cache spreads over every router
before any router takes a second chunk. ``placement=near`` moves the same
units next to their roots (:mod:`primal_compiler.codegen.kvnear`); what
follows holds for both. Inside a chunk, token ``t`` is slot
``t``. With ``interleave = "token"`` (the seed's) it goes to bank
``t % banks``, its whole vector in that bank (adjacent tokens in different
banks); with ``"word"`` the chunk is stored contiguously and its bank words
go round the banks in address order. The executor's DMAC cost reads the
layout (``executor/costs.py``, ``bank_lanes``).

Each layer has its own ring (``rings``, tokens): the context, or for a
layer with a sliding window ``w`` the window and one pass less a token,
``w + pass - 1`` rounded up to whole chunks (at most the context), the
fewest positions that keep every key a pass's queries read while that pass
appends its own (:func:`ring_tokens`). A layer's units follow the previous
layer's, so unit ``u`` of layer ``n`` is entry ``starts()[n] + u``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from primal_compiler.errors import InputError


@dataclass(frozen=True, eq=False)
class KvMap:
    """Unit placement of every decoder layer; arrays are indexed ``starts()[layer] + u``."""

    chunk_tokens: int
    context: int  # tokens per sequence the cache holds (a layer without a window: its ring)
    batch: int
    kv_heads: int
    head_dim: int
    kv_bytes: int  # bytes per element
    banks: int
    interleave: str  # one of isa.meta.KV_INTERLEAVES
    chunk_slots: int  # chunk slots per router scratchpad
    rings: tuple[int, ...]  # tokens each layer's ring holds, a multiple of chunk_tokens, at most context
    ct: np.ndarray  # uint16 global CT of each unit
    pe: np.ndarray  # uint16 router (PE) of each unit
    slot: np.ndarray  # uint16 chunk slot within the scratchpad

    @property
    def chunk_bytes(self) -> int:
        return self.chunk_tokens * self.head_dim * self.kv_bytes

    def chunks_of(self, layer: int) -> int:
        """Chunks in ``layer``'s ring."""
        return self.rings[layer] // self.chunk_tokens

    def units_per_layer(self) -> np.ndarray:
        """int64 units of each layer: its chunks x sequences x KV heads x (K, V)."""
        return np.asarray(self.rings, np.int64) // self.chunk_tokens * self.batch * self.kv_heads * 2

    def starts(self) -> np.ndarray:
        """int64 entry of each layer's first unit, and the total units last."""
        return np.concatenate([[0], np.cumsum(self.units_per_layer())]).astype(np.int64)

    def unit_layers(self) -> tuple[np.ndarray, np.ndarray]:
        """(layer, unit within its layer) of every entry, int64."""
        per = self.units_per_layer()
        layer = np.repeat(np.arange(len(per), dtype=np.int64), per)
        return layer, np.arange(len(layer), dtype=np.int64) - self.starts()[layer]

    def unit(self, layer: int, chunk, seq, kv_head, kind) -> np.ndarray:
        """Flat index (into ``ct``/``pe``/``slot``) of the given units of ``layer``; arguments broadcast."""
        u = ((np.asarray(chunk) * self.batch + seq) * self.kv_heads + kv_head) * 2 + kind
        return int(self.starts()[layer]) + np.asarray(u, dtype=np.int64)

    def position(self, pos, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """(chunk, token slot in the chunk) of absolute token positions in ``layer``'s ring; wraps after it."""
        pos = np.asarray(pos, dtype=np.int64) % self.rings[layer]
        return pos // self.chunk_tokens, pos % self.chunk_tokens

    def arrays(self) -> dict[str, np.ndarray]:
        return {"kv_ct": self.ct, "kv_pe": self.pe, "kv_slot": self.slot}


def window_ring(window: int, pass_tokens: int, chunk_tokens: int) -> int:
    """Tokens a sliding layer's ring needs at any context: ``window + pass_tokens - 1`` (a pass's first query
    reads ``window`` keys back while the pass appends ``pass_tokens``, at least 1) in whole chunks."""
    return -(-(window + pass_tokens - 1) // chunk_tokens) * chunk_tokens


def ring_tokens(window: int, context: int, pass_tokens: int, chunk_tokens: int) -> int:
    """Tokens a layer's ring holds: ``context`` without a window (0); with one, :func:`window_ring`, at most
    ``context``."""
    return min(context, window_ring(window, pass_tokens, chunk_tokens)) if window else context


def keys_seen(window: int, ring: int) -> int:
    """How many positions back a query reads in a ring of ``ring`` tokens: its sliding ``window``, or the ring
    when it has none (0) or a longer one."""
    return min(window, ring) if window else ring


def overwriting_layer(kv: KvMap, windows: Sequence[int], starts: np.ndarray, ends: np.ndarray) -> int | None:
    """The first layer in whose ring a pass of positions ``starts[i] .. ends[i]-1`` would append over a key
    one of its own queries reads (the keys its first query sees and the pass's own exceed the ring), or
    None: the condition under which attention (``ring_pairs``) refuses a pass."""
    for n, (ring, w) in enumerate(zip(kv.rings, windows, strict=True)):
        if (np.asarray(ends) - np.maximum(0, np.asarray(starts) - keys_seen(w, ring) + 1) > ring).any():
            return n
    return None


def snake_routers(rows: int, cols: int) -> np.ndarray:
    """PE indices of a ``rows x cols`` mesh in boustrophedon order (neighbours consecutive)."""
    r, c = np.divmod(np.arange(rows * cols), cols)
    c = np.where(r % 2 == 0, c, cols - 1 - c)
    return (r * cols + c).astype(np.int64)


def capacity(scratchpad_bytes: int, reserve_bytes: int, chunk_bytes: int) -> int:
    """Chunk slots per router scratchpad."""
    return max(0, (scratchpad_bytes - reserve_bytes) // chunk_bytes)


def build_kv_map(
    layer_cts: list[np.ndarray], mesh: tuple[int, int], *, chunk_tokens: int, context: int, batch: int,
    kv_heads: int, head_dim: int, kv_bytes: int, scratchpad_bytes: int, reserve_bytes: int, banks: int,
    interleave: str, windows: Sequence[int], pass_tokens: int, where: str,
) -> KvMap:
    """Place every layer's units, its ring :func:`ring_tokens` of its ``windows`` entry (0: none) and
    ``pass_tokens`` (0: the context); InputError naming the layer and the largest context x batch when they
    do not fit."""
    chunk_bytes = chunk_tokens * head_dim * kv_bytes
    per_router = capacity(scratchpad_bytes, reserve_bytes, chunk_bytes)
    if per_router == 0:
        raise InputError(where, f"a chunk of {chunk_tokens} tokens x {head_dim} x {kv_bytes} B = {chunk_bytes} B "
                                f"does not fit a scratchpad's {scratchpad_bytes - reserve_bytes} B for KV")
    rings = tuple(ring_tokens(w, context, pass_tokens or context, chunk_tokens) for w in windows)
    routers_per_ct = mesh[0] * mesh[1]
    empty = np.zeros(0, np.uint16)
    kv = KvMap(chunk_tokens, context, batch, kv_heads, head_dim, kv_bytes, banks, interleave, per_router, rings,
               empty, empty, empty)
    units = kv.units_per_layer()
    held = np.array([len(c) for c in layer_cts], np.int64) * routers_per_ct * per_router
    over = np.flatnonzero(units > held)
    if len(over):
        n, uniform = int(over[0]), len(set(rings)) == 1
        most_tokens, most_batch = limits(kv, held, windows, pass_tokens)
        needs = "per layer" if uniform else f"in layer {n} (its ring of {rings[n]} tokens)"
        raise InputError(where, f"context {context} x batch {batch} needs {units[n]} KV chunks {needs} but "
                                f"{'a layer' if uniform else 'its'}'s {len(layer_cts[n])} CTs hold {held[n]}; "
                                f"largest context at batch {batch} is {most_tokens} tokens, largest batch at "
                                f"context {context} is {most_batch}")
    cts, pes, slots = [], [], []
    snake = snake_routers(*mesh)
    for cts_of_layer, count in zip(layer_cts, units.tolist(), strict=True):
        R = len(cts_of_layer) * routers_per_ct
        if count and (count - 1) // R > np.iinfo(np.uint16).max:
            raise InputError(where, f"{count} KV chunks per layer need more than 65,536 chunk slots per router "
                                    f"(the ISA's 16-bit slot field); use larger chunk_tokens")
        u = np.arange(count, dtype=np.int64)
        router = u % R
        cts.append(np.asarray(cts_of_layer)[router // routers_per_ct])
        pes.append(snake[router % routers_per_ct])
        slots.append(u // R)
    cat = lambda parts: np.concatenate(parts).astype(np.uint16) if parts else empty  # noqa: E731
    return replace(kv, ct=cat(cts), pe=cat(pes), slot=cat(slots))


def limits(kv: KvMap, held: np.ndarray, windows: Sequence[int], pass_tokens: int) -> tuple[int | None, int]:
    """(largest context at ``kv.batch``, largest batch at ``kv.context``) when layer ``n`` holds ``held[n]``
    chunks. A layer with a window binds the context only when its ring (its window and one pass of
    ``pass_tokens``; 0: a pass of the context, so the ring grows with it) does not fit; None when no layer
    binds it (every layer slides, and its ring fits at any context)."""
    per_seq = held // (kv.kv_heads * 2)  # ring chunks a layer holds, all its sequences together
    tokens = per_seq // kv.batch * kv.chunk_tokens
    binds = [t for t, w in zip(tokens.tolist(), windows, strict=True)
             if not w or not pass_tokens or window_ring(w, pass_tokens, kv.chunk_tokens) > t]
    chunks = np.array([kv.chunks_of(n) for n in range(len(held))], np.int64)
    return min(binds, default=None), int((per_seq // chunks).min())


def occupancy(kv: KvMap, layer_cts: list[np.ndarray], mesh: tuple[int, int], scratchpad_bytes: int,
              windows: Sequence[int], pass_tokens: int) -> dict:
    """Fraction of the layers' scratchpad bytes the cache takes, and the limits of this layout."""
    routers = sum(len(c) for c in layer_cts) * mesh[0] * mesh[1]
    units = kv.units_per_layer()
    used = int(units.sum()) * kv.chunk_bytes
    held = np.array([len(c) for c in layer_cts], np.int64) * mesh[0] * mesh[1] * kv.chunk_slots
    most_tokens, most_batch = limits(kv, held, windows, pass_tokens)
    return {
        "units_per_layer": int(units.max(initial=0)),
        "ring_tokens": sorted(set(kv.rings)),
        "chunk_bytes": kv.chunk_bytes,
        "chunk_slots_per_router": kv.chunk_slots,
        "kv_bytes": used,
        "occupancy": used / (routers * scratchpad_bytes) if routers else 0.0,
        "max_tokens_at_batch": most_tokens,
        "max_batch_at_context": most_batch,
    }
