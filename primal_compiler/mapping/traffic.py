"""Decode-step dataflow of one layer as flows between tiles and hubs.

For a matrix M cut into blocks (i, j): its input hub sends input block i to
every tile of block row i (BCAST); every tile sends its partial sums for
output block j to the column root hub ``root:M:j`` (REDUCE). LoRA A tiles take
the same input (their own BCAST unless their host is an RRAM tile of that
input block) and send rank-wide partial sums to ``lora:M:k``, which feeds
the B tiles, whose outputs join ``root:M:j`` (LORA). A LoRA tile's endpoint
is its host: the RRAM tile whose PE holds it, or itself when it has a PE of
its own. Attention: the query
block's root sends q to the root of its K block (Q.K^T), scores over the
context go from the K root to the V root, and the V root sends the attention
output to the O tiles (ATTN). The new token's k and v are appended to the
cache in the router scratchpads of the PEs holding the projection column that
produced them, spread evenly over its tiles (KV_APPEND, ``kv_bits`` per
element); ``kv-ring`` later fixes the exact slots. Gate roots send to up roots; up (fc1) roots
feed the down (fc2) tiles; O roots and the residual meet at ``mid``; down
roots and the residual meet at ``out``, which hands off to the next layer
(HANDOFF). The LM head's roots send their logits to the controller themselves, so no PE gathers the
vocabulary. Bytes use the model's activation and partial-sum widths.

A flow whose endpoints sit in different CTs becomes one die-to-die transfer
into a proxy hub of the destination CT (one per payload) and local flows
from the proxy.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from primal_compiler.ir.model import NORM_STATISTICS, DecoderLayer, Linear, Model, NormKind, Role
from primal_compiler.ir.tiles import ROLE_CODES, ROLE_INDEX, Part, TileTable


class FlowClass(IntEnum):
    BCAST = 0
    REDUCE = 1
    LORA = 2
    ATTN = 3
    RESIDUAL = 4
    HANDOFF = 5
    KV_APPEND = 6
    NORM = 7  # a shard's norm statistics to the norm hub, and their sum back to every shard


@dataclass(frozen=True)
class Flow:
    src: int | str  # tile row (int) or hub name (str)
    dst: int | str
    bytes: float
    cls: FlowClass
    payload: str  # flows with the same src and payload carry the same data
    stage: str = ""  # dataflow step that emits it: a matrix role, "attn", "kv", "mid", "act" or "out"


def _blk(x: int, size: int) -> int:
    return x // size


class _Builder:
    def __init__(self, model: Model, layer: DecoderLayer, table: TileTable, rows: np.ndarray, geo, context: int):
        self.model, self.layer, self.t, self.geo = model, layer, table, geo
        self.context = min(context, layer.window) if layer.window else context  # the keys a query scores
        self.rows = rows
        self.act = model.precision.activation_bits / 8
        self.psum = model.precision.psum_bits / 8
        self.kv = model.precision.kv_bits / 8
        self.flows: list[Flow] = []
        self.stage = ""

    def tiles(self, role: Role, part: Part) -> np.ndarray:
        t = self.t
        r = self.rows
        return r[(t.role[r] == ROLE_INDEX[role]) & (t.part[r] == part)]

    def add(self, src, dst, nbytes, cls, payload="") -> None:
        self.flows.append(Flow(src, dst, float(nbytes), cls, payload or f"{src}", self.stage))

    def matrix(self, role: Role, in_hub) -> None:
        """BCAST from ``in_hub(i)`` to tiles, REDUCE to roots, and the LoRA path."""
        t = self.t
        self.stage = str(role)
        base = self.tiles(role, Part.BASE)
        for r in base:
            i, j = int(t.brow[r]), int(t.bcol[r])
            self.add(in_hub(i), int(r), t.rows[r] * self.act, FlowClass.BCAST, f"{in_hub(i)}#{i}")
            self.add(int(r), f"root:{role}:{j}", t.cols[r] * self.psum, FlowClass.REDUCE)
        a_tiles, b_tiles = self.tiles(role, Part.LORA_A), self.tiles(role, Part.LORA_B)
        for r in a_tiles:
            i, k, host = int(t.brow[r]), int(t.bcol[r]), int(t.host[r])
            if not (t.part[host] == Part.BASE and t.role[host] == ROLE_INDEX[role] and t.brow[host] == i):
                self.add(in_hub(i), host, t.rows[r] * self.act, FlowClass.LORA, f"{in_hub(i)}#{i}")
            self.add(host, f"lora:{role}:{k}", t.cols[r] * self.psum, FlowClass.LORA)
        for r in b_tiles:
            j, k, host = int(t.brow[r]), int(t.bcol[r]), int(t.host[r])
            self.add(f"lora:{role}:{k}", host, t.cols[r] * self.act, FlowClass.LORA)
            self.add(host, f"root:{role}:{j}", t.rows[r] * self.psum, FlowClass.LORA)

    def part_root(self, part: str, element: int) -> str:
        return part_root(self.layer, part, element, self.geo.rram_cols)

    def attention(self) -> None:
        attn = self.layer.attention
        group = attn.num_heads // attn.num_kv_heads
        self.stage = "attn"
        pairs: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
        for h in range(attn.num_heads):
            q_el, kv_el = h * attn.head_dim, (h // group) * attn.head_dim
            k_v = (self.part_root("k", kv_el), self.part_root("v", kv_el))
            for root, elements in self.pieces("q", q_el, q_el + attn.head_dim):
                pairs[(root, *k_v)][0] += elements * self.act  # q to the K holder, from each root holding part
            pairs[(self.part_root("q", q_el), *k_v)][1] += self.context * self.act  # scores to the V holder
        for (q, k, v), (qb, sb) in pairs.items():
            self.add(q, k, qb, FlowClass.ATTN)
            if sb:  # a second root holding part of a head sends only its q elements
                self.add(k, v, sb, FlowClass.ATTN)
        self.kv_append()

    def kv_append(self) -> None:
        """Each root spreads its new k or v elements over the scratchpads of its column's tiles."""
        attn, t = self.layer.attention, self.t
        self.stage = "kv"
        appends: dict[str, float] = defaultdict(float)
        for g in range(attn.num_kv_heads):
            for kind in ("k", "v"):
                for root, elements in self.pieces(kind, g * attn.head_dim, (g + 1) * attn.head_dim):
                    appends[root] += elements * self.kv
        base = self.rows[t.part[self.rows] == Part.BASE]
        for root, nbytes in appends.items():
            _, role, j = root.split(":")
            col = base[(t.role[base] == ROLE_INDEX[Role(role)]) & (t.bcol[base] == int(j))]
            for r in col:
                self.add(root, int(r), nbytes / len(col), FlowClass.KV_APPEND)

    def pieces(self, part: str, lo: int, hi: int) -> list[tuple[str, int]]:
        """(root, elements) of elements ``lo .. hi-1`` of q, k or v, cut where a root's column block ends."""
        return [(root, n) for root, _, _, n in root_pieces(self.layer, part, lo, hi, self.geo.rram_cols)]

    def o_input(self, i: int) -> str:
        attn = self.layer.attention
        head = (i * self.geo.rram_rows) // attn.head_dim
        group = attn.num_heads // attn.num_kv_heads
        return self.part_root("v", (head // group) * attn.head_dim)

    def build(self) -> list[Flow]:
        layer = self.layer
        for role in (Role.Q, Role.K, Role.V, Role.QKV):
            if layer.linear(role) is not None:
                self.matrix(role, lambda i: f"in:{i}")
        self.norm("in", layer.norm)
        self.attention()
        self.matrix(Role.O, self.o_input)
        self.stage = "mid"
        self.roots_to(Role.O, "mid")
        self.shards_to("in", "mid")
        self.norm("mid", layer.norm)
        if layer.linear(Role.GATE) is not None:
            self.matrix(Role.GATE, lambda i: f"mid:{i}")
            self.matrix(Role.UP, lambda i: f"mid:{i}")
            self.stage = "act"
            self.pair_roots(Role.GATE, Role.UP)
            self.matrix(Role.DOWN, lambda i: f"root:{Role.UP}:{i}")
            self.stage = "out"
            self.roots_to(Role.DOWN, "out")
        else:
            self.matrix(Role.FC1, lambda i: f"mid:{i}")
            self.matrix(Role.FC2, lambda i: f"root:{Role.FC1}:{i}")
            self.stage = "out"
            self.roots_to(Role.FC2, "out")
        self.shards_to("mid", "out")
        if layer.post_norms:  # sandwich norms: the MLP's output normed at ``out`` (the attention's reuses ``mid``'s)
            self.norm("out", layer.norm)
        return self.flows

    def norm(self, hub: str, kind: NormKind) -> None:
        """Each shard of ``hub`` sends its statistics for a ``kind`` norm to ``norm:<hub>``, which sends their
        sum back to every shard (stage ``norm:<hub>``)."""
        stage, self.stage = self.stage, f"norm:{hub}"
        k = NORM_STATISTICS[kind]
        for i in range(shards(self.model.hidden_size, self.geo.rram_rows)):
            self.add(f"{hub}:{i}", f"norm:{hub}", k * self.psum, FlowClass.NORM, f"stats:{hub}:{i}")
            self.add(f"norm:{hub}", f"{hub}:{i}", k * self.psum, FlowClass.NORM)
        self.stage = stage

    def shards_to(self, src: str, dst: str) -> None:
        """The residual: shard i of ``src`` to shard i of ``dst``."""
        h, s = self.model.hidden_size, self.geo.rram_rows
        for i in range(shards(h, s)):
            self.add(f"{src}:{i}", f"{dst}:{i}", min(s, h - i * s) * self.act, FlowClass.RESIDUAL)

    def roots_to(self, role: Role, hub: str) -> None:
        """Each root's column block to the shards of ``hub`` it overlaps."""
        lin, c, s = _linear(self.layer, role), self.geo.rram_cols, self.geo.rram_rows
        for j in range(-(-lin.out_features // c)):
            lo, hi = j * c, min((j + 1) * c, lin.out_features)
            for i in range(lo // s, -(-hi // s)):
                n = min(hi, (i + 1) * s) - max(lo, i * s)
                self.add(f"root:{role}:{j}", f"{hub}:{i}", n * self.act, FlowClass.RESIDUAL, f"root:{role}:{j}@{i}")

    def pair_roots(self, a: Role, b: Role) -> None:
        lin = _linear(self.layer, a)
        for j in range(-(-lin.out_features // self.geo.rram_cols)):
            n = min(self.geo.rram_cols, lin.out_features - j * self.geo.rram_cols)
            self.add(f"root:{a}:{j}", f"root:{b}:{j}", n * self.act, FlowClass.RESIDUAL)




def shards(hidden_size: int, rows: int) -> int:
    """Shards a hub's hidden vector is cut into: one per ``rows``-element input block of the crossbars."""
    return -(-hidden_size // rows)


def _linear(layer: DecoderLayer, role: Role) -> Linear:
    """The ``role`` projection the layer's dataflow needs (ValueError naming it if the layer has none)."""
    lin = layer.linear(role)
    if lin is None:
        raise ValueError(f"layer {layer.index} has no {role.value} projection")
    return lin


def part_root(layer: DecoderLayer, part: str, element: int, cols: int) -> str:
    """Root hub holding ``element`` of the q, k or v output (fused QKV aware)."""
    attn = layer.attention
    if layer.linear(Role.QKV) is not None:
        offset = {"q": 0, "k": attn.q_size, "v": attn.q_size + attn.kv_size}[part]
        return f"root:{Role.QKV}:{_blk(offset + element, cols)}"
    role = {"q": Role.Q, "k": Role.K, "v": Role.V}[part]
    return f"root:{role}:{_blk(element, cols)}"


def root_pieces(layer: DecoderLayer, part: str, lo: int, hi: int, cols: int) -> list[tuple[str, int, int, int]]:
    """Elements ``lo .. hi-1`` of q, k or v cut where a root's column block ends: (root, offset in the root,
    first element, elements) per piece, in order (a head straddling two blocks is two pieces)."""
    out, e = [], lo
    while e < hi:
        off = root_offset(layer, part, e, cols)
        n = min(hi - e, cols - off)
        out.append((part_root(layer, part, e, cols), off, e, n))
        e += n
    return out


def root_offset(layer: DecoderLayer, part: str, element: int, cols: int) -> int:
    """Element offset of ``element`` of q, k or v inside its root's column block."""
    attn = layer.attention
    base = 0
    if layer.linear(Role.QKV) is not None:
        base = {"q": 0, "k": attn.q_size, "v": attn.q_size + attn.kv_size}[part]
    return (base + element) % cols


def layer_flows(model: Model, layer_index: int, table: TileTable, rows: np.ndarray, geo, context: int) -> list[Flow]:
    """Flows of one decode step of ``layer_index`` (the LM head when it equals num_layers)."""
    if layer_index == model.num_layers:
        return _head_flows(model, table, rows, geo)
    return _Builder(model, model.layers[layer_index], table, rows, geo, context).build()


def _head_flows(model: Model, table: TileTable, rows: np.ndarray, geo) -> list[Flow]:
    """The final norm over the shards of ``in`` and the LM head's matrix from them; each root then sends
    its block of logits to the controller, which is no endpoint of the mapping (codegen emits those
    transfers)."""
    b = _Builder(model, model.layers[-1], table, rows, geo, 0)
    b.matrix(Role.LM_HEAD, lambda i: f"in:{i}")
    b.norm("in", model.norm)
    return b.flows


def role_name(code: int) -> str:
    return ROLE_CODES[code].value
