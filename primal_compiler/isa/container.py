"""The versioned binary program file (``program.primal``): writing it, and loading it through every check.

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
identical input, and refuses (writing nothing) whatever :func:`load_program`
would refuse: an illegal stream (:mod:`~primal_compiler.isa.legality`), and for
a compiled program (meta ``format`` "primal-program") anything
:mod:`~primal_compiler.isa.schema` rejects. :func:`load_program` returns
exactly what was saved or raises :class:`~primal_compiler.errors.InputError`
naming the file and the field; it never returns an illegal stream, nor a
compiled program whose parts disagree, so every consumer (executor, hop
validation, viz, functional replay, disasm) can index one part with another.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.inputs import PROGRAM_LIMIT_BYTES, regular_file
from primal_compiler.isa.legality import array_problem, validate_stream
from primal_compiler.isa.opcodes import RECORD
from primal_compiler.isa.schema import check_compiled, is_compiled, tiles_issue
from primal_compiler.isa.stream import Section, Stream
from primal_compiler.outdir import output_file

MAGIC = b"PRIMALPG"
FORMAT_VERSION = 2
PROGRAM_FILE = "program.primal"  # name of the program file inside a compiled output directory
ALIGN = 32  # payload offset of every array, and the payload start, are multiples of this
_PREAMBLE = np.dtype([("magic", "S8"), ("version", "<u4"), ("header_len", "<u8"), ("payload_len", "<u8")])
_TRAILER = 32
STREAM_ARRAYS = ("stream.records", "stream.group_ptr", "stream.group_ct", "stream.group_pe")
_RECORD_DESCR = [list(f) for f in RECORD.descr]
_STREAM_DTYPES: dict[str, np.dtype] = {"stream.group_ptr": np.dtype("<i8"), "stream.group_ct": np.dtype("<u2"),
                  "stream.group_pe": np.dtype("<u2")}


# --------------------------------------------------------------------------- writing


def save_program(path: str | os.PathLike, meta: dict, arrays: Mapping[str, np.ndarray], stream: Stream,
                 force: bool = False, inputs: tuple[str, ...] = ()) -> None:
    """Write one program file atomically and deterministically.

    ``meta`` must be plain JSON holding the integers of :data:`~primal_compiler.isa.legality.META_INTS`;
    raises ``InputError(path, ...)`` (writing nothing) if it is not, if the stream or an array is
    illegal, or if a compiled program's parts fail :func:`~primal_compiler.isa.schema.check_compiled`.
    An existing ``path`` is replaced only with ``force``; ``path`` may not be one of ``inputs``
    (:func:`primal_compiler.outdir.output_file`).
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
    if is_compiled(meta):
        check_compiled(meta, plain, stream, where)
    columns = (stream.records, stream.group_ptr, stream.group_ct, stream.group_pe)
    stored = {name: np.asarray(a, order="C") for name, a in zip(STREAM_ARRAYS, columns)} | plain
    table: list[dict[str, Any]] = []
    offset = 0
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
    with output_file(path, force, inputs=inputs) as f:
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


def program_path(path: str | os.PathLike) -> Path:
    """The program file ``path`` names: itself, or the :data:`PROGRAM_FILE` of a compile output directory."""
    p = Path(path)
    if p.is_dir():
        if not (p / PROGRAM_FILE).exists():
            raise InputError(str(p), f"no program here (expected a {PROGRAM_FILE} file or a directory holding one)")
        return p / PROGRAM_FILE
    return p


def is_program_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a regular file starting with :data:`MAGIC` (never opens a FIFO or device)."""
    p = Path(path)
    try:
        if not p.is_file():
            return False
        with open(p, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def program_sha256(path: str | os.PathLike) -> str:
    """The sha256 a program file carries in its last 32 bytes (of every byte before them), in hex: what names
    the program a saved report was made from. Read as stored; :func:`load_program` is what checks it."""
    try:
        with open(path, "rb") as f:
            f.seek(-_TRAILER, os.SEEK_END)
            return f.read(_TRAILER).hex()
    except OSError as exc:
        raise InputError(str(path), f"cannot read its checksum: {exc.strerror or exc}") from None


def load_program(path: str | os.PathLike, target=None,
                 require_compiled: bool = False) -> tuple[dict, dict[str, np.ndarray], Stream]:
    """(meta, arrays, stream) of a program file, checked byte by byte; InputError(path, ...) on any problem.

    Checks, in order: the file (a regular file of at most PROGRAM_LIMIT_BYTES), magic, version, length,
    sha256, the header (JSON without NaN or infinities; every array entry's name, dtype, shape, offset and
    size within the payload, no two overlapping), the stream's legality, and for a compiled program (meta
    ``format`` "primal-program", or any file when ``require_compiled``) every key, array and section
    :mod:`~primal_compiler.isa.schema` names. With ``target`` (anything with ``.name`` and
    ``.content_hash``; a PRIMAL target also has ``.ct``, ``.rram``, ``.sram``) the file must have been
    compiled for exactly that target (:func:`check_target`).
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
        meta, stored, stream = _parse_header(data, start, int(pre["payload_len"]))
    except (ValueError, TypeError, KeyError, UnicodeDecodeError, OverflowError) as exc:
        raise InputError(where, f"header: {exc}") from None
    except RecursionError:
        raise InputError(where, "header: JSON nested too deeply") from None
    validate_stream(stream, meta, where)
    if require_compiled or is_compiled(meta):
        check_compiled(meta, stored, stream, where)
    if target is not None:
        check_target(where, meta, stored, target)
    return meta, stored, stream


def _read(path: str | os.PathLike) -> bytearray:
    """The whole file in one writable buffer, so the arrays viewing it are writable."""
    p = regular_file(path, PROGRAM_LIMIT_BYTES, "program file")
    try:
        with open(p, "rb") as f:
            data = bytearray(os.fstat(f.fileno()).st_size)
            got = f.readinto(data)
    except OSError as exc:
        raise InputError(str(path), f"cannot read: {exc.strerror}") from None
    return data[:got] if got < len(data) else data


def plain_json(text: str) -> Any:
    """``json.loads`` refusing NaN, Infinity and numbers too large for a float (ValueError)."""
    def number(token: str) -> float:
        value = float(token)
        if not math.isfinite(value):
            raise ValueError(f"number {token[:20]} is out of range")
        return value

    def constant(name: str) -> None:
        raise ValueError(f"{name} is not a JSON number")

    return json.loads(text, parse_float=number, parse_constant=constant)


_HEADER_KEYS, _ENTRY_KEYS = ["arrays", "meta", "sections"], ["dtype", "name", "nbytes", "offset", "shape"]


def _parse_header(data: bytearray, start: int, payload_len: int) -> tuple[dict, dict[str, np.ndarray], Stream]:
    """Meta, named arrays and stream of the header at ``data[28:start]``; ValueError/TypeError on a bad entry."""
    header = plain_json(bytes(data[_PREAMBLE.itemsize:start]).decode("utf-8"))
    if not isinstance(header, dict) or sorted(header) != _HEADER_KEYS:
        raise ValueError(f"expected a JSON object with exactly the keys {', '.join(_HEADER_KEYS)}")
    meta, table, sections = header["meta"], header["arrays"], header["sections"]
    if not isinstance(table, list) or not all(isinstance(e, dict) and sorted(e) == _ENTRY_KEYS for e in table):
        raise ValueError(f"arrays: expected a list of objects with exactly the keys {', '.join(_ENTRY_KEYS)}")
    if not isinstance(sections, list) or not all(isinstance(s, list) and len(s) == 3 for s in sections):
        raise ValueError("sections: expected a list of [name, start, stop]")
    stored, end = {}, 0
    for e in table:
        if not isinstance(e["name"], str) or e["name"] in stored:
            raise ValueError(f"array name {e['name']!r} is not a string or is used twice")
        stored[e["name"]] = _array(data, start, payload_len, e)
        if e["offset"] < end:
            raise ValueError(f"{e['name']}: offset {e['offset']} overlaps the array before it (which ends at {end})")
        end = e["offset"] + e["nbytes"]
    missing = [name for name in STREAM_ARRAYS if name not in stored]
    if missing:
        raise ValueError(f"no array {missing[0]} (the instruction stream)")
    records, group_ptr, group_ct, group_pe = (stored.pop(name) for name in STREAM_ARRAYS)
    stream = Stream(records, group_ptr, group_ct, group_pe,
                    tuple(Section(name, begin, stop) for name, begin, stop in sections))
    return meta, stored, stream


def _array(data: bytearray, start: int, payload_len: int, entry: dict) -> np.ndarray:
    """One array of the table, its entry checked against the payload; ValueError on a bad entry."""
    name, shape, offset, nbytes = entry["name"], entry["shape"], entry["offset"], entry["nbytes"]
    dtype: np.dtype
    if name == "stream.records":
        if entry["dtype"] != _RECORD_DESCR:
            raise ValueError("stream.records: dtype is not the IPCN record layout of this format version")
        dtype = RECORD
    else:
        if not isinstance(entry["dtype"], str):
            raise ValueError(f"{name}: dtype {entry['dtype']!r} is not a dtype string")
        dtype = np.dtype(entry["dtype"])
        if dtype.str != entry["dtype"] or dtype.byteorder == ">":
            raise ValueError(f"{name}: dtype {entry['dtype']!r} is not a canonical little-endian dtype string")
        want = _STREAM_DTYPES.get(name)
        problem = array_problem(name, dtype) if want is None else \
            None if dtype == want else f"{name}: dtype {entry['dtype']!r}, expected {want.str!r}"
        if problem is not None:
            raise ValueError(problem)
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in [*shape, offset, nbytes]):
        raise ValueError(f"{name}: shape, offset and nbytes must be non-negative integers")
    fits = len(shape) <= 32 and nbytes == math.prod(shape) * dtype.itemsize
    if not fits or offset % ALIGN or offset + nbytes > payload_len:
        raise ValueError(f"{name}: {nbytes} bytes at offset {offset} do not fit shape {shape} or the payload")
    count = nbytes // dtype.itemsize
    return np.frombuffer(data, dtype=dtype, count=count, offset=start + offset).reshape(shape)


def check_target(where: str, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray], target) -> None:
    """InputError unless ``meta`` names ``target`` (name and content hash) and its PE mesh (``target.ct``),
    and a compiled program's tile table is what lowering its ``model_ir`` for ``target`` gives."""
    name, digest = meta.get("target"), meta.get("target_hash")
    if name != target.name or digest != target.content_hash:
        raise InputError(where, f"target: compiled for target {name} (hash {str(digest)[:16]}), "
                                f"not {target.name} (hash {target.content_hash[:16]})")
    ct = getattr(target, "ct", None)
    if ct is not None and (meta["mesh_rows"], meta["mesh_cols"]) != (ct.mesh_rows, ct.mesh_cols):
        raise InputError(where, f"meta mesh_rows, mesh_cols: {meta['mesh_rows']}x{meta['mesh_cols']}, but target "
                                f"{target.name} has {ct.mesh_rows}x{ct.mesh_cols} PEs per CT")
    issue = tiles_issue(meta, arrays, target) if is_compiled(meta) else None
    if issue is not None:
        raise InputError(where, issue.message)
