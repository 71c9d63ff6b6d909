"""The versioned binary program file (``program.primal``) and the legality check of a stream.

Layout (all integers little-endian; details in ``docs/isa.md``)::

    0   8 bytes   magic b"PRIMALPG"
    8   u32       format version (FORMAT_VERSION)
    12  u64       header length H (bytes, includes trailing space padding)
    20  u64       payload length P
    28  H bytes   header: UTF-8 JSON {"arrays": [...], "meta": {...}, "sections": [...]}
    28+H P bytes  payload: every array's raw bytes at its header offset (relative
                  to the payload, multiples of ALIGN, zero padding between)
    end 32 bytes  sha256 of every byte before it

Guarantees: :func:`save_program` writes atomically and byte-identically for
identical input, and refuses a stream that :func:`validate_stream` rejects;
:func:`load_program` returns exactly what was saved or raises
:class:`~primal_compiler.errors.InputError` naming the file and the field, and
never returns an illegal stream.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.isa.opcodes import (
    ALL_PES, ARG_ENUM_MASK, CONTROLLER, NONE16, NONE32, RECORD, ActFn, BufKind, DmacOp, Flag, Opcode, ReduceOp,
)
from primal_compiler.isa.stream import Section, Stream

MAGIC = b"PRIMALPG"
FORMAT_VERSION = 1
PROGRAM_FILE = "program.primal"  # name of the program file inside a compiled output directory
ALIGN = 32  # payload offset of every array, and the payload start, are multiples of this
_PREAMBLE = np.dtype([("magic", "S8"), ("version", "<u4"), ("header_len", "<u8"), ("payload_len", "<u8")])
_TRAILER = 32
STREAM_ARRAYS = ("stream.records", "stream.group_ptr", "stream.group_ct", "stream.group_pe")
META_INTS = ("num_cts", "mesh_rows", "mesh_cols", "num_layers")  # meta keys the legality check needs
NAME = re.compile(r"[A-Za-z0-9_.:/+=@-]+")  # array and section names: no whitespace, text-safe
_RECORD_DESCR = [list(f) for f in RECORD.descr]
_FLAG_BITS = sum(int(f) for f in Flag)
_STREAM_DTYPES = {"group_ptr": np.dtype("<i8"), "group_ct": np.dtype("<u2"), "group_pe": np.dtype("<u2")}


class Problem(NamedTuple):
    """First illegality found: ``kind`` is meta/stream/record/group/section, ``index`` its position."""

    kind: str
    index: int
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
        lambda v, o: f"{v:#x} sets bits outside {'|'.join(f.name for f in Flag)}"
    pg = (op == Opcode.PG_ON) | (op == Opcode.PG_OFF)
    yield "ct", (ct >= num_cts) & (ct != CONTROLLER), lambda v, o: f"{v} >= num_cts {num_cts}"
    yield "ct", pg & (ct == CONTROLLER), lambda v, o: f"{o} gates a CT, not the controller"
    whole = (pe == ALL_PES) & (pg | (ct == CONTROLLER))
    yield "pe", (pe >= pes) & ~whole, lambda v, o: (
        f"ALL_PES on {o} (only PG_ON, PG_OFF and controller records)" if v == ALL_PES
        else f"{v} >= mesh_rows*mesh_cols {pes}")
    yield "dst_ct", (r["dst_ct"] >= num_cts) & (r["dst_ct"] != NONE16) & (r["dst_ct"] != CONTROLLER), \
        lambda v, o: f"{v} >= num_cts {num_cts}"
    yield "dst_pe", (r["dst_pe"] >= pes) & (r["dst_pe"] != NONE16), lambda v, o: f"{v} >= mesh_rows*mesh_cols {pes}"
    yield "layer", (r["layer"] > layers) & (r["layer"] != NONE16), lambda v, o: f"{v} > num_layers {layers}"
    for field in ("src_buf", "dst_buf"):
        tag = r[field]
        yield field, ((tag >> 12) >= len(BufKind)) & (tag != NONE16), \
            lambda v, o: f"{v:#06x} has buffer kind {v >> 12}, not a BufKind (0..{len(BufKind) - 1})"
    grouped = (op == Opcode.BCAST) | (op == Opcode.REDUCE)
    group = r["group"]
    yield "group", grouped & (group == NONE32), lambda v, o: f"{o} needs a group"
    yield "group", ~grouped & (group != NONE32), lambda v, o: f"{v} on {o}: only BCAST and REDUCE use a group"
    yield "group", (group >= num_groups) & (group != NONE32), lambda v, o: f"{v} >= num_groups {num_groups}"
    yield "count", r["count"] == 0, lambda v, o: "0, must be >= 1"
    for opcode, enum in ((Opcode.ACT, ActFn), (Opcode.DMAC, DmacOp), (Opcode.REDUCE, ReduceOp)):
        yield "arg", (op == opcode) & ~np.isin(r["arg"] & ARG_ENUM_MASK[opcode], list(enum)), \
            lambda v, o, e=enum: f"{v} is not in {e.__name__} (0..{len(e) - 1}) for {o}"


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


# --------------------------------------------------------------------------- writing


@contextmanager
def atomic_open(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file that replaces ``path`` only if the block succeeds (temp file in the same directory)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise InputError(str(path), f"cannot write: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save_program(path: str | os.PathLike, meta: dict, arrays: Mapping[str, np.ndarray], stream: Stream) -> None:
    """Write one program file atomically and deterministically.

    ``meta`` must be plain JSON holding the integers of :data:`META_INTS`; raises
    ``InputError(path, ...)`` (writing nothing) if it is not, or if the stream or an array is illegal.
    """
    where = str(path)
    validate_stream(stream, meta, where)
    plain = {}
    for name in sorted(arrays):
        a = np.asarray(arrays[name])
        problem = array_problem(name, a.dtype)
        if problem is not None:
            raise InputError(where, problem)
        plain[name] = np.asarray(a, dtype=a.dtype.newbyteorder("<"), order="C")
    columns = (stream.records, stream.group_ptr, stream.group_ct, stream.group_pe)
    stored = {name: np.asarray(a, order="C") for name, a in zip(STREAM_ARRAYS, columns)} | plain
    table, offset = [], 0
    for name, a in stored.items():
        dtype = _RECORD_DESCR if name == "stream.records" else a.dtype.str
        table.append({"name": name, "dtype": dtype, "shape": list(a.shape), "offset": offset, "nbytes": a.nbytes})
        offset = -(-(offset + a.nbytes) // ALIGN) * ALIGN
    sections = [[s.name, s.start, s.stop] for s in stream.sections]
    try:
        text = json.dumps({"arrays": table, "meta": meta, "sections": sections},
                          sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise InputError(where, f"meta: not plain JSON ({exc})") from None
    text += b" " * (-(_PREAMBLE.itemsize + len(text)) % ALIGN)
    payload_len = table[-1]["offset"] + table[-1]["nbytes"]
    preamble = np.array((MAGIC, FORMAT_VERSION, len(text), payload_len), dtype=_PREAMBLE).tobytes()
    digest = hashlib.sha256()
    with atomic_open(path) as f:
        def put(chunk) -> None:
            f.write(chunk)
            digest.update(chunk)
        put(preamble)
        put(text)
        end = 0
        for entry, a in zip(table, stored.values()):
            put(bytes(entry["offset"] - end))
            put(a.reshape(-1).view(np.uint8))
            end = entry["offset"] + entry["nbytes"]
        f.write(digest.digest())


# --------------------------------------------------------------------------- reading


def load_program(path: str | os.PathLike, target=None) -> tuple[dict, dict[str, np.ndarray], Stream]:
    """(meta, arrays, stream) of a program file, checked byte by byte; InputError(path, ...) on any problem.

    With ``target`` (anything with ``.name`` and ``.content_hash``) the file must
    have been compiled for exactly that target (``meta['target']``, ``meta['target_hash']``).
    """
    where = str(path)
    data = _read(path)
    head = data[: _PREAMBLE.itemsize]
    if not data or not MAGIC.startswith(bytes(head[:8])):
        raise InputError(where, f"magic: not a PRIMAL program file (starts with {bytes(head[:8])!r}, not {MAGIC!r})")
    if len(head) < _PREAMBLE.itemsize:
        raise InputError(where, f"truncated: {len(data)} bytes, shorter than the {_PREAMBLE.itemsize}-byte preamble")
    pre = np.frombuffer(head, dtype=_PREAMBLE)[0]
    if pre["version"] != FORMAT_VERSION:
        raise InputError(where, f"format version: the file has version {pre['version']}, "
                                f"this compiler reads version {FORMAT_VERSION}; recompile the program")
    start = _PREAMBLE.itemsize + int(pre["header_len"])
    expected = start + int(pre["payload_len"]) + _TRAILER
    if len(data) < expected:
        raise InputError(where, f"truncated: the file has {len(data)} bytes, its preamble declares {expected}")
    if len(data) > expected:
        raise InputError(where, f"length: the file has {len(data)} bytes, its preamble declares {expected}")
    if hashlib.sha256(memoryview(data)[:-_TRAILER]).digest() != bytes(data[-_TRAILER:]):
        raise InputError(where, "checksum: sha256 mismatch, the file is corrupted")
    try:
        header = json.loads(bytes(data[_PREAMBLE.itemsize:start]).decode("utf-8"))
        meta, table, sections = header["meta"], header["arrays"], header["sections"]
        stored = {e["name"]: _array(data, start, int(pre["payload_len"]), e) for e in table}
        if len(stored) != len(table):
            raise ValueError("an array name is used twice")
        stream = Stream(*(stored.pop(name) for name in STREAM_ARRAYS),
                        tuple(Section(name, begin, stop) for name, begin, stop in sections))
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        raise InputError(where, f"header: {exc}") from None
    validate_stream(stream, meta, where)
    if target is not None:
        _check_target(where, meta, target)
    return meta, stored, stream


def _read(path: str | os.PathLike) -> bytearray:
    """The whole file in one writable buffer, so the arrays viewing it are writable."""
    try:
        with open(path, "rb") as f:
            data = bytearray(os.fstat(f.fileno()).st_size)
            got = f.readinto(data)
    except OSError as exc:
        raise InputError(str(path), f"cannot read: {exc.strerror}") from None
    return data[:got] if got < len(data) else data


def _array(data: bytearray, start: int, payload_len: int, entry: dict) -> np.ndarray:
    """One array of the table, its entry checked against the payload; ValueError on a bad entry."""
    name, shape, offset, nbytes = entry["name"], entry["shape"], entry["offset"], entry["nbytes"]
    if name == "stream.records":
        if entry["dtype"] != _RECORD_DESCR:
            raise ValueError("stream.records: dtype is not the IPCN record layout of this format version")
        dtype = RECORD
    else:
        dtype = np.dtype(entry["dtype"])
        if dtype.str != entry["dtype"] or dtype.byteorder == ">":
            raise ValueError(f"{name}: dtype {entry['dtype']!r} is not a canonical little-endian dtype string")
        problem = None if name in STREAM_ARRAYS else array_problem(name, dtype)
        if problem is not None:
            raise ValueError(problem)
    if not all(type(n) is int and n >= 0 for n in [*shape, offset, nbytes]):
        raise ValueError(f"{name}: shape, offset and nbytes must be non-negative integers")
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes != size or offset % ALIGN or offset + nbytes > payload_len:
        raise ValueError(f"{name}: {nbytes} bytes at offset {offset} do not fit shape {shape} or the payload")
    count = nbytes // dtype.itemsize
    return np.frombuffer(data, dtype=dtype, count=count, offset=start + offset).reshape(shape)


def _check_target(where: str, meta: Mapping[str, Any], target) -> None:
    name, digest = meta.get("target"), meta.get("target_hash")
    if name != target.name or digest != target.content_hash:
        raise InputError(where, f"target: compiled for target {name} (hash {str(digest)[:16]}), "
                                f"not {target.name} (hash {target.content_hash[:16]})")
