"""Legality of an instruction stream under its metadata: the check every program passes.

:func:`stream_problem` finds the first illegal thing (docs/isa.md, 'Legality'):
the metadata integers; the stream's dtypes and the group table's CSR shape;
every record field against its opcode (range, the controller, required
destinations); the group members; the sections. Everything is vectorised
over records. A stream that passes can be replayed by the executor without
an index leaving the target's CTs, PEs, units or links.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.isa.descriptors import DESCRIPTORS
from primal_compiler.isa.opcodes import (
    ALL_PES, ARG_ENUM_MASK, CONTROLLER, NONE16, NONE32, RECORD, SHARD_FNS, ActFn, BufKind, Flag, Opcode,
)
from primal_compiler.isa.stream import Section, Stream

META_INTS = ("num_cts", "mesh_rows", "mesh_cols", "num_layers")  # meta keys the legality check needs
NAME = re.compile(r"[A-Za-z0-9_.:/+=@-]+")  # array and section names: no whitespace, text-safe
_FLAG_BITS = sum(int(f) for f in Flag)
_STREAM_DTYPES = {"group_ptr": np.dtype("<i8"), "group_ct": np.dtype("<u2"), "group_pe": np.dtype("<u2")}
#: Opcodes that use a PE's macro or router unit, so they run on a CT, never on the controller. Not a column of
#: the descriptor table: ACT (unit dmac) also runs on the controller, CONFIG (unit sram) is issued by it.
ON_PE = (Opcode.SMAC_RRAM, Opcode.SMAC_SRAM, Opcode.DMAC, Opcode.MASK)
#: Opcodes with a destination (they use ``dst_ct``), which they need; CONFIG and KV_APPEND write into a CT,
#: UNICAST and REDUCE may also end at the controller (INTO_CT is not a column of the descriptor table).
ROUTED = tuple(op for op, d in DESCRIPTORS.items() if "dst_ct" in d.fields)
INTO_CT = (Opcode.CONFIG, Opcode.KV_APPEND)
_INTO_CT_NAMES = {op.name for op in INTO_CT}
#: Opcodes acting on a whole CT (PG_ON, PG_OFF), those with a group (BCAST, REDUCE), those with an enum ``arg``.
WHOLE_CT = tuple(op for op, d in DESCRIPTORS.items() if d.whole_ct)
GROUPED = tuple(op for op, d in DESCRIPTORS.items() if "group" in d.fields)
_ENUM_ARG = {op: d.arg_enum for op, d in DESCRIPTORS.items() if d.arg_enum is not None}


def _names(ops: tuple[Opcode, ...]) -> str:
    names = [op.name for op in ops]
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


class Problem(NamedTuple):
    """First illegality found: ``kind`` is meta/stream/record/group/section, ``position`` which one."""

    kind: str
    position: int
    message: str


# --------------------------------------------------------------------------- legality


def array_problem(name: object, dtype: np.dtype) -> str | None:
    """Why an array of ``dtype`` cannot be stored under ``name`` (None if it can): NAME, plain numbers."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        return f"array name {name!r} must be non-empty and made of letters, digits and _.:/+=@-"
    if name.startswith("stream."):
        return f"array name {name!r}: the prefix 'stream.' is reserved for the instruction stream"
    if dtype.kind not in "biufc" or dtype.fields is not None or dtype.subdtype is not None:
        return f"array {name}: dtype {dtype} is not a plain number type (bool, int, uint, float, complex)"
    return None


def stream_problem(stream: Stream, meta: Mapping[str, Any]) -> Problem | None:
    """The first illegal thing in ``stream`` under ``meta`` (see docs/isa.md, 'Legality'), or None."""
    return _meta_problem(meta) or _structure_problem(stream) or _record_problem(stream, meta) \
        or _group_problem(stream, meta) or _section_problem(stream)


def validate_stream(stream: Stream, meta: Mapping[str, Any], where: str = "<stream>") -> None:
    """Raise ``InputError(where, ...)`` naming the record/group/section and field of the first illegality."""
    problem = stream_problem(stream, meta)
    if problem is not None:
        raise InputError(where, problem.message)


def _meta_problem(meta: Mapping[str, Any]) -> Problem | None:
    if not isinstance(meta, Mapping):
        return Problem("meta", 0, f"meta: expected a JSON object, got {type(meta).__name__}")
    for key in META_INTS:
        value = meta.get(key)
        if type(value) is not int:
            return Problem("meta", 0, f"meta {key}: expected an integer, got {value!r}")
        low = 0 if key == "num_layers" else 1
        if not low <= value < NONE16:
            return Problem("meta", 0, f"meta {key}: {value} is outside {low}..{NONE16 - 1}")
    if meta["mesh_rows"] * meta["mesh_cols"] >= ALL_PES:
        return Problem("meta", 0, f"meta mesh_rows*mesh_cols: {meta['mesh_rows'] * meta['mesh_cols']} >= {ALL_PES}")
    return None


def _structure_problem(s: Stream) -> Problem | None:
    rec = s.records
    if not isinstance(rec, np.ndarray) or rec.dtype != RECORD or rec.ndim != 1:
        return Problem("stream", 0, "stream records: expected a 1-D array of the IPCN RECORD dtype")
    for name, dtype in _STREAM_DTYPES.items():
        a = getattr(s, name)
        if not isinstance(a, np.ndarray) or a.dtype != dtype or a.ndim != 1:
            return Problem("stream", 0, f"stream {name}: expected a 1-D {dtype} array")
    ptr = s.group_ptr
    if len(ptr) == 0 or ptr[0] != 0 or np.any(np.diff(ptr) < 0) or ptr[-1] != len(s.group_ct):
        return Problem("stream", 0, f"stream group_ptr: must start at 0, never decrease and end at {len(s.group_ct)}")
    if len(s.group_pe) != len(s.group_ct):
        return Problem("stream", 0, f"stream group_pe: {len(s.group_pe)} members but group_ct has {len(s.group_ct)}")
    return None


def _first(bad: np.ndarray) -> tuple[int, str] | None:
    """Index of the first true entry and a note on how many more there are."""
    hits = np.flatnonzero(bad)
    if len(hits) == 0:
        return None
    return int(hits[0]), (f" (and {len(hits) - 1} more)" if len(hits) > 1 else "")


def _record_checks(r: np.ndarray, meta: Mapping[str, Any], num_groups: int) -> Iterator[tuple[str, np.ndarray, Any]]:
    """(field, mask of bad records, describe(value, opcode name)) in field order, computed lazily."""
    num_cts, pes, layers = meta["num_cts"], meta["mesh_rows"] * meta["mesh_cols"], meta["num_layers"]
    op, ct, pe = r["op"], r["ct"], r["pe"]
    yield "op", ~np.isin(op, list(Opcode)), lambda v, o: f"{v} is not an opcode (0..{len(Opcode) - 1})"
    yield "flags", (r["flags"] & (0xFF ^ _FLAG_BITS)) != 0, \
        lambda v, o: f"{v:#x} sets bits outside {'|'.join(f'{f.name}' for f in Flag)}"
    pg = np.isin(op, WHOLE_CT)
    yield "ct", (ct >= num_cts) & (ct != CONTROLLER), lambda v, o: f"{v} >= num_cts {num_cts}"
    yield "ct", pg & (ct == CONTROLLER), lambda v, o: f"{o} gates a CT, not the controller"
    yield "ct", np.isin(op, ON_PE) & (ct == CONTROLLER), lambda v, o: f"{o} runs on a PE of a CT, not the controller"
    whole = (pe == ALL_PES) & (pg | (ct == CONTROLLER))
    yield "pe", (pe >= pes) & ~whole, lambda v, o: (
        f"ALL_PES on {o} (only {', '.join(op.name for op in WHOLE_CT)} and controller records)" if v == ALL_PES
        else f"{v} >= mesh_rows*mesh_cols {pes}")
    dst_ct, dst_pe = r["dst_ct"], r["dst_pe"]
    yield "dst_ct", (dst_ct >= num_cts) & (dst_ct != NONE16) & (dst_ct != CONTROLLER), \
        lambda v, o: f"{v} >= num_cts {num_cts}"
    routed = np.isin(op, ROUTED)
    yield "dst_ct", routed & (dst_ct == NONE16), \
        lambda v, o: f"{o} needs a destination CT{'' if o in _INTO_CT_NAMES else ' or ctl'}, got none"
    yield "dst_ct", np.isin(op, INTO_CT) & (dst_ct == CONTROLLER), \
        lambda v, o: f"{o} writes into a CT, not the controller"
    yield "dst_pe", (dst_pe >= pes) & (dst_pe != NONE16), lambda v, o: f"{v} >= mesh_rows*mesh_cols {pes}"
    yield "dst_pe", routed & (dst_ct < num_cts) & (dst_pe == NONE16), \
        lambda v, o: f"{o} to a CT needs a destination PE, got none"
    yield "layer", (r["layer"] > layers) & (r["layer"] != NONE16), lambda v, o: f"{v} > num_layers {layers}"
    for field in ("src_buf", "dst_buf"):
        tag = r[field]
        yield field, ((tag >> 12) >= len(BufKind)) & (tag != NONE16), \
            lambda v, o: f"{v:#06x} has buffer kind {v >> 12}, not a BufKind (0..{len(BufKind) - 1})"
    grouped = np.isin(op, GROUPED)
    group = r["group"]
    yield "group", grouped & (group == NONE32), lambda v, o: f"{o} needs a group"
    yield "group", ~grouped & (group != NONE32), lambda v, o: f"{v} on {o}: only {_names(GROUPED)} use a group"
    yield "group", (group >= num_groups) & (group != NONE32), lambda v, o: f"{v} >= num_groups {num_groups}"
    yield "count", r["count"] == 0, lambda v, o: "0, must be >= 1"
    bad_arg = np.zeros(len(r), dtype=bool)
    for opcode, enum in _ENUM_ARG.items():
        bad_arg |= (op == opcode) & ~np.isin(r["arg"] & ARG_ENUM_MASK[opcode], list(enum))
    yield "arg", bad_arg, lambda v, o: f"{v} is not in {_ENUM_ARG[Opcode[o]].__name__} " \
                                       f"(0..{len(_ENUM_ARG[Opcode[o]]) - 1}) for {o}"
    act = op == Opcode.ACT
    fn, high = r["arg"] & ARG_ENUM_MASK[Opcode.ACT], r["arg"] >> 8
    shard = np.isin(fn, [int(f) for f in SHARD_FNS])
    embed = (fn == ActFn.EMBED) & ((r["flags"] & Flag.PREFILL) != 0)
    yield "arg", act & (high != 0) & ~embed & ~shard, \
        lambda v, o: f"{v:#x}: only a prefill's EMBED keeps a position above bit 8 (and a norm its shard's elements)"
    yield "arg", act & shard & ((high == 0) | (r["count"] % np.maximum(high, 1) != 0)), \
        lambda v, o: f"{v:#x}: a norm or its statistics names its shard's elements above bit 8, dividing count"


def _record_problem(s: Stream, meta: Mapping[str, Any]) -> Problem | None:
    r = s.records
    for field, bad, describe in _record_checks(r, meta, s.num_groups):
        hit = _first(bad)
        if hit is not None:
            i, more = hit
            code = int(r["op"][i])
            name = Opcode(code).name if code in Opcode._value2member_map_ else f"opcode {code}"
            return Problem("record", i, f"record {i} field {field}: {describe(int(r[field][i]), name)}{more}")
    return None


def _group_problem(s: Stream, meta: Mapping[str, Any]) -> Problem | None:
    num_cts, pes = meta["num_cts"], meta["mesh_rows"] * meta["mesh_cols"]
    ct, pe = s.group_ct, s.group_pe
    for field, bad, describe in (
        ("ct", (ct >= num_cts) & (ct != CONTROLLER), lambda v: f"{v} >= num_cts {num_cts}"),
        ("pe", (pe >= pes) & ~((pe == ALL_PES) & (ct == CONTROLLER)), lambda v: f"{v} >= mesh_rows*mesh_cols {pes}"),
    ):
        hit = _first(bad)
        if hit is not None:
            j, more = hit
            g = int(np.searchsorted(s.group_ptr, j, side="right")) - 1
            value = int((ct if field == "ct" else pe)[j])
            member = j - int(s.group_ptr[g])
            return Problem("group", g, f"group {g} member {member} field {field}: {describe(value)}{more}")
    return None


def _section_problem(s: Stream) -> Problem | None:
    stop, names = 0, set()
    for k, sec in enumerate(s.sections):
        if not isinstance(sec, Section) or not isinstance(sec.name, str) or not NAME.fullmatch(sec.name):
            return Problem("section", k, f"section {k}: name {getattr(sec, 'name', sec)!r} is empty or not text-safe")
        if sec.name in names:
            return Problem("section", k, f"section {k} {sec.name}: the name is used twice")
        names.add(sec.name)
        if type(sec.start) is not int or type(sec.stop) is not int or sec.stop < sec.start:
            return Problem("section", k, f"section {k} {sec.name}: start {sec.start!r} and stop {sec.stop!r} "
                                         "must be ints with start <= stop")
        if sec.start > stop:
            return Problem("record", stop, f"record {stop}: in no section (gap before section {sec.name})")
        if sec.start < stop:
            return Problem("section", k, f"section {k} {sec.name}: starts at {sec.start}, overlapping the previous one")
        stop = sec.stop
    if stop < len(s):
        return Problem("record", stop, f"record {stop}: in no section (sections must cover all {len(s)} records)")
    if stop > len(s):
        last = len(s.sections) - 1
        return Problem("section", last, f"section {s.sections[last].name}: stops at {stop} > {len(s)} records")
    return None
