"""Records of one layer's projections, norms, activations and residuals, per token vector.

Every matrix stage is: input BCASTs (hub -> the tiles of each block row), one
SMAC_RRAM per crossbar tile, the LoRA path (A tiles' SMAC_SRAM, REDUCE to the
rank hub, BCAST to the B hosts, their SMAC_SRAM) and the column REDUCEs to the
root hubs, B's output added in with an accumulating REDUCE, then a DoRA
adapter's column scale (ACT DORA at each root) and the bias (ACT BIAS) when
the projection has them. Every router
record is one leg of a flow of :mod:`primal_compiler.mapping.traffic` (see
:mod:`primal_compiler.codegen.routes`); attention and KV flows are emitted by
:mod:`primal_compiler.codegen.attention` instead. Counts and byte sizes are per
token vector; the caller scales them by a phase's vectors. Router ``arg`` is
``src_offset << 16 | dst_offset`` in units of 8 elements; REDUCE ``arg`` is
its ReduceOp; ACT ``arg`` its ActFn.
"""

from __future__ import annotations

from collections import defaultdict

from primal_compiler.codegen.block import Block
from primal_compiler.codegen.routes import Leg, LayerRoutes
from primal_compiler.ir.model import Activation, NormKind, Positional, Role
from primal_compiler.ir.tiles import ROLE_INDEX, Macro, Part
from primal_compiler.isa.opcodes import (
    CONTROLLER, NORM_FN, SHARD_FNS, STATS_FN, ActFn, BufKind, Flag, HiddenBuf, Opcode, ReduceOp, buf, hidden,
)
from primal_compiler.mapping.traffic import FlowClass, shards

MLP_FN = {Activation.GELU: ActFn.GELU, Activation.GELU_NEW: ActFn.GELU, Activation.RELU: ActFn.RELU,
          Activation.RELU_SQUARED: ActFn.RELU_SQUARED, Activation.SILU: ActFn.SILU}
NORMED = {HiddenBuf.X: HiddenBuf.X_NORM, HiddenBuf.MID: HiddenBuf.MID_NORM}


def offsets(src: int, dst: int) -> int:
    """Router ``arg`` for element offsets ``src`` and ``dst`` (multiples of 8 below 2**19)."""
    if src % 8 or dst % 8 or max(src, dst) >= 8 << 16:
        raise ValueError(f"element offsets {src}/{dst} are not encodable (multiples of 8 below 524288)")
    return (src // 8) << 16 | dst // 8


def _hub_index(name: str) -> int:
    _, role, j = name.split(":")[:3]
    return ROLE_INDEX[Role(role)] << 8 | int(j)


def _shard(name: str) -> int:
    return int(name.rsplit(":", 1)[1])


class LayerEmitter:
    """Builds ``pre`` (norm, Q/K/V, RoPE) and ``post`` (O, residual, MLP) blocks of one layer."""

    def __init__(self, routes: LayerRoutes, model, geo, zero) -> None:
        self.r, self.model, self.t, self.zero = routes, model, routes.t, zero
        self.geo_rows, self.geo_cols = geo.rram_rows, geo.rram_cols
        self.shards = shards(model.hidden_size, geo.rram_rows)
        self.head = routes.layer == model.num_layers
        self.ir = model.layers[min(routes.layer, model.num_layers - 1)]
        self.proxies: dict[tuple[int, str], int] = {}
        self.written: set[tuple] = set()
        self.lora_input: set[int] = set()
        self.b = Block()

    # --- buffers ---------------------------------------------------------------------------------
    def _proxy_buf(self, pos, name: str) -> int:
        return buf(BufKind.PROXY, self.proxies.setdefault((pos[0], name), len(self.proxies)))

    def src_buf(self, leg: Leg) -> tuple[int, int]:
        """(tag, element offset) the leg reads at its source."""
        f, src = leg.flow, leg.src
        if isinstance(src, str) and src.startswith("proxy:"):
            return self._proxy_buf(leg.src_pos, src), 0
        if not isinstance(src, str):
            if f.cls == FlowClass.REDUCE:
                return buf(BufKind.PSUM, 0), 0
            if str(f.dst).startswith("lora:"):
                return buf(BufKind.LORA_A, _hub_index(str(f.dst))), 0
            return buf(BufKind.PSUM, 1), 0
        if f.cls == FlowClass.NORM:
            return hidden(HiddenBuf.TOTAL if src.startswith("norm:") else HiddenBuf.STATS), 0
        if src.startswith(("in:", "mid:")):
            held = HiddenBuf.X if src.startswith("in:") else HiddenBuf.MID
            return hidden(held if f.cls == FlowClass.RESIDUAL else NORMED[held], _shard(src)), 0
        if f.cls == FlowClass.RESIDUAL and src.startswith("root:") and str(f.dst).startswith(("mid:", "out:")):
            j, i = _shard(src), _shard(str(f.dst))
            return buf(BufKind.ROOT, _hub_index(src)), max(0, i * self.geo_rows - j * self.geo_cols)
        if src.startswith("root:") and f.stage == str(Role.O):  # the attention output, merged at a V root
            return buf(BufKind.OBLK, int(f.payload.rsplit("#", 1)[1])), 0
        kind = BufKind.ROOT if src.startswith("root:") else BufKind.LORA_R
        return buf(kind, _hub_index(src)), 0

    def dst_buf(self, leg: Leg) -> tuple[int, int]:
        """(tag, element offset) the leg writes at its destination."""
        f, dst = leg.flow, leg.dst
        if isinstance(dst, str) and dst.startswith("proxy:"):
            return self._proxy_buf(leg.dst_pos, dst), 0
        if not isinstance(dst, str):
            if f.cls == FlowClass.LORA and str(f.src).startswith("lora:"):
                return buf(BufKind.LORA_R, _hub_index(str(f.src))), 0
            if f.cls == FlowClass.LORA:
                self.lora_input.add(int(dst))
                return buf(BufKind.IN, 1), 0
            return buf(BufKind.IN, 0), 0
        if f.cls == FlowClass.NORM:
            return hidden(HiddenBuf.TOTAL), 0
        if f.cls == FlowClass.RESIDUAL:
            if str(f.src).startswith(("in:", "mid:")):
                return hidden(HiddenBuf.RESID, _shard(dst)), 0
            if dst.startswith(("mid:", "out:")):
                j, i = _shard(str(f.src)), _shard(dst)
                into = HiddenBuf.MID if dst.startswith("mid:") else HiddenBuf.OUT
                return hidden(into, i), max(0, j * self.geo_cols - i * self.geo_rows)
            return buf(BufKind.ROOT, _hub_index(str(f.src))), 0  # gate root -> up root
        kind = BufKind.ROOT if dst.startswith("root:") else BufKind.LORA_R
        return buf(kind, _hub_index(dst)), 0

    # --- routing ---------------------------------------------------------------------------------
    def route(self, flows) -> None:
        """Die-to-die UNICASTs, then on-CT BCAST / REDUCE / UNICAST records grouped per source or sink."""
        inter, local = self.r.legs(flows)
        for leg in inter:
            (sb, so), (db, do) = self.src_buf(leg), self.dst_buf(leg)
            self.unicast(leg, sb, db, offsets(so, do), Flag.D2D)
        bcasts: dict[tuple, list[Leg]] = defaultdict(list)
        reduces: dict[tuple, list[Leg]] = defaultdict(list)
        for leg in local:
            (sb, so), (db, do) = self.src_buf(leg), self.dst_buf(leg)
            if leg.flow.cls == FlowClass.RESIDUAL:
                self.unicast(leg, sb, db, offsets(so, do), 0)
            elif isinstance(leg.dst, str) and not str(leg.flow.src).startswith("norm:"):  # not a norm's total
                reduces[leg.dst_pos, db, sb].append(leg)
            else:
                bcasts[leg.src_pos, sb, so, db].append(leg)
        for (pos, sb, so, db), legs in bcasts.items():
            members = sorted({leg.dst_pos for leg in legs})
            g = self.b.add_group([m[0] for m in members], [m[1] for m in members])
            self.b.add(op=Opcode.BCAST, ct=pos[0], pe=pos[1], group=g, src_buf=sb, dst_buf=db,
                       nbytes=int(max(x.nbytes for x in legs)), arg=offsets(so, 0))
        for (pos, db, sb), legs in reduces.items():
            members = sorted({leg.src_pos for leg in legs})
            g = self.b.add_group([m[0] for m in members], [m[1] for m in members])
            flags = Flag.ACCUMULATE if (pos, db) in self.written else 0
            self.written.add((pos, db))
            self.b.add(op=Opcode.REDUCE, ct=members[0][0], pe=members[0][1], dst_ct=pos[0], dst_pe=pos[1],
                       group=g, src_buf=sb, dst_buf=db, nbytes=int(max(x.nbytes for x in legs)),
                       arg=ReduceOp.SUM, flags=flags)

    def unicast(self, leg: Leg, sb: int, db: int, arg: int, flags: int) -> None:
        self.b.add(op=Opcode.UNICAST, ct=leg.src_pos[0], pe=leg.src_pos[1], dst_ct=leg.dst_pos[0],
                   dst_pe=leg.dst_pos[1], src_buf=sb, dst_buf=db, nbytes=int(leg.nbytes), arg=arg, flags=flags)

    def act(self, pos, fn: ActFn, src: int, dst: int, count: int, flags: int = 0) -> None:
        """``fn`` on ``count`` elements per vector; a shard's norm and statistics carry its elements above bit 8."""
        arg = int(fn) | (count << 8 if fn in SHARD_FNS else 0)
        self.b.add(op=Opcode.ACT, ct=pos[0], pe=pos[1], src_buf=src, dst_buf=dst, count=count, arg=arg, flags=flags)

    def shard_sizes(self) -> list[tuple[int, int]]:
        """(shard, elements) of every hub shard: ``rram.rows`` elements each, the last one partial."""
        h, s = self.model.hidden_size, self.geo_rows
        return [(i, min(s, h - i * s)) for i in range(self.shards)]

    def norm(self, hub: str, src: HiddenBuf, dst: HiddenBuf, kind: NormKind) -> None:
        """A ``kind`` norm of the vector held by the shards of ``hub``, distributed: every shard's statistics (its PE's
        second and later shards accumulate into the first's), summed at ``norm:<hub>`` and broadcast back to
        each PE holding a shard (one NORM flow per PE each way), then every shard normalised with the total."""
        at: dict[tuple[int, int], str] = {}
        for i, n in self.shard_sizes():
            pos = self.r.hub_pos(f"{hub}:{i}")
            self.act(pos, STATS_FN[kind], hidden(src, i), hidden(HiddenBuf.STATS), n,
                     Flag.ACCUMULATE if pos in at else 0)
            at.setdefault(pos, f"{hub}:{i}")
        first = set(at.values())
        flows = self.stage(f"norm:{hub}")
        self.written = {w for w in self.written if w[1] != hidden(HiddenBuf.TOTAL)}
        self.route([f for f in flows if f.src in first])
        self.route([f for f in flows if f.dst in first])
        for i, n in self.shard_sizes():
            self.act(self.r.hub_pos(f"{hub}:{i}"), NORM_FN[kind], hidden(src, i), hidden(dst, i), n)

    def residual_add(self, hub: str, dst: HiddenBuf) -> None:
        """Every shard of ``hub`` adds the residual it received (RESID) into ``dst``."""
        for i, n in self.shard_sizes():
            self.act(self.r.hub_pos(f"{hub}:{i}"), ActFn.RESIDUAL_ADD, hidden(HiddenBuf.RESID, i), hidden(dst, i), n)

    # --- stages ----------------------------------------------------------------------------------
    def matrix(self, role: Role, flows) -> None:
        t, rows = self.t, self.r.rows
        mine = rows[t.role[rows] == ROLE_INDEX[role]]
        is_int = lambda e: not isinstance(e, str)  # noqa: E731
        inputs = [f for f in flows if f.cls == FlowClass.BCAST or (f.cls == FlowClass.LORA and is_int(f.dst)
                                                                    and not str(f.src).startswith("lora:"))]
        a_out = [f for f in flows if f.cls == FlowClass.LORA and is_int(f.src) and str(f.dst).startswith("lora:")]
        r_in = [f for f in flows if f.cls == FlowClass.LORA and str(f.src).startswith("lora:")]
        b_out = [f for f in flows if f.cls == FlowClass.LORA and is_int(f.src) and str(f.dst).startswith("root:")]
        self.route(inputs)
        for r in mine[t.macro[mine] == Macro.RRAM]:
            ct, pe = self.r.tile_pos(int(r))
            self.b.add(op=Opcode.SMAC_RRAM, ct=ct, pe=pe, src_buf=buf(BufKind.IN, 0), dst_buf=buf(BufKind.PSUM, 0),
                       arg=int(t.slice[r]))
        self.lora_smac(mine, Part.LORA_A, role)
        self.route(a_out)
        self.route(r_in)
        self.lora_smac(mine, Part.LORA_B, role)
        self.route([f for f in flows if f.cls == FlowClass.REDUCE])
        self.route(b_out)
        lora = None if self.head else self.ir.linear(role).lora
        fns = [ActFn.DORA] if lora is not None and lora.dora else []
        fns += [ActFn.BIAS] if (self.model.lm_head_bias if self.head else self.ir.linear(role).bias) else []
        for fn in fns:
            for name, pos, n in self.roots(role):
                tag = buf(BufKind.ROOT, _hub_index(name))
                self.act(pos, fn, tag, tag, n)

    def lora_smac(self, mine, part: Part, role: Role) -> None:
        t = self.t
        for r in mine[t.part[mine] == part]:
            ct, pe = self.r.tile_pos(int(r))
            k = ROLE_INDEX[role] << 8 | int(t.bcol[r])
            if part == Part.LORA_A:
                src, dst = buf(BufKind.IN, 1 if int(t.host[r]) in self.lora_input else 0), buf(BufKind.LORA_A, k)
            else:
                src, dst = buf(BufKind.LORA_R, k), buf(BufKind.PSUM, 1)
            flags = Flag.SKIPPED if self.zero[r] == 1 else 0
            self.b.add(op=Opcode.SMAC_SRAM, ct=ct, pe=pe, src_buf=src, dst_buf=dst, arg=0, flags=flags)

    def roots(self, role: Role) -> list[tuple[str, tuple[int, int], int]]:
        """(hub, position, elements) of each root of ``role``: a column block, the last one partial."""
        out = self.model.vocab_size if self.head else self.ir.linear(role).out_features
        c = self.geo_cols
        return [(f"root:{role}:{j}", self.r.hub_pos(f"root:{role}:{j}"), min(c, out - j * c)) for j in range(-(-out // c))]

    def stage(self, name: str) -> list:
        return [f for f in self.r.flows if f.stage == name]

    def embed_norm(self) -> Block:
        """Layer 0's input normed in place at its shards (a model with ``embed_norm``, Bloom)."""
        self.b = Block()
        self.norm("in", HiddenBuf.X, HiddenBuf.X, self.model.norm)
        return self.b

    def pre(self) -> Block:
        """Norm at ``in``, then Q, K, V (or fused QKV) and RoPE on the q and k roots."""
        self.b = Block()
        norm = self.model.norm if self.head else self.ir.norm  # the head's is the final norm
        self.norm("in", HiddenBuf.X, HiddenBuf.X_NORM, norm)
        if self.head:
            self.matrix(Role.LM_HEAD, self.stage(str(Role.LM_HEAD)))
            return self.b
        qkv = [r for r in (Role.Q, Role.K, Role.V, Role.QKV) if self.ir.linear(r) is not None]
        for role in qkv:
            self.matrix(role, self.stage(str(role)))
            fns = [ActFn.CLIP] if self.model.qkv_clip else []  # OLMo: each root's block clamped, after its bias
            fns += [ActFn.QK_NORM] if self.ir.qk_norm and role in (Role.Q, Role.K) else []  # Qwen3: its heads normed
            for fn, (name, pos, n) in ((fn, root) for fn in fns for root in self.roots(role)):  # before RoPE
                self.act(pos, fn, buf(BufKind.ROOT, _hub_index(name)), buf(BufKind.ROOT, _hub_index(name)), n)
        if self.model.positional == Positional.ROPE and self.ir.rope:  # a NoPE layer turns nothing
            for role in [r for r in qkv if r in (Role.Q, Role.K, Role.QKV)]:
                for name, pos, n in self.roots(role):
                    tag = buf(BufKind.ROOT, _hub_index(name))
                    self.act(pos, ActFn.ROPE, tag, tag, n)
        return self.b

    def post(self) -> Block:
        """O, the attention residual and norm at ``mid``, the MLP, the output residual at ``out`` (the LM head:
        each root's logits to the controller, at its block's offset of ``LOGITS``). A parallel
        block's MLP norms the layer input that reaches ``mid`` as the residual, before the attention's
        output is added to it; ``out`` then adds the MLP's output to that sum."""
        self.b = Block()
        if self.head:  # every root sends its block of logits to the controller: no PE gathers the vocabulary
            psum = self.model.precision.psum_bits / 8
            for j, (name, pos, n) in enumerate(self.roots(Role.LM_HEAD)):
                self.b.add(op=Opcode.UNICAST, ct=pos[0], pe=pos[1], dst_ct=CONTROLLER, dst_pe=0,
                           src_buf=buf(BufKind.ROOT, _hub_index(name)), dst_buf=hidden(HiddenBuf.LOGITS),
                           nbytes=int(n * psum), arg=offsets(0, j * self.geo_cols), flags=Flag.D2D)
            return self.b
        self.matrix(Role.O, self.stage(str(Role.O)))
        self.route(self.stage("mid"))
        if self.ir.post_norms:  # sandwich: the attention's output normed in place before its residual add
            self.norm("mid", HiddenBuf.MID, HiddenBuf.MID, self.ir.norm)
        if self.ir.parallel:  # the MLP reads the layer input (RESID here), not the attention's sum
            self.norm("mid", HiddenBuf.RESID, HiddenBuf.MID_NORM, self.ir.norm)
        self.residual_add("mid", HiddenBuf.MID)
        if not self.ir.parallel:
            self.norm("mid", HiddenBuf.MID, HiddenBuf.MID_NORM, self.ir.norm)
        if self.ir.linear(Role.GATE) is not None:
            self.matrix(Role.GATE, self.stage(str(Role.GATE)))
            self.matrix(Role.UP, self.stage(str(Role.UP)))
            self.route(self.stage("act"))
            for (gname, _, _), (uname, upos, n) in zip(self.roots(Role.GATE), self.roots(Role.UP)):
                self.act(upos, ActFn.SWIGLU, buf(BufKind.ROOT, _hub_index(gname)),
                         buf(BufKind.ROOT, _hub_index(uname)), n)
            self.matrix(Role.DOWN, self.stage(str(Role.DOWN)))
        else:
            self.matrix(Role.FC1, self.stage(str(Role.FC1)))
            for name, pos, n in self.roots(Role.FC1):
                tag = buf(BufKind.ROOT, _hub_index(name))
                self.act(pos, MLP_FN[self.ir.activation], tag, tag, n)
            self.matrix(Role.FC2, self.stage(str(Role.FC2)))
        self.route(self.stage("out"))
        if self.ir.post_norms:  # ... and the MLP's
            self.norm("out", HiddenBuf.OUT, HiddenBuf.OUT, self.ir.norm)
        self.residual_add("out", HiddenBuf.OUT)
        return self.b
