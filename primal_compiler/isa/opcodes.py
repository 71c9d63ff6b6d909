"""IPCN instruction set: opcodes, sub-operation codes and the 32-byte record.

Every instruction is one fixed-width record of :data:`RECORD`. Fields that an
opcode does not use hold :data:`NONE16` / :data:`NONE32` (all ones). The
meaning, width and legal range of every field is in ``docs/isa.md`` and in
:data:`FIELDS`, which the assembler and the container loader check against.

Data move between named scratchpad buffers: an instruction reads buffer
``src_buf`` at its source router and writes ``dst_buf`` at its destination(s),
so dependencies are read-after-write on (ct, pe, buffer) in stream order.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag

import numpy as np

from primal_compiler.ir.model import NORM_STATISTICS, NormKind

NONE16 = 0xFFFF
NONE32 = 0xFFFFFFFF
CONTROLLER = 0xFFFE  # ``ct`` / ``dst_ct`` value of the near-memory controller (NMC)
ALL_PES = 0xFFFF  # ``pe`` value of a whole-CT instruction (power gating)
REPROGRAM = 0xFFFFFFFE  # ``SYNC`` barrier id of a pass's LoRA reprogramming (an adapter load's is its request's index)
SRAM_SLOTS = 32  # SRAM slots a PE's mask register covers: MASK's 32-bit ``arg`` has a bit per slot


class Opcode(IntEnum):
    """What one record does; router modes are BCAST, REDUCE, UNICAST and CONFIG."""

    BCAST = 0  # router: src buffer at (ct, pe) multicast to every member of ``group``
    REDUCE = 1  # router: members' src buffers combined (``arg``: ReduceOp) into (dst_ct, dst_pe)
    UNICAST = 2  # router: (ct, pe) -> (dst_ct, dst_pe)
    CONFIG = 3  # router: write ``nbytes`` of weights into SRAM slot ``arg`` of (dst_ct, dst_pe)
    SMAC_RRAM = 4  # RRAM-ACIM matrix-vector product of the PE's crossbar, ``count`` vectors
    SMAC_SRAM = 5  # SRAM-DCIM product with LoRA slot ``arg`` of the PE, ``count`` vectors
    DMAC = 6  # activation x activation in the router (``arg``: DmacOp), ``count`` MACs
    ACT = 7  # activation unit (``arg``: ActFn) on ``count`` elements
    KV_APPEND = 8  # (ct, pe) writes k or v of ``count`` tokens into slot ``arg`` of (dst_ct, dst_pe)
    PG_ON = 9  # wake CT ``ct`` (power-gating header on)
    PG_OFF = 10  # gate CT ``ct``: RRAM periphery and router off, SRAM and scratchpad retained
    MASK = 11  # set the LoRA block mask register of (ct, pe): bit s set = SRAM slot s all zero
    SYNC = 12  # barrier ``arg``: later records wait for every earlier record


class ActFn(IntEnum):
    EMBED = 0  # controller: token ids -> FP16 embeddings
    RMSNORM = 1
    LAYERNORM = 2
    SILU = 3
    GELU = 4
    RELU = 5
    SWIGLU = 6  # silu(gate) * up
    ROPE = 7
    SOFTMAX = 8
    RESIDUAL_ADD = 9
    ARGMAX = 10  # controller: next token from the logits
    BIAS = 11  # add the projection's bias to the column block held at a root hub
    NORM_STATS = 12  # a hub shard's LayerNorm statistics (sum, sum of squares per vector); ACCUMULATE adds
    RMS_STATS = 13  # a hub shard's RMSNorm statistics (sum of squares per vector); ACCUMULATE adds
    LOGIT_CAP = 14  # controller: the logits times the model's logit_scale, soft-capped (cap * tanh(x / cap))
    RELU_SQUARED = 15  # relu(x)^2
    CLIP = 16  # a q, k or v root's block clamped to the model's [-qkv_clip, qkv_clip]
    QK_NORM = 17  # each head of a q or k root's block RMS-normalised with the layer's q or k norm weight
    DORA = 18  # a root's column block times its DoRA adapter's column scale (after B is added in, before the bias)


class DmacOp(IntEnum):
    QK = 0  # scores of a query against the keys of one KV chunk
    PV = 1  # softmax-weighted sum of the values of one KV chunk


class ReduceOp(IntEnum):
    SUM = 0  # partial sums (bit slices are shifted by their significance first)
    SOFTMAX_MERGE = 1  # flash-decoding merge of per-chunk (max, sum, partial output)


class Flag(IntFlag):
    PREFILL = 1  # part of the prefill of the prompt (else decode)
    SKIPPED = 2  # LoRA block masked all zero: issued but the macro is not fired
    D2D = 4  # crosses CTs over the die-to-die network
    ACCUMULATE = 8  # REDUCE adds into the destination buffer instead of overwriting it


RECORD = np.dtype(
    [
        ("op", "u1"),
        ("flags", "u1"),
        ("ct", "<u2"),
        ("pe", "<u2"),
        ("dst_ct", "<u2"),
        ("dst_pe", "<u2"),
        ("layer", "<u2"),
        ("src_buf", "<u2"),
        ("dst_buf", "<u2"),
        ("group", "<u4"),
        ("count", "<u4"),
        ("nbytes", "<u4"),
        ("arg", "<u4"),
    ]
)
assert RECORD.itemsize == 32

FIELDS: dict[str, str] = {
    "op": "opcode, one of Opcode",
    "flags": "bit set of Flag",
    "ct": "issuing CT, 0..num_cts-1, or CONTROLLER",
    "pe": "issuing PE, 0..mesh_rows*mesh_cols-1, or ALL_PES for PG_ON/PG_OFF",
    "dst_ct": "destination CT (UNICAST, REDUCE, CONFIG, KV_APPEND) or CONTROLLER, else NONE16",
    "dst_pe": "destination PE, else NONE16",
    "layer": "decoder layer, num_layers for the LM head, NONE16 outside layers",
    "src_buf": "scratchpad buffer read at the source, NONE16 if none",
    "dst_buf": "scratchpad buffer written at the destination(s), NONE16 if none",
    "group": "index into the group table (BCAST, REDUCE), else NONE32",
    "count": "vectors, elements, MACs or tokens processed (>= 1)",
    "nbytes": "bytes moved per destination (router ops, CONFIG, KV_APPEND), else 0",
    "arg": "opcode-specific: ActFn, DmacOp, ReduceOp, SRAM slot, KV slot, mask bits, barrier id",
}


ARG_ENUM_MASK = {Opcode.ACT: 0xFF, Opcode.DMAC: 0xFF, Opcode.REDUCE: 0xF}
"""Bits of ``arg`` holding the ActFn / DmacOp / ReduceOp; a prefill's EMBED keeps its first position above
bit 8, DMAC the KV chunk slot, REDUCE its source and destination offsets above bit 4 (see docs/isa.md)."""


def empty(n: int = 0) -> np.ndarray:
    """``n`` records with every field set to its 'unused' value."""
    rec = np.zeros(n, dtype=RECORD)
    for name in ("dst_ct", "dst_pe", "layer", "src_buf", "dst_buf"):
        rec[name] = NONE16
    rec["group"] = NONE32
    rec["count"] = 1
    return rec


class BufKind(IntEnum):
    """High 4 bits of a 16-bit buffer tag; the low 12 bits index within the kind."""

    HIDDEN = 0  # vectors at hubs, index: shard << 4 | HiddenBuf (the controller's: shard 0, whole vectors)
    ROOT = 1  # column result at a root hub, index: role << 8 | column
    IN = 2  # input block at a tile's PE, index: role
    PSUM = 3  # partial sums of the PE's RRAM tile (LoRA B adds into it), index: role
    LORA_A = 4  # output of a LoRA A tile, index: role << 8 | rank block
    LORA_R = 5  # rank-wide LoRA vector (at its hub and the B hosts), index: role << 8 | rank block
    SCORE = 6  # attention scores of one chunk, index: query head
    ATTN = 7  # attention output (partial at chunk routers, merged at the V root), index: query head
    SRAM = 8  # SRAM-DCIM weight slot written by CONFIG, index: slot
    KV_K = 9  # K chunk in a scratchpad, index: KV slot
    KV_V = 10  # V chunk in a scratchpad, index: KV slot
    QVEC = 11  # queries of one KV group delivered to a chunk router, index: KV head
    PROXY = 12  # a die-to-die delivery into a proxy hub, index: proxy number within the layer
    OBLK = 13  # attention output block feeding the O projection, index: block
    TOKEN = 14  # next token(s) at the controller, ARGMAX writes, a decode EMBED reads; index: first sequence


class HiddenBuf(IntEnum):
    X = 0  # layer input (residual stream)
    X_NORM = 1
    MID = 2  # after attention + residual
    MID_NORM = 3
    OUT = 4  # layer output
    LOGITS = 5
    RESID = 7  # residual copy received at ``mid`` or ``out``
    STATS = 8  # a PE's partial norm statistics over the shards it holds (STATISTICS values), at psum_bits
    TOTAL = 9  # the statistics summed over every shard, at the norm hub and, broadcast, at each shard's PE



def step_ends(records: np.ndarray) -> np.ndarray:
    """bool per record: a controller ARGMAX, the end of a prefill or decode pass (it picks the next token)."""
    return (records["op"] == Opcode.ACT) & (records["arg"] == ActFn.ARGMAX) & (records["ct"] == CONTROLLER)


def buf(kind: BufKind, index: int = 0) -> int:
    """The 16-bit tag of buffer ``index`` of ``kind``; raises when ``index`` needs more than 12 bits."""
    if not 0 <= index < 4096:
        raise ValueError(f"buffer index {index} of {kind.name} exceeds 12 bits")
    return int(kind) << 12 | index


def buf_name(tag: int) -> str:
    """Readable form of a tag, e.g. ``ROOT.0x105``; ``-`` for none."""
    if tag == NONE16:
        return "-"
    return f"{BufKind(tag >> 12).name}.{tag & 0xFFF:#x}"


HIDDEN_SHARDS = 256
"""Shards a hidden vector may be cut into: the shard field of a HIDDEN tag has 8 bits."""


def hidden(kind: HiddenBuf, shard: int = 0) -> int:
    """The tag of ``kind`` of hub shard ``shard`` (elements ``shard x rram.rows ...`` of the hidden vector)."""
    if not 0 <= shard < HIDDEN_SHARDS:
        raise ValueError(f"hub shard {shard} exceeds {HIDDEN_SHARDS - 1}")
    return buf(BufKind.HIDDEN, shard << 4 | int(kind))


NORM_FN = {NormKind.RMS: ActFn.RMSNORM, NormKind.LAYER: ActFn.LAYERNORM}
"""The function that normalises a shard with each norm kind."""

STATS_FN = {NormKind.RMS: ActFn.RMS_STATS, NormKind.LAYER: ActFn.NORM_STATS}
"""The function that gathers a shard's statistics for each norm kind."""

STATISTICS = {fn: NORM_STATISTICS[kind] for table in (STATS_FN, NORM_FN) for kind, fn in table.items()}
"""Values per vector of the statistics a shard function writes (RMS_STATS, NORM_STATS) or reads (RMSNORM,
LAYERNORM): ``ir.model.NORM_STATISTICS`` of its norm kind."""

SHARD_FNS = (ActFn.RMS_STATS, ActFn.NORM_STATS, ActFn.RMSNORM, ActFn.LAYERNORM)
"""ACT functions that work on one hub shard and carry its elements per vector in ``arg`` above bit 8."""
