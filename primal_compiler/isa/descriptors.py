"""The opcode descriptor table: one entry per opcode, the one place an opcode is described.

For every :class:`Opcode`, :data:`DESCRIPTORS` gives its operand fields, the
meaning of ``arg``, the unit that runs it, its read and write footprints
(which locations and which element ranges of them it reads and writes,
derived from the record's own fields), the names of its cost rule
(``executor.costs``) and functional rule (``functional.routers`` /
``functional.compute``), and the class its time counts under on a critical
path. The dependency builder, the cost rules, the functional replay, the
text form, the trace and ``docs/isa.md`` read this table; a missing entry is
an error naming the opcode (:func:`descriptor`). The opcode table of
``docs/isa.md`` is :func:`opcode_table_markdown`; ``python -m
primal_compiler.isa.descriptors docs/isa.md`` rewrites it there.

A **location** is (CT, PE, buffer tag) — the controller is (CONTROLLER, 0, tag)
— or one of the pseudo-buffers of :class:`Pseudo`, state that is not a
scratchpad buffer but that records still hand to each other (SRAM slots are
``BufKind.SRAM`` tags). An **extent** is a half-open element range of the
location. Router moves name only where a slice starts (``arg`` offsets,
units of 8 elements; docs/isa.md): a slice runs from its offset to the end of
the buffer, so its extent is ``[offset, END)``. The dependency rules that make
such extents exact enough are in ``executor/deps.py``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

from primal_compiler.isa.opcodes import ActFn, DmacOp, Flag, Opcode, ReduceOp

END = 1 << 40
"""Upper end of an extent that runs to the end of its buffer."""


class At(IntEnum):
    """Where a footprint lies."""

    SOURCE = 0  # (ct, pe): the issuing PE (a compute record's own PE), or the controller
    DESTINATION = 1  # (dst_ct, dst_pe), or the controller
    MEMBERS = 2  # every member of ``group``


class Buffer(IntEnum):
    """Which location at that place."""

    SRC_BUF = 0  # the record's src_buf tag
    DST_BUF = 1  # the record's dst_buf tag
    SRAM_SLOT = 2  # BufKind.SRAM tag of slot ``arg & 0xFFF`` (CONFIG, SMAC_SRAM)
    KV_CHUNK = 3  # KV_K (DmacOp.QK) or KV_V (DmacOp.PV) tag of slot ``arg >> 8``
    MASK_REGISTER = 4  # the PE's LoRA block mask register (Pseudo.MASK)
    NORM_TOTAL = 5  # the PE's summed norm statistics (HIDDEN TOTAL of shard 0) that a shard's norm reads


class Extent(IntEnum):
    """Which elements of the location."""

    WHOLE = 0  # [0, END)
    MOVE_SRC = 1  # [(arg >> 16) * 8, END): BCAST and UNICAST source offset
    MOVE_DST = 2  # [(arg & 0xFFFF) * 8, END): BCAST, UNICAST destination offset
    REDUCE_SRC = 3  # [((arg >> 4) & 0x3FFF) * 8, END)
    REDUCE_DST = 4  # [(arg >> 18) * 8, END)
    TOKEN_SLOTS = 5  # [arg & 0xFFFF, + count): KV_APPEND token slots (token units)
    SLOT_BIT = 6  # [slot, slot + 1), slot = arg & 0xFFFF: one SRAM slot's mask bit
    KV_SRC = 7  # [((arg >> 16) & 0xFF) * 8, END): KV_APPEND source offset


class Pseudo(IntEnum):
    """Tags of the pseudo-buffers: kind 15, never a scratchpad buffer (BufKind stops at 13)."""

    MASK = 0xF000


class PathClass(IntEnum):
    """What a record's time counts as on a critical path (``primal run --critical-path``)."""

    RRAM_MVM = 0
    SRAM_MVM = 1
    DMAC_ATTENTION = 2
    REDUCE = 3
    ACTIVATION = 4
    MESH_TRANSFER = 5
    DIE_TO_DIE = 6
    WAKEUP = 7
    RECONFIGURATION = 8
    CONTROL = 9
    NORM_RESIDUAL = 10  # an ACT that norms (or gathers a norm's statistics), adds a residual or picks the token


@dataclass(frozen=True)
class Access:
    """One footprint: ``extent`` of ``buffer`` at ``at``, for the records that carry every bit of
    ``flags``, none of ``without``, and (when ``args`` is set) an enum ``arg`` among ``args``."""

    at: At
    buffer: Buffer
    extent: Extent
    flags: int = 0
    without: int = 0
    args: tuple[int, ...] = ()


UNIT_KINDS = ("rram", "sram", "dmac", "router", "controller", "power", "none")
"""The values of :attr:`Descriptor.unit`."""


@dataclass(frozen=True)
class Descriptor:
    """Everything about one opcode. ``fields``: the fields it uses (the others hold their unused
    value); ``unit``: what runs it (one of :data:`UNIT_KINDS`); ``arg_enum``: the enum in the low
    bits of ``arg``, if any; ``whole_ct``: it acts on all of CT ``ct`` (``pe`` may be ALL_PES, ``ct``
    is never the controller); ``arg_hex``: the text form writes ``arg`` in hex (bit sets)."""

    opcode: Opcode
    summary: str
    fields: tuple[str, ...]
    arg: str
    unit: str
    reads: tuple[Access, ...]
    writes: tuple[Access, ...]
    cost_rule: str
    functional_rule: str
    path_class: PathClass
    arg_enum: type[IntEnum] | None = None
    whole_ct: bool = False
    arg_hex: bool = False


_S, _D, _M = At.SOURCE, At.DESTINATION, At.MEMBERS
_ACC = int(Flag.ACCUMULATE)
_READS_DST = (int(ActFn.SWIGLU), int(ActFn.RESIDUAL_ADD))
_NORMS = (int(ActFn.RMSNORM), int(ActFn.LAYERNORM))

DESCRIPTORS: dict[Opcode, Descriptor] = {d.opcode: d for d in (
    Descriptor(Opcode.BCAST, "router: `src_buf` at (`ct`, `pe`) multicast to every member of `group`",
               ("ct", "pe", "group", "src_buf", "dst_buf", "nbytes", "arg"),
               "`src_offset << 16 | dst_offset`, element offsets in units of 8", "router",
               (Access(_S, Buffer.SRC_BUF, Extent.MOVE_SRC),),
               (Access(_M, Buffer.DST_BUF, Extent.MOVE_DST),),
               "_move", "bcast", PathClass.MESH_TRANSFER),
    Descriptor(Opcode.REDUCE, "router: the members' `src_buf` combined with `arg` (`ReduceOp`) into (`dst_ct`, `dst_pe`)",
               ("ct", "pe", "group", "dst_ct", "dst_pe", "src_buf", "dst_buf", "nbytes", "arg"),
               "bits 0-3 `ReduceOp`; bits 4-17 source offset, 18-31 destination offset (units of 8 elements)",
               "router",
               (Access(_M, Buffer.SRC_BUF, Extent.REDUCE_SRC), Access(_D, Buffer.DST_BUF, Extent.REDUCE_DST, flags=_ACC)),
               (Access(_D, Buffer.DST_BUF, Extent.REDUCE_DST),),
               "_reduce", "reduce_", PathClass.REDUCE, arg_enum=ReduceOp),
    Descriptor(Opcode.UNICAST, "router: (`ct`, `pe`) -> (`dst_ct`, `dst_pe`)",
               ("ct", "pe", "dst_ct", "dst_pe", "src_buf", "dst_buf", "nbytes", "arg"),
               "`src_offset << 16 | dst_offset`, element offsets in units of 8", "router",
               (Access(_S, Buffer.SRC_BUF, Extent.MOVE_SRC),),
               (Access(_D, Buffer.DST_BUF, Extent.MOVE_DST),),
               "_move", "unicast", PathClass.MESH_TRANSFER),
    Descriptor(Opcode.CONFIG, "router: write `nbytes` of adapter `arg >> 16`'s weights into SRAM slot "
               "`arg & 0xFFFF` of (`dst_ct`, `dst_pe`)",
               ("ct", "pe", "dst_ct", "dst_pe", "dst_buf", "nbytes", "arg"), "`adapter << 16 | slot`", "sram",
               (),
               (Access(_D, Buffer.SRAM_SLOT, Extent.WHOLE), Access(_D, Buffer.MASK_REGISTER, Extent.SLOT_BIT)),
               "_config", "config", PathClass.RECONFIGURATION),
    Descriptor(Opcode.SMAC_RRAM, "RRAM-ACIM matrix-vector product of the PE's crossbar, `count` vectors",
               ("ct", "pe", "src_buf", "dst_buf", "count", "arg"), "the bit slice of the weights the crossbar holds",
               "rram",
               (Access(_S, Buffer.SRC_BUF, Extent.WHOLE), Access(_S, Buffer.DST_BUF, Extent.WHOLE, flags=_ACC)),
               (Access(_S, Buffer.DST_BUF, Extent.WHOLE),),
               "_smac_rram", "smac_rram", PathClass.RRAM_MVM),
    Descriptor(Opcode.SMAC_SRAM, "SRAM-DCIM product with LoRA slot `arg` of the PE, `count` vectors",
               ("ct", "pe", "src_buf", "dst_buf", "count", "arg"), "SRAM slot", "sram",
               (Access(_S, Buffer.SRC_BUF, Extent.WHOLE), Access(_S, Buffer.DST_BUF, Extent.WHOLE, flags=_ACC),
                Access(_S, Buffer.SRAM_SLOT, Extent.WHOLE, without=int(Flag.SKIPPED)),
                Access(_S, Buffer.MASK_REGISTER, Extent.SLOT_BIT)),
               (Access(_S, Buffer.DST_BUF, Extent.WHOLE),),
               "_smac_sram", "smac_sram", PathClass.SRAM_MVM),
    Descriptor(Opcode.DMAC, "activation x activation in the router (`arg`: `DmacOp`), `count` MACs",
               ("ct", "pe", "src_buf", "dst_buf", "count", "arg"),
               "bits 0-7 `DmacOp`; bits 8-31 the KV chunk slot it reads", "dmac",
               (Access(_S, Buffer.SRC_BUF, Extent.WHOLE), Access(_S, Buffer.KV_CHUNK, Extent.WHOLE),
                Access(_S, Buffer.DST_BUF, Extent.WHOLE, flags=_ACC)),
               (Access(_S, Buffer.DST_BUF, Extent.WHOLE),),
               "_dmac", "dmac", PathClass.DMAC_ATTENTION, arg_enum=DmacOp),
    Descriptor(Opcode.ACT, "activation unit (`arg`: `ActFn`) on `count` elements",
               ("ct", "pe", "layer", "src_buf", "dst_buf", "count", "arg"),
               "bits 0-7 `ActFn`; bits 8-31, on a prefill's `EMBED`, the position of the prompt's first token "
               "(the conversation's saved tokens, `codegen{history}`; 0 otherwise)", "dmac",
               (Access(_S, Buffer.SRC_BUF, Extent.WHOLE), Access(_S, Buffer.DST_BUF, Extent.WHOLE, args=_READS_DST),
                Access(_S, Buffer.DST_BUF, Extent.WHOLE, flags=_ACC, args=(int(ActFn.NORM_STATS), int(ActFn.RMS_STATS))),
                Access(_S, Buffer.NORM_TOTAL, Extent.WHOLE, args=_NORMS)),
               (Access(_S, Buffer.DST_BUF, Extent.WHOLE),),
               "_act", "act", PathClass.ACTIVATION, arg_enum=ActFn),
    Descriptor(Opcode.KV_APPEND, "(`ct`, `pe`) writes k or v of `count` tokens into KV slot `dst_buf` of (`dst_ct`, `dst_pe`)",
               ("ct", "pe", "dst_ct", "dst_pe", "src_buf", "dst_buf", "count", "nbytes", "arg"),
               "bits 0-15 the token slot; bits 16-23 source offset, bits 24-31 the first element of the head it "
               "writes (units of 8: a head split over two roots is appended in two pieces)", "router",
               (Access(_S, Buffer.SRC_BUF, Extent.KV_SRC),),
               (Access(_D, Buffer.DST_BUF, Extent.TOKEN_SLOTS),),
               "_kv_append", "kv_append", PathClass.MESH_TRANSFER),
    Descriptor(Opcode.PG_ON, "wake CT `ct` (power-gating header on)", ("ct",), "unused", "power", (), (),
               "_pg_on", "power", PathClass.WAKEUP, whole_ct=True),
    Descriptor(Opcode.PG_OFF, "gate CT `ct`: RRAM periphery and router off, SRAM and scratchpad retained", ("ct",),
               "unused", "power", (), (), "_pg_off", "power", PathClass.CONTROL, whole_ct=True),
    Descriptor(Opcode.MASK, "set the LoRA block mask register of (`ct`, `pe`): bit s set = SRAM slot s all zero",
               ("ct", "pe", "arg"), "mask bits", "sram", (),
               (Access(_S, Buffer.MASK_REGISTER, Extent.WHOLE),), "_mask", "mask", PathClass.RECONFIGURATION,
               arg_hex=True),
    Descriptor(Opcode.SYNC, "barrier `arg`: later records wait for every earlier record", ("arg",), "barrier id",
               "none", (), (), "_sync", "sync", PathClass.CONTROL),
)}


def descriptor(op: int) -> Descriptor:
    """The descriptor of opcode ``op``; KeyError naming the opcode when the table lacks it."""
    known = int(op) in Opcode._value2member_map_
    d = DESCRIPTORS.get(Opcode(op)) if known else None
    if d is None:
        raise KeyError(f"opcode {int(op)} ({Opcode(op).name if known else 'unknown'}) has no descriptor")
    return d


def missing() -> list[str]:
    """Opcodes without a descriptor (empty when the table is complete)."""
    return [o.name for o in Opcode if o not in DESCRIPTORS]


# --------------------------------------------------------------------------- docs/isa.md

DOC_BEGIN, DOC_END = "<!-- opcode-table:begin -->", "<!-- opcode-table:end -->"
_AT = {At.SOURCE: "src", At.DESTINATION: "dst", At.MEMBERS: "members"}
_BUFFER = {Buffer.SRC_BUF: "src_buf", Buffer.DST_BUF: "dst_buf", Buffer.SRAM_SLOT: "SRAM slot",
           Buffer.KV_CHUNK: "KV chunk arg>>8", Buffer.MASK_REGISTER: "mask register",
           Buffer.NORM_TOTAL: "HIDDEN.0x9"}
_EXTENT = {Extent.WHOLE: "", Extent.MOVE_SRC: "[src_off:]", Extent.MOVE_DST: "[dst_off:]",
           Extent.REDUCE_SRC: "[src_off:]", Extent.REDUCE_DST: "[dst_off:]", Extent.TOKEN_SLOTS: "[slot:slot+count]",
           Extent.SLOT_BIT: "[slot]", Extent.KV_SRC: "[src_off:]"}
_LEGEND = (
    "Footprints read `BUFFER@PLACE[ELEMENTS]`. PLACE: `src` and `dst` the record's source and destination "
    "(`ct`, `pe`) and (`dst_ct`, `dst_pe`), `self` its own PE (or the controller) when it has no destination, "
    "`members` every member of `group`. ELEMENTS: `[src_off:]`, `[dst_off:]` from the element offset packed in "
    "`arg` (8 x the packed value) to the end of the buffer; `[slot:slot+count]` `count` token slots from the one "
    "in `arg`; `[slot]` the bit of SRAM slot `arg & 0xFFFF`; `SRAM slot` the slot `arg & 0xFFF`; none, the whole "
    "location. `if` names the flags (`not`: flags absent) or `arg` values a footprint needs. Generated from `primal_compiler/isa/descriptors.py` "
    "(`python -m primal_compiler.isa.descriptors docs/isa.md` rewrites this block)."
)


def access_text(d: Descriptor, a: Access) -> str:
    """Readable form of footprint ``a`` of ``d`` (markdown), e.g. "`dst_buf@self` if ACCUMULATE"; KeyError
    on an At/Buffer/Extent without a label."""
    moves = any(x.at != At.SOURCE for x in d.reads + d.writes)
    place = "self" if a.at == At.SOURCE and not moves else _AT[a.at]
    cond = []
    if a.args:
        cond.append("arg is " + "/".join(d.arg_enum(v).name if d.arg_enum else str(v) for v in a.args))
    cond += [f"{f.name}" for f in Flag if a.flags & f] + [f"not {f.name}" for f in Flag if a.without & f]
    return f"`{_BUFFER[a.buffer]}@{place}{_EXTENT[a.extent]}`" + (" if " + " and ".join(cond) if cond else "")


def opcode_table_markdown() -> str:
    """The opcode table of docs/isa.md, one row per :class:`Opcode` in code order, then its legend;
    KeyError naming an opcode without a descriptor."""
    head = ("code", "name", "what it does", "fields used", "`arg`", "unit", "reads", "writes", "cost rule",
            "functional rule")
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for op in Opcode:
        d = descriptor(op)
        fields = f"`{' '.join(d.fields)}`" + (", `pe = ALL_PES`" if d.whole_ct else "")
        cells = (str(int(op)), f"`{op.name}`", d.summary, fields, d.arg, d.unit,
                 "; ".join(access_text(d, a) for a in d.reads) or "none",
                 "; ".join(access_text(d, a) for a in d.writes) or "none", f"`{d.cost_rule}`", f"`{d.functional_rule}`")
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n\n" + _LEGEND + "\n"


def with_opcode_table(doc: str) -> str:
    """``doc`` with the text between :data:`DOC_BEGIN` and :data:`DOC_END` replaced by
    :func:`opcode_table_markdown`; ValueError unless each marker occurs once, in that order."""
    if doc.count(DOC_BEGIN) != 1 or doc.count(DOC_END) != 1 or doc.index(DOC_BEGIN) > doc.index(DOC_END):
        raise ValueError(f"expected one {DOC_BEGIN} line followed by one {DOC_END} line")
    head, rest = doc.split(DOC_BEGIN)
    return head + DOC_BEGIN + "\n" + opcode_table_markdown() + DOC_END + rest.split(DOC_END)[1]


def main(argv: list[str]) -> int:
    """``python -m primal_compiler.isa.descriptors [DOC]``: print the opcode table, or rewrite it in DOC."""
    if not argv:
        print(opcode_table_markdown(), end="")
        return 0
    path = Path(argv[0])
    path.write_text(with_opcode_table(path.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
