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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from primal_compiler.errors import InputError


@dataclass(frozen=True, eq=False)
class KvMap:
    """Unit placement of every decoder layer; arrays are indexed ``layer * units + u``."""

    chunk_tokens: int
    context: int  # tokens per sequence the cache holds
    batch: int
    kv_heads: int
    head_dim: int
    kv_bytes: int  # bytes per element
    banks: int
    interleave: str  # one of isa.schema.KV_INTERLEAVES
    chunk_slots: int  # chunk slots per router scratchpad
    ct: np.ndarray  # uint16 global CT of each unit
    pe: np.ndarray  # uint16 router (PE) of each unit
    slot: np.ndarray  # uint16 chunk slot within the scratchpad

    @property
    def chunks(self) -> int:
        return self.context // self.chunk_tokens

    @property
    def units(self) -> int:
        return self.chunks * self.batch * self.kv_heads * 2

    @property
    def chunk_bytes(self) -> int:
        return self.chunk_tokens * self.head_dim * self.kv_bytes

    def unit(self, layer, chunk, seq, kv_head, kind) -> np.ndarray:
        """Flat index (into ``ct``/``pe``/``slot``) of the given units; arguments broadcast."""
        u = ((np.asarray(chunk) * self.batch + seq) * self.kv_heads + kv_head) * 2 + kind
        return np.asarray(layer, dtype=np.int64) * self.units + u

    def position(self, pos) -> tuple[np.ndarray, np.ndarray]:
        """(chunk, token slot in the chunk) of absolute token positions; wraps after ``context``."""
        pos = np.asarray(pos, dtype=np.int64) % self.context
        return pos // self.chunk_tokens, pos % self.chunk_tokens

    def arrays(self) -> dict[str, np.ndarray]:
        return {"kv_ct": self.ct, "kv_pe": self.pe, "kv_slot": self.slot}


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
    interleave: str, where: str,
) -> KvMap:
    """Place every layer's units; InputError naming the largest context x batch when they do not fit."""
    chunk_bytes = chunk_tokens * head_dim * kv_bytes
    per_router = capacity(scratchpad_bytes, reserve_bytes, chunk_bytes)
    if per_router == 0:
        raise InputError(where, f"a chunk of {chunk_tokens} tokens x {head_dim} x {kv_bytes} B = {chunk_bytes} B "
                                f"does not fit a scratchpad's {scratchpad_bytes - reserve_bytes} B for KV")
    chunks = context // chunk_tokens
    units = chunks * batch * kv_heads * 2
    routers_per_ct = mesh[0] * mesh[1]
    fewest = min(len(c) for c in layer_cts)
    held = fewest * routers_per_ct * per_router
    if units > held:
        per_seq = held // (kv_heads * 2)
        raise InputError(where, f"context {context} x batch {batch} needs {units} KV chunks per layer but a layer's "
                                f"{fewest} CTs hold {held}; largest context at batch {batch} is "
                                f"{per_seq // batch * chunk_tokens} tokens, largest batch at context {context} is "
                                f"{per_seq // chunks}")
    if units and (units - 1) // (fewest * routers_per_ct) > np.iinfo(np.uint16).max:
        raise InputError(where, f"{units} KV chunks per layer need more than 65,536 chunk slots per router (the "
                                f"ISA's 16-bit slot field); use larger chunk_tokens")
    snake = snake_routers(*mesh)
    u = np.arange(units, dtype=np.int64)
    cts, pes, slots = [], [], []
    for cts_of_layer in layer_cts:
        R = len(cts_of_layer) * routers_per_ct
        router = u % R
        cts.append(np.asarray(cts_of_layer)[router // routers_per_ct])
        pes.append(snake[router % routers_per_ct])
        slots.append(u // R)
    cat = lambda parts: np.concatenate(parts).astype(np.uint16) if parts else np.zeros(0, np.uint16)
    return KvMap(chunk_tokens, context, batch, kv_heads, head_dim, kv_bytes, banks, interleave, per_router,
                 cat(cts), cat(pes), cat(slots))


def occupancy(kv: KvMap, layer_cts: list[np.ndarray], mesh: tuple[int, int], scratchpad_bytes: int) -> dict:
    """Fraction of the layers' scratchpad bytes the cache takes, and the limits of this layout."""
    routers = sum(len(c) for c in layer_cts) * mesh[0] * mesh[1]
    used = kv.units * len(layer_cts) * kv.chunk_bytes
    fewest = min(len(c) for c in layer_cts) * mesh[0] * mesh[1] * kv.chunk_slots
    per_seq_chunks = fewest // (kv.kv_heads * 2)
    return {
        "units_per_layer": kv.units,
        "chunk_bytes": kv.chunk_bytes,
        "chunk_slots_per_router": kv.chunk_slots,
        "kv_bytes": used,
        "occupancy": used / (routers * scratchpad_bytes) if routers else 0.0,
        "max_tokens_at_batch": per_seq_chunks // kv.batch * kv.chunk_tokens,
        "max_batch_at_context": per_seq_chunks // kv.chunks,
    }
