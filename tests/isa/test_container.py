"""Program file: round trip, determinism, corruption, version, target and field legality."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from primal_compiler.errors import InputError
from primal_compiler.isa import container
from primal_compiler.isa.container import FORMAT_VERSION, MAGIC, load_program, save_program, validate_stream
from primal_compiler.isa import opcodes
from primal_compiler.isa.opcodes import ALL_PES, CONTROLLER, NONE16, NONE32, BufKind, Opcode
from primal_compiler.isa.stream import Section, Stream

from . import small_program


def assert_same(a, b) -> None:
    """Two (meta, arrays, stream) triples hold the same values and dtypes."""
    assert a[0] == b[0]
    assert sorted(a[1]) == sorted(b[1])
    for name in a[1]:
        assert a[1][name].dtype == b[1][name].dtype and a[1][name].shape == b[1][name].shape
        np.testing.assert_array_equal(a[1][name], b[1][name])
    for field in ("records", "group_ptr", "group_ct", "group_pe"):
        x, y = getattr(a[2], field), getattr(b[2], field)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes()
    assert a[2].sections == b[2].sections


def forge(path, meta, arrays, stream, monkeypatch) -> None:
    """Write a file with a correct checksum but without the legality check."""
    with monkeypatch.context() as m:
        m.setattr(container, "validate_stream", lambda *args: None)
        save_program(path, meta, arrays, stream)


def with_field(stream: Stream, index: int, **fields) -> Stream:
    records = stream.records.copy()
    for name, value in fields.items():
        records[name][index] = value
    return Stream(records, stream.group_ptr, stream.group_ct, stream.group_pe, stream.sections)


def test_round_trip_is_exact_and_deterministic(tmp_path):
    program = small_program()
    save_program(tmp_path / "a.primal", *program)
    save_program(tmp_path / "b.primal", *small_program())
    data = (tmp_path / "a.primal").read_bytes()
    assert data == (tmp_path / "b.primal").read_bytes()
    loaded = load_program(tmp_path / "a.primal")
    assert_same(loaded, program)
    save_program(tmp_path / "c.primal", *loaded)
    assert (tmp_path / "c.primal").read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.primal", "b.primal", "c.primal"]  # no temp files left
    loaded[1]["kv_map"][0, 0, 0] = 7  # arrays are writable


def test_layout(tmp_path):
    save_program(tmp_path / "p", *small_program())
    data = (tmp_path / "p").read_bytes()
    assert data[:8] == MAGIC and int.from_bytes(data[8:12], "little") == FORMAT_VERSION
    header_len, payload_len = int.from_bytes(data[12:20], "little"), int.from_bytes(data[20:28], "little")
    assert len(data) == 28 + header_len + payload_len + 32 and (28 + header_len) % container.ALIGN == 0
    assert data[-32:] == hashlib.sha256(data[:-32]).digest()
    header = json.loads(data[28 : 28 + header_len])
    names = [e["name"] for e in header["arrays"]]
    assert names == [*container.STREAM_ARRAYS, "empty", "gated", "kv_map", "placement.ct", "power_w"]
    assert header["sections"] == [["prefill", 0, 16], ["decode", 16, 35]]
    records = header["arrays"][0]
    start = 28 + header_len + records["offset"]
    assert data[start : start + records["nbytes"]] == small_program()[2].records.tobytes()


def test_empty_stream_round_trips(tmp_path):
    meta = small_program()[0]
    empty = Stream(np.zeros(0, container.RECORD), np.zeros(1, np.int64), np.zeros(0, np.uint16), np.zeros(0, np.uint16))
    save_program(tmp_path / "p", meta, {}, empty)
    assert_same(load_program(tmp_path / "p"), (meta, {}, empty))


@pytest.mark.parametrize("where", [0, 7, 8, 11, 12, 19, 20, 27, 28, 60, "header_end", "records", "group", "array", -1])
def test_any_flipped_byte_is_caught(tmp_path, where):
    path = tmp_path / "p.primal"
    save_program(path, *small_program())
    data = bytearray(path.read_bytes())
    header_len = int.from_bytes(data[12:20], "little")
    start = 28 + header_len
    position = {"header_end": start - 1, "records": start + 32 * 5 + 2, "group": start + 35 * 32 + 8,
                "array": len(data) - 40}.get(where, where)
    data[position] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(InputError) as exc:
        load_program(path)
    assert exc.value.where == str(path) and str(exc.value).startswith(f"{path}: ")


@pytest.mark.parametrize("keep", [0, 5, 27, 100, 1000, -32, -1])
def test_truncation_is_caught(tmp_path, keep):
    path = tmp_path / "p.primal"
    save_program(path, *small_program())
    data = path.read_bytes()
    path.write_bytes(data[:keep])
    with pytest.raises(InputError, match="magic" if keep == 0 else "truncated") as exc:
        load_program(path)
    assert exc.value.where == str(path)


def test_trailing_bytes_are_caught(tmp_path):
    path = tmp_path / "p.primal"
    save_program(path, *small_program())
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(InputError, match="length: the file has"):
        load_program(path)


def test_other_format_version_names_both(tmp_path):
    path = tmp_path / "p.primal"
    save_program(path, *small_program())
    data = bytearray(path.read_bytes())
    data[8:12] = (FORMAT_VERSION + 1).to_bytes(4, "little")
    data[-32:] = hashlib.sha256(data[:-32]).digest()
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=f"file has version {FORMAT_VERSION + 1}, this compiler reads version "
                                         f"{FORMAT_VERSION}") as exc:
        load_program(path)
    assert exc.value.where == str(path)


def test_not_a_program_file(tmp_path):
    path = tmp_path / "p.primal"
    path.write_bytes(b"PK\x03\x04 a zip file, not a program")
    with pytest.raises(InputError, match="magic: not a PRIMAL program"):
        load_program(path)
    with pytest.raises(InputError, match="missing.primal: no such program file"):
        load_program(tmp_path / "missing.primal")
    with pytest.raises(InputError, match="is a directory, not a program file"):
        load_program(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(InputError, match="fifo: is a FIFO, not a regular program file"):  # refused, never opened
        load_program(tmp_path / "fifo")


def test_target_must_match(tmp_path):
    path = tmp_path / "p.primal"
    meta = small_program()[0]
    save_program(path, *small_program())
    load_program(path, SimpleNamespace(name=meta["target"], content_hash=meta["target_hash"]))
    other = SimpleNamespace(name=meta["target"], content_hash="cd" * 32)
    with pytest.raises(InputError, match=r"target: compiled for target primal-7nm \(hash abab.*\), not primal-7nm "
                                         r"\(hash cdcd"):
        load_program(path, other)
    with pytest.raises(InputError, match="not primal-5nm"):
        load_program(path, SimpleNamespace(name="primal-5nm", content_hash=meta["target_hash"]))


ILLEGAL = [  # (record, fields, message)
    (5, {"ct": 300}, "record 5 field ct: 300 >= num_cts 3"),
    (3, {"op": 200}, "record 3 field op: 200 is not an opcode"),
    (5, {"group": 3}, "record 5 field group: 3 >= num_groups 3"),
    (5, {"group": NONE32}, "record 5 field group: BCAST needs a group"),
    (8, {"group": 0}, "record 8 field group: 0 on SMAC_RRAM: only BCAST and REDUCE use a group"),
    (8, {"pe": 16}, "record 8 field pe: 16 >= mesh_rows*mesh_cols 16"),
    (8, {"pe": ALL_PES}, "record 8 field pe: ALL_PES on SMAC_RRAM"),
    (0, {"ct": CONTROLLER}, "record 0 field ct: PG_ON gates a CT, not the controller"),
    (4, {"dst_ct": 3}, "record 4 field dst_ct: 3 >= num_cts 3"),
    (4, {"dst_pe": 99}, "record 4 field dst_pe: 99 >= mesh_rows*mesh_cols 16"),
    (8, {"layer": 3}, "record 8 field layer: 3 > num_layers 2"),
    (8, {"src_buf": len(BufKind) << 12},
     f"record 8 field src_buf: {len(BufKind) << 12:#06x} has buffer kind {len(BufKind)}"),
    (8, {"dst_buf": 0xFFFE}, "record 8 field dst_buf: 0xfffe has buffer kind 15"),
    (8, {"count": 0}, "record 8 field count: 0, must be >= 1"),
    (8, {"flags": 0x81}, "record 8 field flags: 0x81 sets bits outside"),
    (2, {"arg": 19}, "record 2 field arg: 19 is not in ActFn (0..18) for ACT"),
    (19, {"arg": 2}, "record 19 field arg: 2 is not in DmacOp (0..1) for DMAC"),
    (14, {"arg": 9}, "record 14 field arg: 9 is not in ReduceOp (0..1) for REDUCE"),
    # operands the executor indexes with: units of a PE, routes to a destination
    (8, {"ct": CONTROLLER, "pe": ALL_PES}, "record 8 field ct: SMAC_RRAM runs on a PE of a CT, not the controller"),
    (19, {"ct": CONTROLLER}, "record 19 field ct: DMAC runs on a PE of a CT, not the controller"),
    (4, {"dst_ct": NONE16}, "record 4 field dst_ct: CONFIG needs a destination CT, got none"),
    (4, {"dst_ct": CONTROLLER}, "record 4 field dst_ct: CONFIG writes into a CT, not the controller"),
    (21, {"dst_ct": CONTROLLER}, "record 21 field dst_ct: KV_APPEND writes into a CT, not the controller"),
    (23, {"dst_ct": NONE16}, "record 23 field dst_ct: REDUCE needs a destination CT or ctl, got none"),
    (3, {"dst_pe": NONE16}, "record 3 field dst_pe: UNICAST to a CT needs a destination PE, got none"),
]


@pytest.mark.parametrize("index, fields, message", ILLEGAL)
def test_loader_rejects_illegal_fields(tmp_path, monkeypatch, index, fields, message):
    meta, arrays, stream = small_program()
    bad = with_field(stream, index, **fields)
    path = tmp_path / "p.primal"
    forge(path, meta, arrays, bad, monkeypatch)
    with pytest.raises(InputError) as exc:
        load_program(path)
    assert exc.value.where == str(path) and exc.value.problem.startswith(message)
    with pytest.raises(InputError, match="^<stream>: " + re.escape(message)):
        validate_stream(bad, meta)
    with pytest.raises(InputError):
        save_program(tmp_path / "q.primal", meta, arrays, bad)
    assert not (tmp_path / "q.primal").exists()


def test_first_failure_counts_the_others():
    meta, _, stream = small_program()
    records = stream.records.copy()
    records["ct"][[9, 12]] = 7
    bad = Stream(records, stream.group_ptr, stream.group_ct, stream.group_pe, stream.sections)
    with pytest.raises(InputError, match=r"record 9 field ct: 7 >= num_cts 3 \(and 1 more\)$"):
        validate_stream(bad, meta, "x")


@pytest.mark.parametrize("change, message", [
    (lambda s: (s.group_ct.__setitem__(5, 3), s)[1], "group 1 member 1 field ct: 3 >= num_cts 3"),
    (lambda s: (s.group_pe.__setitem__(2, 16), s)[1], "group 0 member 2 field pe: 16 >= mesh_rows*mesh_cols 16"),
    (lambda s: (s.group_pe.__setitem__(0, ALL_PES), s)[1], "group 0 member 0 field pe: 65535"),
    (lambda s: Stream(s.records, s.group_ptr[:-1], s.group_ct, s.group_pe, s.sections), "stream group_ptr"),
    (lambda s: Stream(s.records, s.group_ptr.astype(np.int32), s.group_ct, s.group_pe, s.sections), "stream group_ptr"),
    (lambda s: Stream(s.records, s.group_ptr, s.group_ct, s.group_pe, ()), "record 0: in no section"),
    (lambda s: Stream(s.records, s.group_ptr, s.group_ct, s.group_pe, s.sections[:1]), "record 16: in no section"),
    (lambda s: Stream(s.records, s.group_ptr, s.group_ct, s.group_pe,
                      (Section("a", 0, 10), Section("b", 9, 35))), "section 1 b: starts at 9, overlapping"),
    (lambda s: Stream(s.records, s.group_ptr, s.group_ct, s.group_pe,
                      (Section("a", 0, 10), Section("b", 11, 35))), "record 10: in no section"),
    (lambda s: Stream(s.records, s.group_ptr, s.group_ct, s.group_pe,
                      (Section("a", 0, 10), Section("a", 10, 35))), "section 1 a: the name is used twice"),
    (lambda s: Stream(s.records, s.group_ptr, s.group_ct, s.group_pe,
                      (Section("a b", 0, 35),)), "section 0: name 'a b'"),
    (lambda s: Stream(s.records, s.group_ptr, s.group_ct, s.group_pe,
                      (Section("a", 0, 36),)), "section a: stops at 36 > 35 records"),
])
def test_groups_and_sections_are_checked(tmp_path, monkeypatch, change, message):
    meta, arrays, stream = small_program()
    bad = change(stream)
    with pytest.raises(InputError, match="^<stream>: " + re.escape(message)):
        validate_stream(bad, meta)
    if bad.group_ptr.dtype == np.int64 and len(bad.group_ptr) == 4:  # representable in a file
        forge(tmp_path / "p", meta, arrays, bad, monkeypatch)
        with pytest.raises(InputError, match=re.escape(message)):
            load_program(tmp_path / "p")


@pytest.mark.parametrize("meta, message", [
    ({"num_cts": 3, "mesh_rows": 4, "mesh_cols": 4}, "meta num_layers: expected an integer, got None"),
    ({"num_cts": 0, "mesh_rows": 4, "mesh_cols": 4, "num_layers": 2}, "meta num_cts: 0 is outside 1..65534"),
    ({"num_cts": 3, "mesh_rows": 4.0, "mesh_cols": 4, "num_layers": 2}, "meta mesh_rows: expected an integer"),
    ({"num_cts": 3, "mesh_rows": 256, "mesh_cols": 256, "num_layers": 2}, "meta mesh_rows*mesh_cols: 65536"),
])
def test_meta_is_checked(meta, message):
    with pytest.raises(InputError, match=re.escape(message)):
        validate_stream(small_program()[2], meta)


@pytest.mark.parametrize("name, array, message", [
    ("stream.records", np.zeros(3), "reserved"),
    ("has space", np.zeros(3), "array name 'has space'"),
    ("", np.zeros(3), "array name ''"),
    ("objs", np.array([None, 1], dtype=object), "not a plain number type"),
    ("text", np.array(["a"]), "not a plain number type"),
])
def test_save_rejects_bad_arrays_and_writes_nothing(tmp_path, name, array, message):
    meta, arrays, stream = small_program()
    with pytest.raises(InputError, match=message):
        save_program(tmp_path / "p", meta, arrays | {name: array}, stream)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", [float("nan"), float("inf"), object()])
def test_save_rejects_meta_that_is_not_plain_json(tmp_path, value):
    meta, arrays, stream = small_program()
    with pytest.raises(InputError, match="meta: not plain JSON"):
        save_program(tmp_path / "p", meta | {"bad": value}, arrays, stream)
    assert list(tmp_path.iterdir()) == []


def test_big_endian_and_strided_arrays_are_stored_little_endian(tmp_path):
    meta, arrays, stream = small_program()
    big = np.arange(10, dtype=">i4")[::2]
    save_program(tmp_path / "p", meta, {"big": big}, stream)
    loaded = load_program(tmp_path / "p")[1]["big"]
    assert loaded.dtype == np.dtype("<i4") and loaded.tolist() == [0, 2, 4, 6, 8]


def test_failed_save_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "p.primal"
    save_program(path, *small_program())
    before = path.read_bytes()
    meta, arrays, stream = small_program()
    with pytest.raises(InputError):
        save_program(path, meta, arrays, with_field(stream, 0, op=Opcode.BCAST))
    assert path.read_bytes() == before and list(tmp_path.iterdir()) == [path]


def test_docs_name_everything_in_opcodes():
    """docs/isa.md stays in step with opcodes.py: every enum member and record field is documented."""
    text = (Path(__file__).parents[2] / "docs" / "isa.md").read_text()
    enums = (opcodes.Opcode, opcodes.ActFn, opcodes.DmacOp, opcodes.ReduceOp, opcodes.Flag, opcodes.BufKind,
             opcodes.HiddenBuf)
    names = [rf"\b{m.value}\W+`{m.name}`" for enum in enums for m in enum] + [f"`{f}`" for f in opcodes.RECORD.names]
    missing = [n for n in names if not re.search(n, text)]
    assert not missing, f"docs/isa.md lacks {missing}"


def test_save_replaces_a_file_only_with_force(tmp_path):
    path = tmp_path / "p.primal"
    path.write_bytes(b"a user's file")
    with pytest.raises(InputError, match="exists; pass --force"):
        save_program(path, *small_program())
    assert path.read_bytes() == b"a user's file"
    save_program(path, *small_program(), force=True)
    assert load_program(path)[2].records.size
