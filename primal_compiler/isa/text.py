"""Readable assembly text of a program: :func:`disasm` writes it, :func:`asm` reads it back.

Syntax (one item per line; full reference with an example in ``docs/isa.md``)::

    ; comment                        whole-line comments and blank lines are ignored
    .primal 1                        text format version (= container FORMAT_VERSION), first directive
    .meta {"mesh_cols":16,...}       metadata: one JSON object on one line
    .data NAME DTYPE SHAPE           an array (e.g. .data kv_map <i4 [3,4]): base64 lines of its
    ...                              little-endian bytes, closed by .end
    .end
    .group ID CT:PE CT:PE ...        group table, ids 0, 1, 2, ... in order
    .section NAME                    the records that follow belong to section NAME
    OPCODE ct=C pe=P field=value...  one record; fields holding their unused value may be left out

What depends on the opcode comes from its descriptor
(:mod:`~primal_compiler.isa.descriptors`): ``arg`` written as its enum
(``arg_enum``), in hex (``arg_hex``), and ``pe=all`` (``whole_ct``).

The first line ``disasm`` writes, ``; PRIMAL IPCN program: N records, G groups,
S sections``, is checked when present: text that holds fewer (a truncated file)
or more is refused naming line 1 (delete or fix that line after editing the
program on purpose).

Guarantees: ``asm(disasm(m, a, s))`` returns equal metadata, arrays and
stream (so binary -> text -> binary is byte-identical) and ``disasm`` of that
is the same text; ``asm`` returns only programs that
:func:`~primal_compiler.isa.container.load_program` accepts once saved, and
raises ``InputError(where, "line N: ...")`` naming the line of any malformed,
unknown or out-of-range item, of the record, group or section that
:func:`~primal_compiler.isa.legality.validate_stream` rejects, and for a
compiled program (meta ``format`` "primal-program") of the key, ``.data`` array
or section :mod:`~primal_compiler.isa.schema` rejects (a missing section names
the last line).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.isa.container import FORMAT_VERSION, plain_json
from primal_compiler.isa.descriptors import descriptor
from primal_compiler.isa.legality import array_problem, stream_problem, validate_stream
from primal_compiler.isa.opcodes import (
    ALL_PES, ARG_ENUM_MASK, CONTROLLER, NONE16, NONE32, RECORD, BufKind, Flag, Opcode, buf, buf_name, empty,
)
from primal_compiler.isa.schema import compiled_issue, is_compiled
from primal_compiler.isa.stream import Section, Stream

ORDER = ("ct", "pe", "dst_ct", "dst_pe", "layer", "src_buf", "dst_buf", "group", "count", "nbytes", "arg", "flags")
_DEFAULT = {name: int(empty(1)[0][name]) for name in ORDER}
_NONE = {"pe": ALL_PES, "dst_ct": NONE16, "dst_pe": NONE16, "layer": NONE16, "src_buf": NONE16,
         "dst_buf": NONE16, "group": NONE32, "flags": 0}
_WORDS = {("ct", "ctl"): CONTROLLER, ("dst_ct", "ctl"): CONTROLLER, ("pe", "all"): ALL_PES}
_B64_LINE = 76
_OPCODE_OF = {int(o): o for o in Opcode}
_OPCODE_NAMED = {o.name: o for o in Opcode}
_COUNTS = re.compile(r"; PRIMAL IPCN program: (\d+) records, (\d+) groups, (\d+) sections")


# --------------------------------------------------------------------------- disassembler


def disasm(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray], stream: Stream) -> str:
    """The canonical text of a program; InputError if the stream or an array is illegal."""
    validate_stream(stream, meta, "<disasm>")
    try:
        meta_text = json.dumps(meta, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InputError("<disasm>", f"meta: not plain JSON ({exc})") from None
    out = [f"; PRIMAL IPCN program: {len(stream)} records, {stream.num_groups} groups, {len(stream.sections)} sections",
           f".primal {FORMAT_VERSION}", ".meta " + meta_text]
    for name in sorted(arrays):
        a = np.asarray(arrays[name])
        problem = array_problem(name, a.dtype)
        if problem is not None:
            raise InputError("<disasm>", problem)
        a = np.asarray(a, dtype=a.dtype.newbyteorder("<"), order="C")
        out.append(f".data {name} {a.dtype.str} {json.dumps(list(a.shape), separators=(',', ':'))}")
        code = base64.b64encode(a.tobytes()).decode("ascii")
        out.extend(code[i : i + _B64_LINE] for i in range(0, len(code), _B64_LINE))
        out.append(".end")
    ptr, cts, pes = stream.group_ptr.tolist(), stream.group_ct.tolist(), stream.group_pe.tolist()
    for g in range(stream.num_groups):
        members = " ".join(f"{_ct(c)}:{'-' if p == ALL_PES else p}" for c, p in zip(cts[ptr[g]:ptr[g + 1]],
                                                                                  pes[ptr[g]:ptr[g + 1]]))
        out.append(f".group {g} {members}".rstrip())
    columns = [stream.records[name].tolist() for name in ("op", *ORDER)]
    sections = list(stream.sections)
    for i, (op, *values) in enumerate(zip(*columns)):
        while sections and sections[0].start == i:
            out.append(f".section {sections.pop(0).name}")
        out.append(_record_text(op, values))
    out.extend(f".section {s.name}" for s in sections)  # empty sections at the end
    return "\n".join(out) + "\n"


def _ct(value: int) -> str:
    return "ctl" if value == CONTROLLER else str(value)


def _record_text(op: int, values: list[int]) -> str:
    opcode = _OPCODE_OF[op]
    d = descriptor(opcode)
    parts = [opcode.name]
    for field, v in zip(ORDER, values):
        if field == "ct":
            parts.append(f"ct={_ct(v)}")
        elif field == "pe":
            parts.append(f"pe={('all' if d.whole_ct else '-') if v == ALL_PES else v}")
        elif field == "arg" and d.arg_enum is not None:
            mask = ARG_ENUM_MASK[opcode]
            rest = f"+{v & ~mask:#x}" if v & ~mask else ""
            parts.append(f"arg={d.arg_enum(v & mask).name}{rest}")
        elif v == _DEFAULT[field]:
            continue
        elif field in ("src_buf", "dst_buf"):
            parts.append(f"{field}={buf_name(v)}")
        elif field == "flags":
            parts.append("flags=" + "|".join(f"{f.name}" for f in Flag if v & f))
        elif field == "arg" and d.arg_hex:
            parts.append(f"arg={v:#x}")
        else:
            parts.append(f"{field}={v}")
    return " ".join(parts)


# --------------------------------------------------------------------------- assembler


def asm(text: str, where: str = "<text>") -> tuple[dict, dict[str, np.ndarray], Stream]:
    """(meta, arrays, stream) of assembly ``text``; InputError(where, "line N: ...") on any problem."""
    return _Assembler(where).run(text)


class _Assembler:
    def __init__(self, where: str) -> None:
        self.where = where
        self.line = 0
        self.version_seen = False
        self.meta: dict | None = None
        self.meta_line = 0
        self.arrays: dict[str, np.ndarray] = {}
        self.array_lines: dict[str, int] = {}
        self.counts: tuple[int, ...] | None = None  # records, groups, sections: declared by disasm's first line
        self.data: tuple[str, np.dtype, list[int], int, list[str]] | None = None  # open .data block
        self.group_sizes: list[int] = []
        self.group_members: list[tuple[int, int]] = []
        self.group_lines: list[int] = []
        self.sections: list[tuple[str, int, int]] = []  # name, start, line
        self.rows: list[tuple[int, ...]] = []
        self.row_lines: list[int] = []

    def fail(self, problem: str, line: int | None = None) -> InputError:
        return InputError(self.where, f"line {self.line if line is None else line}: {problem}")

    def run(self, text: str) -> tuple[dict, dict[str, np.ndarray], Stream]:
        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()  # the newline ending the last line
        declared = _COUNTS.fullmatch(lines[0].strip()) if lines else None
        self.counts = tuple(int(n) for n in declared.groups()) if declared else None
        for self.line, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith(";"):
                continue
            try:
                if self.data is not None:
                    self.data_line(self.data, line)
                elif not self.version_seen:
                    self.version(line)
                elif line.startswith("."):
                    self.directive(line)
                else:
                    self.record(line)
            except ValueError as exc:
                raise self.fail(str(exc)) from None
        if self.data is not None:
            raise self.fail(f".data {self.data[0]} is not closed by .end", self.data[3])
        if self.meta is None:
            raise self.fail("no .meta line")
        return self.finish(self.meta, len(lines))

    def version(self, line: str) -> None:
        if line.split()[0] != ".primal":
            raise ValueError(f"expected '.primal {FORMAT_VERSION}' before anything else")
        if line.split()[1:] != [str(FORMAT_VERSION)]:
            raise ValueError(f"text format {line[len('.primal'):].strip()!r}, this assembler reads {FORMAT_VERSION}")
        self.version_seen = True

    def directive(self, line: str) -> None:
        word, *tail = line.split(None, 1)
        rest = tail[0] if tail else ""
        args = rest.split()
        if word == ".meta":
            if self.meta is not None:
                raise ValueError(f".meta given twice (first on line {self.meta_line})")
            try:
                self.meta = plain_json(rest)
            except json.JSONDecodeError as exc:
                raise ValueError(f".meta: invalid JSON ({exc.msg} at column {exc.colno})") from None
            except ValueError as exc:
                raise ValueError(f".meta: {exc}") from None
            except RecursionError:
                raise ValueError(".meta: JSON nested too deeply") from None
            if not isinstance(self.meta, dict):
                raise ValueError(".meta: expected a JSON object")
            self.meta_line = self.line
        elif word == ".data":
            self.open_data(args)
        elif word == ".group":
            self.group(args)
        elif word == ".section":
            if len(args) != 1:
                raise ValueError(".section takes one name")
            self.sections.append((args[0], len(self.rows), self.line))
        elif word in (".primal", ".end"):
            raise ValueError(f"unexpected {word}")
        else:
            raise ValueError(f"unknown directive {word!r} (.primal, .meta, .data, .end, .group, .section)")

    def open_data(self, args: list[str]) -> None:
        if len(args) != 3:
            raise ValueError(".data takes NAME DTYPE SHAPE, e.g. .data kv_map <i4 [3,4]")
        name, dtype_text, shape_text = args
        if name in self.arrays:
            raise ValueError(f".data {name} given twice")
        try:
            dtype = np.dtype(dtype_text)
            shape = json.loads(shape_text)
        except (TypeError, ValueError):
            raise ValueError(f".data {name}: bad DTYPE {dtype_text!r} or SHAPE {shape_text!r}") from None
        if dtype.str != dtype_text or dtype.byteorder == ">":
            raise ValueError(f".data {name}: DTYPE {dtype_text!r} is not a canonical little-endian dtype (e.g. <i4)")
        if not isinstance(shape, list) or len(shape) > 32 or not all(type(n) is int and 0 <= n < 1 << 62
                                                                      for n in shape):
            raise ValueError(f".data {name}: SHAPE {shape_text!r} is not a list of non-negative integers")
        problem = array_problem(name, dtype)
        if problem is not None:
            raise ValueError(problem)
        self.data = (name, dtype, shape, self.line, [])
        self.array_lines[name] = self.line

    def data_line(self, data: tuple[str, np.dtype, list[int], int, list[str]], line: str) -> None:
        """One line inside the open ``.data`` block ``data``; ``.end`` closes it into an array."""
        if line != ".end":
            if line.startswith("."):
                raise ValueError(f".data {data[0]}: expected base64 lines or .end, got {line.split()[0]}")
            data[4].append(line)
            return
        name, dtype, shape, start, chunks = data
        try:
            raw = base64.b64decode("".join(chunks), validate=True)
        except binascii.Error as exc:
            raise self.fail(f".data {name}: bad base64 ({exc})", start) from None
        need = math.prod(shape) * dtype.itemsize
        if len(raw) != need:
            raise self.fail(f".data {name}: {len(raw)} bytes, shape {shape} of {dtype.str} needs {need}", start)
        self.arrays[name] = np.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)
        self.data = None

    def group(self, args: list[str]) -> None:
        if not args or args[0] != str(len(self.group_sizes)):
            raise ValueError(f".group ids must run 0, 1, 2...: expected .group {len(self.group_sizes)}")
        for member in args[1:]:
            ct, sep, pe = member.partition(":")
            if not sep:
                raise ValueError(f".group member {member!r} is not CT:PE")
            self.group_members.append((_value("ct", ct, 0), _value("pe", pe, 0)))
        self.group_sizes.append(len(args) - 1)
        self.group_lines.append(self.line)

    def record(self, line: str) -> None:
        name, *tokens = line.split()
        if name not in _OPCODE_NAMED:
            raise ValueError(f"unknown opcode {name!r}")
        op = _OPCODE_NAMED[name]
        values = dict(_DEFAULT)
        seen = set()
        for token in tokens:
            field, sep, text = token.partition("=")
            if not sep or field not in _DEFAULT:
                raise ValueError(f"unknown field {field!r} (fields: {', '.join(ORDER)})" if sep
                                 else f"{token!r} is not FIELD=VALUE")
            if field in seen:
                raise ValueError(f"field {field} given twice")
            seen.add(field)
            values[field] = _value(field, text, op)
        for field in ("ct", "pe"):
            if field not in seen:
                raise ValueError(f"{name} needs field {field}")
        self.rows.append((int(op), values["flags"], *(values[f] for f in ORDER[:-1])))
        self.row_lines.append(self.line)

    def finish(self, meta: dict, last: int) -> tuple[dict, dict[str, np.ndarray], Stream]:
        records = np.array(self.rows, dtype=RECORD) if self.rows else np.zeros(0, RECORD)
        members = np.array(self.group_members, dtype=np.uint16).reshape(-1, 2)
        sizes = np.array(self.group_sizes, dtype=np.int64)
        ptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        stops = [start for _, start, _ in self.sections[1:]] + [len(records)]
        sections = tuple(Section(name, start, stop) for (name, start, _), stop in zip(self.sections, stops))
        stream = Stream(records, ptr, members[:, 0].copy(), members[:, 1].copy(), sections)
        held = (len(records), len(sizes), len(sections))
        if self.counts is not None and self.counts != held:
            raise self.fail("the first line declares {} records, {} groups, {} sections but the text holds {}, {}, {} "
                            "(truncated? after editing on purpose, fix or delete this line)"
                            .format(*self.counts, *held), 1)
        problem = stream_problem(stream, meta)
        if problem is not None:
            lines = {"record": self.row_lines, "group": self.group_lines, "section": [s[2] for s in self.sections]}
            line = lines[problem.kind][problem.position] if problem.kind in lines else self.meta_line
            raise self.fail(problem.message, line)
        issue = compiled_issue(meta, self.arrays, stream) if is_compiled(meta) else None
        if issue is not None:
            keyed = {"array": self.array_lines, "section": {name: line for name, _, line in self.sections}}
            raise self.fail(issue.message, last if issue.kind == "end" else
                            keyed.get(issue.kind, {}).get(issue.key, self.meta_line))
        return meta, self.arrays, stream


def _value(field: str, text: str, op: int) -> int:
    """The integer of ``field=text`` in a record of opcode ``op``; ValueError naming the field."""
    if text == "-" and field in _NONE:
        return _NONE[field]
    if (field, text) in _WORDS:
        return _WORDS[field, text]
    if field in ("src_buf", "dst_buf"):
        kind, sep, index = text.partition(".")
        if not sep or kind not in BufKind.__members__:
            kinds = ", ".join(BufKind.__members__)
            raise ValueError(f"field {field}: {text!r} is not KIND.INDEX with KIND one of {kinds}")
        try:
            return buf(BufKind[kind], int(index, 0))
        except ValueError as exc:
            raise ValueError(f"field {field}: {text!r}: {exc}") from None
    if field == "flags":
        bad = [name for name in text.split("|") if name not in Flag.__members__]
        if bad:
            raise ValueError(f"field flags: unknown flag {bad[0]!r} ({', '.join(Flag.__members__)})")
        return sum({int(Flag[name]) for name in text.split("|")})
    enum = descriptor(op).arg_enum if field == "arg" else None
    if enum is not None:
        mask = ARG_ENUM_MASK[Opcode(op)]
        name, _, rest = text.partition("+")
        if name not in enum.__members__:
            raise ValueError(f"field arg: {name!r} is not in {enum.__name__} ({', '.join(enum.__members__)})")
        try:
            high = int(rest, 0) if rest else 0
        except ValueError:
            raise ValueError(f"field arg: {rest!r} is not an integer") from None
        if high & mask or not 0 <= high < 1 << 32:
            raise ValueError(f"field arg: {rest!r} overlaps the {enum.__name__} bits {mask:#x}")
        return int(enum[name]) | high
    try:
        value = int(text, 0)
    except ValueError:
        raise ValueError(f"field {field}: {text!r} is not an integer") from None
    bits = 8 * RECORD[field].itemsize
    if not 0 <= value < 1 << bits:
        raise ValueError(f"field {field}: {value} does not fit in {bits} bits")
    return value
