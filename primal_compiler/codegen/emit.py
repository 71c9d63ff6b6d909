"""The whole program: per request an adapter load, the prefill of the prompt and its decode steps.

Sections, in order, for request ``r``: ``adapter:r`` (only when a slot must
be loaded for it: MASK records for all-zero LoRA blocks, a CONFIG per
non-zero LoRA tile from the controller into its slot for each adapter it
loads ahead, then a SYNC, so no layer computes before every adapter write
lands; ``srpg`` pipelines them),
``prefill:r`` (the prompt of ``prompt`` tokens for every sequence, logits of
the last token) and ``decode:r`` (``steps`` steps of one token per sequence
at positions ``prompt``, ``prompt + 1``, ...). With a ``history`` of h tokens
(context save: each request continues a conversation whose first h tokens'
K/V are already in its KV slots, computed on its adapter) the prompt takes
positions h .. h + prompt - 1, the decode steps follow from h + prompt, and
the prefill's EMBED carries h in ``arg`` above bit 8 (docs/isa.md). Every phase (the prefill and
each decode step) ends with the controller's ARGMAX.

LoRA residency: by default an adapter's weights stay in their SRAM-DCIM slot (:mod:`.residency`: as many
adapters as the macro has slots) until another adapter needs the slot: written in ``adapter:r`` when no
slot holds them, and, for a request on more adapters than slots, again before each pass whose adapter no
slot holds (CONFIGs and a barrier inside ``prefill:r`` or ``decode:r``). With ``reprogram``
(``codegen{lora_residency=per-token}``, the seed's SRPG: "while CT_n computes layer n, the SRAM of
CT_n+1 is rewritten in the background with the next layer's LoRA weights") the macros hold weights only
while they are used: every pass (a prefill chunk, a decode step of a pass) starts with a rewrite of every
non-zero LoRA tile from the controller and a barrier (:data:`~primal_compiler.isa.opcodes.REPROGRAM`), which ``srpg`` pipelines (layer
n's writes after layer n-1 of the same pass starts, the barrier dropped); ``adapter:r`` then holds the
MASKs alone. Each layer is
emb/hand-off, norm + Q/K/V, attention, O + residual + MLP; records of a layer
template are built once and shifted to every layer using it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.codegen.attention import AttentionEmitter
from primal_compiler.codegen.block import Block, shifted
from primal_compiler.codegen.layer import LayerEmitter, offsets
from primal_compiler.codegen.residency import Slots, sram_slots
from primal_compiler.codegen.routes import LayerRoutes
from primal_compiler.ir.tiles import Macro
from primal_compiler.isa.opcodes import CONTROLLER, NONE16, REPROGRAM, ActFn, BufKind, Flag, HiddenBuf, Opcode, buf, hidden
from primal_compiler.isa.stream import Section, Stream
from primal_compiler.mapping.lower import layer_templates
from primal_compiler.mapping.lower import geometry
from primal_compiler.mapping.traffic import shards

if TYPE_CHECKING:
    from primal_compiler.ir.program import Program
    from primal_compiler.target.spec import PrimalTarget


@dataclass
class _Template:
    routes: LayerRoutes
    pre: Block
    post: Block
    attention: AttentionEmitter | None
    first_ct: int
    embed_norm: Block | None  # layer 0 of a model with ``embed_norm`` (Bloom): the embeddings' norm, in place


class _Out:
    """Growing stream: record arrays and group columns."""

    def __init__(self) -> None:
        self.parts: list[np.ndarray] = []
        self.sizes: list[np.ndarray] = []
        self.gct: list[np.ndarray] = []
        self.gpe: list[np.ndarray] = []
        self.groups = 0
        self.length = 0
        self.sections: list[Section] = []

    def put(self, block: Block, ct_shift: int = 0, layer: int | None = None, vectors: int = 1, flags: int = 0,
            slot: int = 0):
        """Append ``block`` shifted by ``ct_shift`` CTs, its SMAC_SRAM records on SRAM slot ``slot``."""
        rec = shifted(block.records(), ct_shift, layer, self.groups)
        if slot:
            rec["arg"][rec["op"] == Opcode.SMAC_SRAM] = slot
        if vectors != 1:
            rec["count"] *= vectors
            rec["nbytes"] *= vectors
        rec["flags"] |= np.uint8(flags)
        cts, pes = block.members()
        self.parts.append(rec)
        self.sizes.append(block.sizes())
        self.gct.append(cts + ct_shift)
        self.gpe.append(pes)
        self.groups += block.num_groups
        self.length += len(rec)

    def section(self, name: str, start: int) -> None:
        self.sections.append(Section(name, start, self.length))

    def stream(self) -> Stream:
        cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)  # noqa: E731
        sizes = cat(self.sizes, np.int64)
        return Stream(np.concatenate(self.parts), np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
                      cat(self.gct, np.uint16), cat(self.gpe, np.uint16), tuple(self.sections))


class ProgramEmitter:
    def __init__(self, program: Program, target: PrimalTarget, history: int = 0, reprogram: bool = False) -> None:
        self.p, self.target, self.history = program, target, history
        self.reprogram = reprogram  # LoRA weights rewritten at every pass (module docstring)
        self.model, self.kv = program.model, program.need_kv()
        self.geo = geometry(program.model, target)
        count = sram_slots(program.need_tiles(), target, self.geo.lora_bits)
        self.slots = Slots(1 if reprogram else max(count, 1))  # which adapter each SRAM slot holds (residency.py)
        self.geo_pes = target.ct.pes
        self.act_bytes = self.model.precision.activation_bits / 8
        zero = program.need_tiles().zero
        ids, firsts = layer_templates(self.model)
        self.template_of = list(ids) + [len(firsts)]
        self.templates = [self._template(f, zero) for f in firsts] + [self._template(self.model.num_layers, zero)]

    def _first_ct(self, layer: int) -> int:
        return int(np.flatnonzero(self.p.need_layout().ct_layer == layer)[0])

    def _template(self, layer: int, zero) -> _Template:
        routes = LayerRoutes(self.p, self.target, layer, self.kv.context)
        em = LayerEmitter(routes, self.model, self.geo, zero)
        embed_norm = em.embed_norm() if layer == 0 and self.model.embed_norm else None
        pre, post = em.pre(), em.post()
        attn = None
        if layer < self.model.num_layers:
            attn = AttentionEmitter(routes, self.model.layers[layer], self.kv, self.geo, self.act_bytes,
                                    alibi=bool(self.model.alibi_slopes),
                                    softcap_ops=self.target.act.attn_softcap_ops_per_element if self.model.attn_softcap else 0)
        return _Template(routes, pre, post, attn, self._first_ct(layer), embed_norm)

    def hub(self, layer: int, name: str) -> tuple[int, int]:
        tp = self.templates[self.template_of[layer]]
        ct, pe = tp.routes.hub_pos(name)
        return ct - tp.first_ct + self._first_ct(layer), pe

    def handoff(self, layer: int, vectors: int, first_seq: int, prefill: bool) -> Block:
        """The layer's input into every shard of its hub ``in``: the controller's embeddings (layer 0) or
        shard i of the previous layer's ``out``."""
        b, h = Block(), self.model.hidden_size
        if layer == 0:  # a decode step embeds the tokens the last ARGMAX of these sequences picked
            token = NONE16 if prefill else buf(BufKind.TOKEN, first_seq)
            first = self.history << 8 if prefill else 0  # where the NMC's ring pointer starts the prompt
            b.add(op=Opcode.ACT, ct=CONTROLLER, pe=0, src_buf=token, dst_buf=hidden(HiddenBuf.X), count=h * vectors,
                  arg=int(ActFn.EMBED) | first, layer=0)
        rows = self.geo.rram_rows
        for i in range(shards(h, rows)):
            n, dst = min(rows, h - i * rows), self.hub(layer, f"in:{i}")
            if layer == 0:
                src, sb, so = (CONTROLLER, 0), hidden(HiddenBuf.X), i * rows
            else:
                src, sb, so = self.hub(layer - 1, f"out:{i}"), hidden(HiddenBuf.OUT, i), 0
            b.add(op=Opcode.UNICAST, ct=src[0], pe=src[1], dst_ct=dst[0], dst_pe=dst[1], src_buf=sb,
                  dst_buf=hidden(HiddenBuf.X, i), count=vectors, nbytes=int(n * self.act_bytes * vectors),
                  arg=offsets(so, 0), layer=layer, flags=Flag.D2D if src[0] != dst[0] else 0)
        return b

    def phase(self, out: _Out, start: int, tokens: int, flags: int, seqs: range, decide: list[range],
              slot: int = 0) -> None:
        """Every layer and the LM head for ``tokens`` new tokens of sequences ``seqs`` from position ``start``,
        then one ARGMAX per range of ``decide`` (the passes whose next tokens it picks); with ``decide``
        empty (a prompt chunk that is not the last), the layers only: no LM head, no ARGMAX. Its LoRA
        products read SRAM slot ``slot``."""
        batch, L = len(seqs), self.model.num_layers
        attention: dict[int, Block] = {}  # a template's attention records, emitted once: put shifts them to each layer
        for n in range(L + 1 if decide else L):
            tp = self.templates[self.template_of[n]]
            shift = self._first_ct(n) - tp.first_ct
            vectors = batch if n == L else batch * tokens
            out.put(self.handoff(n, vectors, seqs.start, bool(flags & Flag.PREFILL)), flags=flags)
            if n == 0 and tp.embed_norm is not None:  # Bloom: the residual stream starts from the normed embeddings
                out.put(tp.embed_norm, shift, n, vectors, flags)
            out.put(tp.pre, shift, n, vectors, flags, slot)
            if tp.attention is not None:
                if self.template_of[n] not in attention:
                    attention[self.template_of[n]] = tp.attention.emit(start, tokens, seqs)
                out.put(attention[self.template_of[n]], shift, n, 1, flags)
            out.put(tp.post, shift, n, vectors, flags, slot)
        if not decide:
            return
        vocab = self.model.vocab_size
        tail = Block()  # the LM head's roots sent their logits to the controller (LayerEmitter.post)
        capped = self.model.logit_scale != 1.0 or self.model.logit_softcap > 0
        for d in decide:
            if capped:  # the model's logit scale and soft-cap, before the pick
                tail.add(op=Opcode.ACT, ct=CONTROLLER, pe=0, src_buf=hidden(HiddenBuf.LOGITS),
                         dst_buf=hidden(HiddenBuf.LOGITS), count=vocab * len(d), arg=ActFn.LOGIT_CAP, layer=L)
            tail.add(op=Opcode.ACT, ct=CONTROLLER, pe=0, src_buf=hidden(HiddenBuf.LOGITS),
                     dst_buf=buf(BufKind.TOKEN, d.start), count=vocab * len(d), arg=ActFn.ARGMAX, layer=L)
        out.put(tail, flags=flags)

    def adapter(self, out: _Out, barrier: int, loads: list[tuple[int, int]]) -> None:
        """MASK the all-zero LoRA blocks in every slot, CONFIG the others with each ``(adapter, slot)`` of
        ``loads`` (none when the program reprograms at every pass: each pass does instead), then a barrier."""
        t = self.p.need_tiles()
        sram = np.flatnonzero(t.macro == Macro.SRAM)
        ct, pe = t.ct[t.host[sram]], t.pe[sram]
        zero = t.zero[sram] == 1
        b = Block()
        if zero.any():
            b.add_columns(int(zero.sum()), op=Opcode.MASK, ct=ct[zero], pe=pe[zero], arg=(1 << self.slots.count) - 1,
                          layer=t.layer[sram][zero])
        for adapter, slot in loads:
            self._configs(b, adapter, slot)
        b.add(op=Opcode.SYNC, ct=CONTROLLER, pe=0, arg=barrier)
        out.put(b)

    def _configs(self, b: Block, adapter: int, slot: int) -> None:
        """A CONFIG from the controller of every LoRA tile that is not all zero, with ``adapter``'s weights into
        SRAM slot ``slot``: zero blocks are neither written nor computed."""
        t = self.p.need_tiles()
        sram = np.flatnonzero(t.macro == Macro.SRAM)
        keep = sram[t.zero[sram] != 1]
        b.add_columns(len(keep), op=Opcode.CONFIG, ct=CONTROLLER, pe=0, dst_ct=t.ct[t.host[keep]], dst_pe=t.pe[keep],
                      dst_buf=buf(BufKind.SRAM, slot), nbytes=t.bytes[keep], arg=adapter << 16 | slot,
                      layer=t.layer[keep], flags=Flag.D2D)

    def pass_slot(self, out: _Out, adapter: int, flags: int) -> int:
        """The SRAM slot a pass on ``adapter`` reads, after writing it first when the program reprograms at
        every pass or no slot holds ``adapter`` (:mod:`.residency`): every layer's CONFIG, then a barrier
        (:data:`~primal_compiler.isa.opcodes.REPROGRAM`) no layer of the pass passes before every write lands;
        ``srpg`` pipelines it."""
        slot = None if self.reprogram else self.slots.find(adapter)
        if slot is None:
            slot = self.slots.load(adapter, (adapter,))
            b = Block()
            self._configs(b, adapter, slot)
            b.add(op=Opcode.SYNC, ct=CONTROLLER, pe=0, arg=REPROGRAM)
            out.put(b, flags=flags)
        return slot


def emit_stream(program: Program, target: PrimalTarget, prompt: int, requests: tuple[tuple[int, ...], ...],
                steps: int = 1, pipeline: bool = True, prefill_chunk: int = 0, history: int = 0,
                reprogram: bool = False) -> Stream:
    """The instruction stream of ``requests`` (per request, the adapter id of every sequence of the batch, or
    one id for them all) on a placed program with a KV map.

    ``pipeline`` (batch > 1): each decode step runs one pass per sequence through the layers (records
    of one vector, its own EMBED and ARGMAX), sequence after sequence, so the layers' CTs work on
    different sequences at once and a sequence's next step starts when its own token is known; the
    prefill stays one pass of every sequence's prompt, ending with one ARGMAX per sequence. Off, one
    pass carries every sequence (records of ``batch`` vectors, one ARGMAX per step). A request whose
    sequences name several adapters (a mixed batch; ``pipeline`` needed) prefills each run of consecutive
    sequences on one adapter as its own pass, and each pass reads the slot holding its adapter, written
    before the pass when none does (module docstring). ``history``: tokens each request's conversation
    already holds in the KV cache (module docstring). ``reprogram``: every pass rewrites the LoRA weights
    (module docstring).
    """
    has_lora = bool((program.need_tiles().macro == Macro.SRAM).any())
    batch = program.need_kv().batch
    em = ProgramEmitter(program, target, history, reprogram and has_lora)
    out, slot, start = _Out(), 0, 0
    for p in _plan(requests, batch, decode_passes(batch, pipeline), prompt, prefill_chunk or prompt, steps):
        if p.first_of_request:
            if p.request:
                out.section(f"decode:{p.request - 1}", start)
            adapters = requests[p.request]
            if has_lora:
                ahead = em.slots.request(tuple(dict.fromkeys(adapters * batch if len(adapters) == 1 else adapters)))
                held = [a for a in ahead if em.slots.find(a) is not None]
                loads = [] if em.reprogram else [(a, em.slots.load(a, ahead)) for a in ahead if a not in held]
                if loads or (em.reprogram and (p.request == 0 or adapters != requests[p.request - 1])):
                    start = out.length
                    em.adapter(out, barrier=p.request, loads=loads)
                    out.section(f"adapter:{p.request}", start)
            start = out.length
        if p.first_decode:
            out.section(f"prefill:{p.request}", start)
            start = out.length
        if has_lora and (not p.later_chunk or em.reprogram):  # a later prompt chunk keeps its run's slot
            slot = em.pass_slot(out, p.adapter, p.flags)
        em.phase(out, history + p.position, p.tokens, p.flags, p.seqs, p.decide, slot)
    out.section(f"decode:{len(requests) - 1}", start)
    stream = out.stream()
    _mark_skipped(stream.records, program.need_tiles(), em.geo_pes)
    return stream


@dataclass(frozen=True)
class _Pass:
    """One pass of the plan: its request, sequences, adapter, first position (after the history), tokens, flags
    and the passes whose next tokens it picks; ``later_chunk``: a prompt chunk after its run's first (same
    adapter, no new slot unless every pass reprograms)."""

    request: int
    seqs: range
    adapter: int
    position: int
    tokens: int
    flags: int
    decide: list[range]
    later_chunk: bool
    first_of_request: bool
    first_decode: bool


def _plan(requests: tuple[tuple[int, ...], ...], batch: int, passes: list[range], prompt: int, chunk: int,
          steps: int) -> Iterator[_Pass]:
    """Every pass of the program in stream order (:func:`emit_stream`)."""
    for r, request in enumerate(requests):
        adapters = request * batch if len(request) == 1 else request
        head = True
        for seqs in adapter_runs(adapters):
            decide = [p for p in passes if p.start in seqs]
            for first in range(0, prompt, chunk):
                n = min(chunk, prompt - first)
                yield _Pass(r, seqs, adapters[seqs.start], first, n, Flag.PREFILL,
                            decide if first + n == prompt else [], first > 0, head, False)
                head = False
        for step in range(steps):
            for k, seqs in enumerate(passes):
                yield _Pass(r, seqs, adapters[seqs.start], prompt + step, 1, 0, [seqs], False, False,
                            step == 0 and k == 0)


def adapter_runs(adapters: tuple[int, ...]) -> list[range]:
    """The runs of consecutive sequences on one adapter, in order."""
    cuts = [s for s in range(1, len(adapters)) if adapters[s] != adapters[s - 1]]
    return [range(a, b) for a, b in zip([0, *cuts], [*cuts, len(adapters)], strict=True)]


def decode_passes(batch: int, pipeline: bool) -> list[range]:
    """The sequences each decode pass carries: one pass per sequence when pipelined at batch > 1, else one."""
    return [range(s, s + 1) for s in range(batch)] if pipeline and batch > 1 else [range(batch)]


def prefill_pass(program: Program, target: PrimalTarget, start: int, tokens: int, pipeline: bool,
                 history: int = 0) -> Stream:
    """One prefill pass alone (no sections): ``tokens`` tokens of every sequence from position ``start``,
    the LM head and each decode pass's ARGMAX included, as the last chunk of a prompt (LoRA writes, which
    take no scratchpad, left out)."""
    em = ProgramEmitter(program, target, history)
    out = _Out()
    batch = program.need_kv().batch
    em.phase(out, start, tokens, Flag.PREFILL, range(batch), decode_passes(batch, pipeline))
    return out.stream()


def _mark_skipped(rec: np.ndarray, tiles, pes: int) -> None:
    """SKIPPED on exactly the SMAC_SRAM records whose PE hosts an all-zero LoRA tile of *its* layer.

    Layer templates are emitted once and shifted to every layer using them, so
    the flags a template carries describe its own layer's blocks; another layer
    of the template can have a different zero pattern (lora-sparsity draws per tile).
    """
    sram = np.flatnonzero(tiles.macro == Macro.SRAM)
    key = tiles.ct[tiles.host[sram]].astype(np.int64) * pes + tiles.pe[sram]
    order = np.argsort(key)
    key, zero = key[order], tiles.zero[sram][order] == 1
    smac = np.flatnonzero(rec["op"] == Opcode.SMAC_SRAM)
    if not len(smac) or not len(key):
        return
    mine = rec["ct"][smac].astype(np.int64) * pes + rec["pe"][smac]
    at = np.minimum(np.searchsorted(key, mine), len(key) - 1)
    skipped = (key[at] == mine) & zero[at]
    flags = rec["flags"][smac] & np.uint8(~Flag.SKIPPED & 0xFF)
    rec["flags"][smac] = flags | np.where(skipped, np.uint8(Flag.SKIPPED), np.uint8(0))
