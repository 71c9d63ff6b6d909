"""Edited program files for the loader fuzz: a real compiled program, mutants of it, and their consumers.

:func:`base_program` compiles tiny-llama (LoRA q,v:8, pipeline ``fast``,
bundled ``primal-7nm``) once and returns its file bytes. :func:`mutants` is a
hypothesis strategy of files derived from it by up to three stacked edits of
the header JSON (meta keys, types and values; the array table; the section
list), of array contents, dtypes and shapes, of records and the group table,
or of raw payload bytes, each re-packed with a correct sha256 (:func:`pack`,
:func:`pack_parts`: the container layout without any legality check), so
only the loader's own checks stand between an edit and the consumers.
:func:`consume` feeds one file to everything a user can point at it:
``load_program``, ``disasm`` and ``asm`` of that text, ``collect.load_compiled``,
``collect.replay_report``, ``Compiled.program`` (what the functional replay runs) and
``viz.data.load``; any exception but ``InputError`` escapes to the caller.
Used by tests/isa/test_loader_fuzz.py (short budget) and benchmarks/fuzz.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from primal_compiler.errors import InputError
from primal_compiler.isa.container import ALIGN, FORMAT_VERSION, MAGIC, STREAM_ARRAYS, load_program, save_program
from primal_compiler.isa.opcodes import CONTROLLER, NONE16, NONE32, RECORD

_PRE = struct.Struct("<8sIQQ")
RECORD_DESCR = [list(f) for f in RECORD.descr]


# --------------------------------------------------------------------------- the container, re-packed


def pack(header: dict | bytes, payload: bytes, version: int = FORMAT_VERSION) -> bytes:
    """A program file holding ``header`` (a dict, dumped as save_program does but NaN allowed) and ``payload``."""
    text = header if isinstance(header, bytes) else json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-(_PRE.size + len(text)) % ALIGN)
    body = _PRE.pack(MAGIC, version, len(text), len(payload)) + text + payload
    return body + hashlib.sha256(body).digest()


def unpack(data: bytes) -> tuple[dict, bytes]:
    """(header, payload) of a file written by :func:`pack` or save_program."""
    _, _, header_len, payload_len = _PRE.unpack_from(data)
    start = _PRE.size + header_len
    return json.loads(data[_PRE.size:start]), data[start : start + payload_len]


def pack_parts(meta: object, arrays: dict[str, np.ndarray], sections: list) -> bytes:
    """A file whose array table matches ``arrays`` (in the given order) exactly, whatever they hold."""
    table, chunks, offset = [], [], 0
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        dtype = RECORD_DESCR if a.dtype == RECORD else a.dtype.str
        table.append({"name": name, "dtype": dtype, "shape": list(a.shape), "offset": offset, "nbytes": a.nbytes})
        chunks.append((offset, a.tobytes()))
        offset = -(-(offset + a.nbytes) // ALIGN) * ALIGN
    payload = bytearray(max([o + len(c) for o, c in chunks], default=0))
    for o, c in chunks:
        payload[o : o + len(c)] = c
    return pack({"arrays": table, "meta": meta, "sections": sections}, bytes(payload))


def parts(data: bytes) -> tuple[dict, dict[str, np.ndarray], list]:
    """(meta, arrays with the stream's four first, sections) of a legal file, as independent copies."""
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "p.primal").write_bytes(data)
        meta, arrays, stream = load_program(Path(d) / "p.primal")
    columns = (stream.records, stream.group_ptr, stream.group_ct, stream.group_pe)
    out = {name: a.copy() for name, a in zip(STREAM_ARRAYS, columns)} | {k: arrays[k].copy() for k in sorted(arrays)}
    return json.loads(json.dumps(meta)), out, [[s.name, s.start, s.stop] for s in stream.sections]


@lru_cache(maxsize=None)
def base_program(lora: str | None = "q,v:8", pipeline: str = "fast") -> bytes:
    """The bytes of tiny-llama compiled with ``pipeline`` for primal-7nm (what ``primal compile`` writes)."""
    from primal_compiler.api import compile_model
    from primal_compiler.compiled import program_file
    from primal_compiler.frontend import load_model
    from primal_compiler.target import load_target

    target = load_target("primal-7nm")
    program = compile_model(load_model("tiny-llama", lora), target, pipeline)
    meta, arrays = program_file(program, target)
    with tempfile.TemporaryDirectory() as d:
        save_program(Path(d) / "p.primal", meta, arrays, program.stream)
        return (Path(d) / "p.primal").read_bytes()


# --------------------------------------------------------------------------- edits

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=6),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                    max_leaves=6)
EDGES = (0, 1, -1, 2, 3, 7, 8, 31, 32, 63, 64, 255, 256, 1023, 1024, 4095, 65533, CONTROLLER, NONE16, 65536,
         2**31 - 1, 2**31, NONE32, 2**32, 2**62, -2**31)
STRINGS = ("", "primal-7nm", "primal-5nm", "h100", "tiny-llama", "x" * 300, "prefill:0", "decode:0", "adapter:0",
           "prefill:1", "decode:1", "adapter:1", "prefill:00", "decode", "a b", "stream.records", "<i4", "|b1", "<u2")


def _paths(value: object, path: tuple = ()) -> list[tuple]:
    """Every key path into a JSON value (dict keys and list indices), the value's own path first."""
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:4]):
            out += _paths(v, (*path, i))
    return out


def _near(draw, value: object) -> object:
    """A replacement for ``value``: a near or boundary value of its type, another type, or any JSON."""
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(JSON)
    if type(value) is int and kind == 1:
        return draw(st.sampled_from([value - 1, value + 1, value * 2, -value, value // 2, 0]))
    if type(value) is int:
        return draw(st.sampled_from([float(value), str(value), bool(value % 2), None, [value], *EDGES]))
    if isinstance(value, float):  # an earlier edit may have left inf or nan, which have no int
        whole = int(value) if math.isfinite(value) else 0
        return draw(st.sampled_from([whole, -value, 0.0, float("nan"), float("inf"), 1e308, str(value)]))
    if isinstance(value, str):
        return draw(st.sampled_from(STRINGS))
    return draw(st.sampled_from([None, {}, [], 0, "", draw(JSON)]))


def edit_json(draw, root: object) -> object:
    """``root`` with one value replaced, deleted, duplicated or added somewhere inside it."""
    path = draw(st.sampled_from(_paths(root)))
    if not path:
        return _near(draw, root)
    parent = root
    for k in path[:-1]:
        parent = parent[k]
    key, action = path[-1], draw(st.sampled_from(["replace", "replace", "replace", "delete", "add"]))
    if action == "delete":
        del parent[key]
    elif action == "add" and isinstance(parent, dict):
        parent[draw(st.sampled_from(["extra", "format", "seed", "kv", "model_ir", "num_cts", "package_cols"]))] = \
            draw(JSON)
    elif action == "add":
        parent.insert(key, draw(JSON))
    else:
        parent[key] = _near(draw, parent[key])
    return root


def _cast(values, dtype: np.dtype) -> np.ndarray:
    """Python ints or floats as ``dtype``, wrapping like a C cast."""
    return np.asarray(values, dtype=np.float64 if dtype.kind in "fc" else np.int64).astype(dtype)


def edit_array(draw, a: np.ndarray, context: dict) -> np.ndarray:
    """``a`` with entries set to boundary values, cut, extended, reshaped, re-typed, permuted or emptied."""
    typed = a.dtype != RECORD
    kinds = ["set"] * 4 * typed + ["dtype"] * typed + ["cut", "grow", "reshape", "shuffle", "empty"]
    action = draw(st.sampled_from(kinds))
    flat = a.reshape(-1)
    if not len(flat) and action != "dtype":
        return np.zeros(draw(st.integers(1, 3)), dtype=a.dtype)
    if action == "set":
        values = [*EDGES, *context.values(), *(v + d for v in context.values() for d in (-1, 1))]
        idx = draw(st.lists(st.integers(0, len(flat) - 1), min_size=1, max_size=3))
        out = flat.copy()
        out[idx] = _cast([draw(st.sampled_from(values)) for _ in idx], a.dtype)
        return out.reshape(a.shape)
    if action == "cut":
        return flat[: draw(st.integers(0, len(flat) - 1))].copy()
    if action == "grow":
        return np.concatenate([flat, flat[draw(st.lists(st.integers(0, len(flat) - 1), min_size=1, max_size=3))]])
    if action == "dtype":
        return flat.astype(draw(st.sampled_from(["<i2", "<i4", "<i8", "<u2", "|u1", "|i1", "<f8", "|b1", ">i4"])))
    if action == "reshape":
        return np.concatenate([flat, flat[:1]] if len(flat) % 2 else [flat]).reshape(2, -1)
    if action == "shuffle":
        return flat[np.random.default_rng(draw(st.integers(0, 2**32 - 1))).permutation(len(flat))]
    return flat[:0].copy()


def _shift(sections: list, boundary) -> list:
    """Sections with every start/stop moved by ``boundary`` (left alone unless they are [name, int, int])."""
    if not isinstance(sections, list) or not all(
            isinstance(x, list) and len(x) == 3 and all(type(v) is int for v in x[1:]) for x in sections):
        return sections
    return [[name, boundary(a), boundary(b)] for name, a, b in sections]


def edit_records(draw, arrays: dict, sections: list, context: dict) -> list:
    """A field of a few records set to a boundary value, or records dropped, duplicated or swapped (in
    ``arrays``); dropping and duplicating move the section bounds and, often, the srpg schedule with them.
    Returns the sections."""
    if "stream.records" not in arrays or not len(arrays["stream.records"]):
        return sections
    out = arrays["stream.records"].copy()
    n = len(out)
    action = draw(st.sampled_from(["field", "field", "field", "drop", "dup", "swap"]))
    idx = sorted(set(draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3))))
    where = np.asarray(idx)
    if action == "field":
        field = draw(st.sampled_from(RECORD.names))
        values = [*EDGES, *context.values(), *range(14), *(v + d for v in context.values() for d in (-1, 1))]
        out[field][idx] = _cast([draw(st.sampled_from(values)) for _ in idx], RECORD[field])
    elif action == "swap" and n > 1:
        out[[idx[0], -1]] = out[[-1, idx[0]]]
    elif action in ("drop", "dup"):
        if action == "drop":
            out = np.delete(out, where)
            move = lambda i: np.asarray(i) - np.searchsorted(where, i)  # noqa: E731
        else:
            out = np.insert(out, idx[0], out[where])
            move = lambda i: np.asarray(i) + len(idx) * (np.asarray(i) > idx[0])  # noqa: E731
        sections = _shift(sections, lambda b: int(move(b)))
        if draw(st.booleans()):
            for name in ("pg_on", "pg_off"):
                if name in arrays and arrays[name].dtype.kind == "i":
                    arrays[name] = move(arrays[name]).astype(arrays[name].dtype)
    arrays["stream.records"] = out
    return sections


@st.composite
def mutants(draw, lora: str | None = "q,v:8", pipeline: str = "fast", base=None) -> bytes:
    """A file derived from :func:`base_program` ``(lora, pipeline)`` (or from ``base()``) by one to three
    stacked edits."""
    meta, arrays, sections = parts(base() if base is not None else base_program(lora, pipeline))
    edits = draw(st.lists(st.sampled_from(["meta", "meta", "array", "array", "records", "sections", "table", "bytes"]),
                          min_size=1, max_size=3))
    context = {"num_cts": meta["num_cts"], "pes": meta["mesh_rows"] * meta["mesh_cols"],
               "records": len(arrays["stream.records"]), "tiles": len(arrays["tile_ct"]),
               "groups": len(arrays["stream.group_ptr"]) - 1, "layers": meta["num_layers"]}
    raw = None
    for kind in edits:
        if kind == "meta":
            meta = edit_json(draw, meta)
        elif kind == "array":
            name = draw(st.sampled_from(sorted(arrays)))
            if draw(st.integers(0, 9)) == 0:
                del arrays[name]
            else:
                arrays[name] = edit_array(draw, arrays[name], context)
        elif kind == "records":
            sections = edit_records(draw, arrays, sections, context)
        elif kind == "sections":
            sections = edit_json(draw, sections)
        else:
            raw = kind
    data = pack_parts(meta, arrays, sections)
    if raw == "table":  # the array table or the header's shape, payload kept
        header, payload = unpack(data)
        return pack(edit_json(draw, header), payload)
    if raw == "bytes":  # payload bytes flipped, checksum recomputed
        header, payload = unpack(data)
        payload = bytearray(payload)
        for i in draw(st.lists(st.integers(0, len(payload) - 1), min_size=1, max_size=4)):
            payload[i] ^= draw(st.integers(1, 255))
        return pack(header, bytes(payload))
    return data


@lru_cache(maxsize=None)
def base_text(lora: str | None = "q,v:8", pipeline: str = "fast") -> str:
    """The disasm text of :func:`base_program`."""
    from primal_compiler.isa.text import disasm

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "p.primal").write_bytes(base_program(lora, pipeline))
        return disasm(*load_program(Path(d) / "p.primal"))


@st.composite
def edited_texts(draw, lora: str | None = "q,v:8", pipeline: str = "fast") -> str:
    """:func:`base_text` cut short, or with lines deleted, duplicated or swapped, or a token changed."""
    lines = base_text(lora, pipeline).split("\n")
    for _ in range(draw(st.integers(1, 2))):
        if not lines:
            break
        action = draw(st.sampled_from(["cut", "delete", "duplicate", "swap", "token", "token", "header"]))
        i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
        if action == "cut":
            lines = lines[:i]
        elif action == "delete":
            del lines[i : i + draw(st.integers(1, 3))]
        elif action == "duplicate":
            lines.insert(j, lines[i])
        elif action == "swap":
            lines[i], lines[j] = lines[j], lines[i]
        elif action == "header":
            lines = lines[1:]
        elif lines[i].split():
            tokens = lines[i].split(" ")
            k = draw(st.integers(0, len(tokens) - 1))
            key = tokens[k].partition("=")[0] + "=" if "=" in tokens[k] else ""
            value = draw(st.sampled_from([*map(str, EDGES), "-", "ctl", "all", "x", "", "IN.0x1", "SILU", "0x"]))
            tokens[k] = key + value
            lines[i] = " ".join(tokens)
    return "\n".join(lines)


# --------------------------------------------------------------------------- consumers


def assemble(text: str, directory: Path) -> str:
    """Assemble ``text``; a program it returns must save and load (then go through :func:`consume`)."""
    from primal_compiler.isa.text import asm

    try:
        meta, arrays, stream = asm(text, "edited.s")
    except InputError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("edited.s: line ")
        return "refused"
    path = directory / "program.primal"
    save_program(path, meta, arrays, stream)  # an InputError here is an escape: asm accepted what save refuses
    return "assembled, " + consume(path)


def consume(path: Path) -> str:
    """Feed the file at ``path`` to every consumer; the last stage it reached. Only InputError is caught."""
    from primal_compiler.report import collect
    from primal_compiler.isa.text import asm, disasm
    from primal_compiler.viz import data as viz_data

    try:
        meta, arrays, stream = load_program(path)
    except InputError:
        return "refused"
    text = disasm(meta, arrays, stream)  # a loaded program always has a text form, and it assembles back
    again = asm(text, str(path))
    assert disasm(*again) == text
    try:
        c = collect.load_compiled(path, None)
    except InputError:
        return "plain"
    outcome = "replayed"
    for stage in (lambda: collect.replay_report(c), lambda: viz_data.load(path)):
        try:
            stage()
        except InputError as exc:
            assert "\n" not in str(exc)
            outcome = "replay refused"
    try:
        c.program()  # what load_compiled accepts becomes its Program, or an InputError naming the file
    except InputError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
        outcome = "program refused"
    return outcome


# --------------------------------------------------------------------------- the functional replay

FUNCTIONAL = "opt_lora_qv_r4_optimum"  # a fixture with biases, learned positions and LoRA on q, v
PROMPT = [3, 1, 4, 1, 5]


@lru_cache(maxsize=None)
def functional_setup() -> tuple[bytes, object]:
    """(program file bytes, target) of the OPT LoRA fixture compiled for a 3-token functional replay on the
    small-crossbar target of tests/functional."""
    from primal_compiler.compiled import program_file
    from primal_compiler.target import load_target, with_overrides
    from tests.functional.conftest import compiled

    target = with_overrides(load_target("primal-7nm"), {
        "ct.mesh_rows": 4, "ct.mesh_cols": 4, "rram.rows": 16, "rram.cols": 16, "rram.rows_active_per_read": 8,
        "rram.adcs_per_macro": 4, "sram.rows": 16, "router.scratchpad_bytes": 2048})
    program = compiled(FUNCTIONAL, target, len(PROMPT), 3)
    meta, arrays = program_file(program, target)
    with tempfile.TemporaryDirectory() as d:
        save_program(Path(d) / "p.primal", meta, arrays, program.stream)
        return (Path(d) / "p.primal").read_bytes(), target


def consume_functional(path: Path) -> str:
    """Load the file for the functional replay's target and replay it on the fixture's weights."""
    from primal_compiler.compiled import Compiled
    from primal_compiler.functional import replay_functional
    from tests.functional.conftest import fixture

    target = functional_setup()[1]
    try:
        meta, arrays, stream = load_program(path, target, require_compiled=True)
        program = Compiled(meta, arrays, stream, target, str(path)).program()
    except InputError:
        return "refused"
    try:
        replay_functional(program, target, fixture(FUNCTIONAL), prompt=PROMPT, generate=3, where=str(path))
    except InputError as exc:
        assert "\n" not in str(exc)
        return "replay refused"
    return "replayed"
