"""Assembly text: exact round trips both ways, line-numbered errors, and the asm/disasm commands."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from primal_compiler.cli import main
from primal_compiler.errors import InputError
from primal_compiler.isa.container import PROGRAM_FILE, load_program, save_program
from primal_compiler.isa.legality import INTO_CT, ON_PE, ROUTED
from primal_compiler.isa.opcodes import (
    ALL_PES, CONTROLLER, NONE16, NONE32, RECORD, SHARD_FNS, ActFn, BufKind, DmacOp, Flag, Opcode, ReduceOp,
)
from primal_compiler.isa.stream import Section, Stream
from primal_compiler.isa.text import asm, disasm

from . import small_program
from .test_container import assert_same

BASE = """\
; a hand-written program
.primal 2
.meta {"mesh_cols":4,"mesh_rows":4,"num_cts":2,"num_layers":1}
.group 0 0:1 0:2
.section main
BCAST ct=0 pe=0 src_buf=IN.0x0 group=0 nbytes=8
ACT ct=0 pe=1 count=4 arg=SILU
"""


def edit(lineno: int, new: str) -> str:
    lines = BASE.split("\n")
    lines[lineno - 1] = new
    return "\n".join(lines)


def test_binary_text_binary_is_byte_identical(tmp_path):
    save_program(tmp_path / "a.primal", *small_program())
    text = disasm(*load_program(tmp_path / "a.primal"))
    save_program(tmp_path / "b.primal", *asm(text))
    assert (tmp_path / "b.primal").read_bytes() == (tmp_path / "a.primal").read_bytes()


def test_text_binary_text_is_identical(tmp_path):
    text = disasm(*small_program())
    assert_same(asm(text), small_program())
    save_program(tmp_path / "p", *asm(text, "x.s"))
    assert disasm(*load_program(tmp_path / "p")) == text
    assert disasm(*small_program()) == text  # deterministic


def test_canonical_text_reads_well():
    text = disasm(*small_program())
    assert ".primal 2\n.meta {" in text and "\n.group 2 ctl:-\n" in text
    assert "\n.data gated |b1 []\nAQ==\n.end\n" in text
    assert "\n.section prefill\nPG_ON ct=0 pe=all flags=PREFILL\n" in text and "\n.section decode\n" in text
    assert ("REDUCE ct=1 pe=7 dst_ct=1 dst_pe=7 layer=1 src_buf=PSUM.0x2 dst_buf=ROOT.0x105 group=1 nbytes=64 "
            "arg=SOFTMAX_MERGE flags=PREFILL\n") in text
    assert "\nMASK ct=1 pe=6 arg=0xa\n" in text and "\nSYNC ct=ctl pe=- arg=2\n" in text
    assert "SMAC_SRAM ct=1 pe=6 layer=1 count=8 arg=1 flags=PREFILL|SKIPPED\n" in text


def test_hand_written_text_any_order_and_defaults():
    text = edit(6, "  BCAST\tnbytes=0x8 src_buf=IN.0 group=0 pe=0 ct=0 flags=- dst_pe=- layer=-  \r") + "\n; end\n\n"
    meta, arrays, stream = asm(text)
    assert meta == {"mesh_cols": 4, "mesh_rows": 4, "num_cts": 2, "num_layers": 1} and arrays == {}
    assert stream.sections == (Section("main", 0, 2),) and stream.group_ct.tolist() == [0, 0]
    r = stream.records
    assert r["op"].tolist() == [Opcode.BCAST, Opcode.ACT] and r["nbytes"].tolist() == [8, 0]
    assert r["layer"].tolist() == [NONE16, NONE16] and r["arg"][1] == ActFn.SILU and r["count"].tolist() == [1, 4]
    assert disasm(meta, arrays, stream) == BASE.replace("; a hand-written program", "; PRIMAL IPCN program: "
                                                        "2 records, 1 groups, 1 sections")


@pytest.mark.parametrize("lineno, new, message", [
    (6, "BCST ct=0 pe=0 group=0", "line 6: unknown opcode 'BCST'"),
    (6, "BCAST ct=0 pe=0 group=0 dst=IN.0x0", "line 6: unknown field 'dst'"),
    (6, "BCAST ct=0 pe=0 group=0 nbytes", "line 6: 'nbytes' is not FIELD=VALUE"),
    (6, "BCAST ct=0 pe=0 group=0 nbytes=1 nbytes=2", "line 6: field nbytes given twice"),
    (6, "BCAST pe=0 group=0", "line 6: BCAST needs field ct"),
    (6, "BCAST ct=0 pe=65536 group=0", "line 6: field pe: 65536 does not fit in 16 bits"),
    (6, "BCAST ct=0 pe=0 group=0 count=-1", "line 6: field count: -1 does not fit in 32 bits"),
    (6, "BCAST ct=0 pe=0 group=0 count=x", "line 6: field count: 'x' is not an integer"),
    (6, "BCAST ct=0 pe=0 group=0 flags=PREFILL|BOGUS", "line 6: field flags: unknown flag 'BOGUS'"),
    (7, "ACT ct=0 pe=1 arg=7", "line 7: field arg: '7' is not in ActFn"),
    (6, "BCAST ct=0 pe=0 group=0 src_buf=FOO.0x1", "line 6: field src_buf: 'FOO.0x1' is not KIND.INDEX"),
    (6, "BCAST ct=0 pe=0 group=0 src_buf=IN.0x1000", "line 6: field src_buf: 'IN.0x1000': buffer index 4096"),
    (6, "BCAST ct=2 pe=0 group=0", "line 6: record 0 field ct: 2 >= num_cts 2"),
    (6, "BCAST ct=0 pe=0 group=1", "line 6: record 0 field group: 1 >= num_groups 1"),
    (6, "BCAST ct=0 pe=0", "line 6: record 0 field group: BCAST needs a group"),
    (7, "ACT ct=0 pe=16 arg=SILU", "line 7: record 1 field pe: 16 >= mesh_rows*mesh_cols 16"),
    (7, "ACT ct=0 pe=1 arg=SILU layer=2", "line 7: record 1 field layer: 2 > num_layers 1"),
    (4, ".group 0 0:1 2:2", "line 4: group 0 member 1 field ct: 2 >= num_cts 2"),
    (4, ".group 1 0:1", "line 4: .group ids must run 0, 1, 2...: expected .group 0"),
    (4, ".group 0 0-1", "line 4: .group member '0-1' is not CT:PE"),
    (5, ".sektion main", "line 5: unknown directive '.sektion'"),
    (5, ".section a b", "line 5: .section takes one name"),
    (5, ".section a;b", "line 5: section 0: name 'a;b'"),
    (5, "; no section", "line 6: record 0: in no section"),
    (2, ".primal 3", "line 2: text format '3', this assembler reads 2"),
    (2, "; no version", "line 3: expected '.primal 2' before anything else"),
    (3, ".meta {bad", "line 3: .meta: invalid JSON"),
    (3, ".meta []", "line 3: .meta: expected a JSON object"),
    (3, '.meta {"x":NaN}', "line 3: .meta: NaN is not a JSON number"),
    (3, '.meta {"num_cts":2}', "line 3: meta mesh_rows: expected an integer, got None"),
    (3, "; no meta", "line 7: no .meta line"),
    (5, ".meta {}", "line 5: .meta given twice (first on line 3)"),
    (5, ".end", "line 5: unexpected .end"),
    (7, ".data x <i4 [2]", "line 7: .data x is not closed by .end"),
    (7, ".data x <i4 [2]\nAAAA\n.end", "line 7: .data x: 3 bytes, shape [2] of <i4 needs 8"),
    (7, ".data x <i4 [2]\nA!!A\n.end", "line 7: .data x: bad base64"),
    (7, ".data x <i4 [2]\n.group 1\n.end", "line 8: .data x: expected base64 lines or .end, got .group"),
    (7, ".data x int32 [2]", "line 7: .data x: DTYPE 'int32' is not a canonical little-endian dtype"),
    (7, ".data x >i4 [2]", "line 7: .data x: DTYPE '>i4' is not a canonical little-endian dtype"),
    (7, ".data x |O [2]", "line 7: array x: dtype object is not a plain number type"),
    (7, ".data stream.x <i4 [2]", "line 7: array name 'stream.x': the prefix 'stream.' is reserved"),
    (7, ".data x <i4 [-1]", "line 7: .data x: SHAPE '[-1]' is not a list of non-negative integers"),
    (7, ".data x <i4", "line 7: .data takes NAME DTYPE SHAPE"),
    (7, ".data x <i4 []\nAAAAAA==\n.end\n.data x <i4 []", "line 10: .data x given twice"),
])
def test_errors_name_the_line(lineno, new, message):
    with pytest.raises(InputError) as exc:
        asm(edit(lineno, new), "prog.s")
    assert exc.value.where == "prog.s" and exc.value.problem.startswith(message), exc.value.problem


# --------------------------------------------------------------------------- property


@st.composite
def programs(draw):
    """A random legal (meta, arrays, stream)."""
    num_cts, rows, cols, layers = (draw(st.integers(1, 5)), draw(st.integers(1, 4)), draw(st.integers(1, 4)),
                                   draw(st.integers(0, 3)))
    pes = rows * cols
    meta = {"num_cts": num_cts, "mesh_rows": rows, "mesh_cols": cols, "num_layers": layers,
            "name": draw(st.text(max_size=5)), "x": draw(st.floats(allow_nan=False, allow_infinity=False))}
    members = draw(st.lists(st.one_of(st.tuples(st.integers(0, num_cts - 1), st.integers(0, pes - 1)),
                                      st.just((CONTROLLER, ALL_PES))), max_size=8))
    cuts = sorted(draw(st.lists(st.integers(0, len(members)), min_size=1, max_size=3)))
    ptr = np.array([0, *cuts, len(members)], np.int64)
    u32 = st.integers(0, 0xFFFFFFFF)
    kinds = st.builds(lambda k, i: k << 12 | i, st.integers(0, len(BufKind) - 1), st.integers(0, 4095))
    rows_ = []
    for _ in range(draw(st.integers(0, 25))):
        op = draw(st.sampled_from(Opcode))
        pg = op in (Opcode.PG_ON, Opcode.PG_OFF)
        on_ct = pg or op in ON_PE
        ct = draw(st.integers(0, num_cts - 1) if on_ct else st.sampled_from([CONTROLLER, *range(num_cts)]))
        pe = ALL_PES if pg or (ct == CONTROLLER and draw(st.booleans())) else draw(st.integers(0, pes - 1))
        group = draw(st.integers(0, len(ptr) - 2)) if op in (Opcode.BCAST, Opcode.REDUCE) else NONE32
        enum = {Opcode.ACT: ActFn, Opcode.DMAC: DmacOp, Opcode.REDUCE: ReduceOp}.get(op)
        arg = int(draw(st.sampled_from(enum))) if enum else draw(u32)
        if op == Opcode.ACT and arg in SHARD_FNS:
            arg |= 1 << 8  # a shard of one element per vector divides every count
        dst_ct = draw(st.sampled_from([*range(num_cts)] if op in INTO_CT else [CONTROLLER, *range(num_cts)]
                                      if op in ROUTED else [NONE16, CONTROLLER, *range(num_cts)]))
        needs_pe = op in ROUTED and dst_ct < num_cts
        dst_pe = draw(st.sampled_from([*range(pes)] if needs_pe else [NONE16, *range(pes)]))
        rows_.append((op, draw(st.integers(0, sum(int(f) for f in Flag))), ct, pe,
                      dst_ct, dst_pe,
                      draw(st.sampled_from([NONE16, *range(layers + 1)])), draw(st.one_of(st.just(NONE16), kinds)),
                      draw(st.one_of(st.just(NONE16), kinds)), group, draw(st.integers(1, 0xFFFFFFFF)), draw(u32), arg))
    records = np.array(rows_, dtype=RECORD) if rows_ else np.zeros(0, RECORD)
    bounds = sorted(draw(st.lists(st.integers(0, len(records)), max_size=2)))
    edges = [0, *bounds, len(records)]
    sections = tuple(Section(f"s{k}", a, b) for k, (a, b) in enumerate(zip(edges, edges[1:])))
    stream = Stream(records, ptr, np.array([m[0] for m in members], np.uint16).reshape(-1),
                    np.array([m[1] for m in members], np.uint16).reshape(-1), sections)
    dtypes = st.sampled_from(["<i4", "<u2", "|u1", "<f8", "<f4", "|b1", "<c16", "<i8"])
    arrays = {}
    for k in range(draw(st.integers(0, 3))):
        dtype = np.dtype(draw(dtypes))
        shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
        size = dtype.itemsize * int(np.prod(shape))
        raw = draw(st.binary(min_size=size, max_size=size))
        arrays[f"a{k}"] = np.frombuffer(raw, dtype=np.uint8).astype(bool).view(dtype).reshape(shape) \
            if dtype.kind == "b" else np.frombuffer(raw, dtype=dtype).reshape(shape)
    return meta, arrays, stream


@settings(max_examples=40, deadline=None)
@given(programs())
def test_random_legal_programs_round_trip(tmp_path_factory, program):
    path = tmp_path_factory.mktemp("p") / "p.primal"
    save_program(path, *program)
    data = path.read_bytes()
    text = disasm(*load_program(path))
    again = asm(text)
    assert disasm(*again) == text
    save_program(path, *again, force=True)
    assert path.read_bytes() == data


# --------------------------------------------------------------------------- CLI


def test_cli_asm_then_disasm(tmp_path, capsys):
    text = disasm(*small_program())
    (tmp_path / "p.s").write_text(text)
    out = tmp_path / "compiled"
    out.mkdir()
    assert main(["asm", str(tmp_path / "p.s"), "-o", str(out / PROGRAM_FILE)]) == 0
    assert "35 records, 3 groups, 2 sections" in capsys.readouterr().out
    assert main(["disasm", str(out / PROGRAM_FILE)]) == 0
    assert capsys.readouterr().out == text
    assert main(["disasm", str(out), "-o", str(tmp_path / "q.s")]) == 0  # a directory holding program.primal
    assert (tmp_path / "q.s").read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compiled", "p.s", "q.s"]


def test_cli_failures_exit_2_and_write_nothing(tmp_path, capsys):
    (tmp_path / "bad.s").write_text(edit(6, "BCST ct=0 pe=0"))
    assert main(["asm", str(tmp_path / "bad.s"), "-o", str(tmp_path / "p.primal")]) == 2
    err = capsys.readouterr().err
    assert err == f"primal: {tmp_path / 'bad.s'}: line 6: unknown opcode 'BCST'\n"
    save_program(tmp_path / "p.primal", *small_program())
    before = (tmp_path / "p.primal").read_bytes()
    assert main(["asm", str(tmp_path / "bad.s"), "-o", str(tmp_path / "p.primal"), "--force"]) == 2
    assert (tmp_path / "p.primal").read_bytes() == before  # the old program is kept, even with --force
    (tmp_path / "p.primal").write_bytes(before[:-1] + bytes([before[-1] ^ 1]))
    assert main(["disasm", str(tmp_path / "p.primal"), "-o", str(tmp_path / "p.txt")]) == 2
    assert main(["disasm", str(tmp_path / "missing")]) == 2
    assert main(["asm", str(tmp_path / "missing.s"), "-o", str(tmp_path / "q.primal")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and "line 6" in err[0] and "checksum" in err[1] and "missing: no such program file" in err[2]
    assert "missing.s: no such program text" in err[3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.s", "p.primal"]
    assert not any("Traceback" in line for line in err)
