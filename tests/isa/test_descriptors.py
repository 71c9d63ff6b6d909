"""The opcode descriptor table: complete, consistent with the rules it names, and the source of docs/isa.md."""

from __future__ import annotations

import dataclasses
from enum import IntEnum
from pathlib import Path

import numpy as np
import pytest

from primal_compiler.errors import InputError
from primal_compiler.executor import costs
from primal_compiler.functional import replay
from primal_compiler.isa import descriptors
from primal_compiler.isa.descriptors import (
    DESCRIPTORS, UNIT_KINDS, Access, At, Buffer, Extent, PathClass, access_text, descriptor, missing,
    opcode_table_markdown, with_opcode_table,
)
from primal_compiler.isa.opcodes import RECORD, Flag, Opcode, empty
from primal_compiler.viz.trace import UNIT_TRACK, UNITS

DOC = Path(__file__).resolve().parents[2] / "docs" / "isa.md"
REGENERATE = "python -m primal_compiler.isa.descriptors docs/isa.md"
_FLAG_BITS = sum(int(f) for f in Flag)
#: The fields a footprint's place, buffer and extent are computed from (keyed by member: the enums share values).
_NEEDS = {(At, "DESTINATION"): ("dst_ct", "dst_pe"), (At, "MEMBERS"): ("group",), (Buffer, "SRC_BUF"): ("src_buf",),
          (Buffer, "DST_BUF"): ("dst_buf",), (Buffer, "SRAM_SLOT"): ("arg",), (Buffer, "KV_CHUNK"): ("arg",),
          (Extent, "MOVE_SRC"): ("arg",), (Extent, "MOVE_DST"): ("arg",), (Extent, "REDUCE_SRC"): ("arg",),
          (Extent, "REDUCE_DST"): ("arg",), (Extent, "TOKEN_SLOTS"): ("arg", "count"), (Extent, "SLOT_BIT"): ("arg",)}


def test_the_table_is_complete():
    assert missing() == []
    assert set(DESCRIPTORS) == set(Opcode)


@pytest.mark.parametrize("op", list(Opcode), ids=lambda o: o.name)
def test_every_entry_is_given(op):
    d = descriptor(op)
    assert d is DESCRIPTORS[op] and d.opcode == op
    for name in ("summary", "fields", "arg", "unit", "cost_rule", "functional_rule"):
        assert getattr(d, name), f"{op.name}: empty {name}"
    assert d.unit in UNIT_KINDS, f"{op.name}: unit {d.unit!r} is not one of {UNIT_KINDS}"
    assert isinstance(d.path_class, PathClass)
    assert set(d.fields) <= set(RECORD.names) - {"op"}, f"{op.name}: fields {d.fields} not all RECORD fields"
    assert len(set(d.fields)) == len(d.fields)
    assert d.arg_enum is None or issubclass(d.arg_enum, IntEnum)


@pytest.mark.parametrize("op", list(Opcode), ids=lambda o: o.name)
def test_footprints_are_valid(op):
    d = descriptor(op)
    for a in d.reads + d.writes:
        assert isinstance(a, Access)
        assert isinstance(a.at, At) and isinstance(a.buffer, Buffer) and isinstance(a.extent, Extent)
        assert a.flags & ~_FLAG_BITS == 0 and a.without & ~_FLAG_BITS == 0 and a.flags & a.without == 0
        if a.args:
            assert d.arg_enum is not None, f"{op.name}: a footprint selects arg values but arg is no enum"
            assert set(a.args) <= {int(v) for v in d.arg_enum}
        for part in (a.at, a.buffer, a.extent):
            need = _NEEDS.get((type(part), part.name), ())
            assert set(need) <= set(d.fields), f"{op.name}: {part!r} is computed from {need}, not all used"


@pytest.mark.parametrize("op", list(Opcode), ids=lambda o: o.name)
def test_the_named_rules_are_the_rules(op):
    d = descriptor(op)
    assert getattr(costs, d.cost_rule) is costs.RULES[op]
    assert replay.HANDLERS[op].__name__ == d.functional_rule


def test_every_unit_has_a_trace_thread():
    assert set(UNIT_TRACK) == set(UNIT_KINDS)
    assert set(UNIT_TRACK.values()) <= set(UNITS)


def test_every_footprint_part_reads_in_the_docs():
    d = descriptor(Opcode.UNICAST)
    for at in At:
        for b in Buffer:
            for e in Extent:
                assert access_text(d, Access(at, b, e)).startswith("`")
    assert access_text(d, Access(At.DESTINATION, Buffer.DST_BUF, Extent.MOVE_DST, flags=int(Flag.ACCUMULATE))) \
        == "`dst_buf@dst[dst_off:]` if ACCUMULATE"


def test_unknown_opcodes_are_named():
    with pytest.raises(KeyError, match="opcode 99 \\(unknown\\) has no descriptor"):
        descriptor(99)


def test_the_docs_table_is_generated():
    doc = DOC.read_text()
    assert with_opcode_table(doc) == doc, f"docs/isa.md: the opcode table is stale; regenerate it: {REGENERATE}"
    assert opcode_table_markdown() in doc


def test_the_docs_need_their_markers():
    with pytest.raises(ValueError, match="opcode-table:begin"):
        with_opcode_table("# no table here\n")


def test_a_cost_rule_without_a_function_fails_naming_it():
    bad = {Opcode.SYNC: dataclasses.replace(DESCRIPTORS[Opcode.SYNC], cost_rule="_no_such_rule")}
    with pytest.raises(NameError, match="SYNC.*_no_such_rule"):
        costs.rules(bad)


def test_a_functional_rule_without_a_function_fails_naming_it():
    bad = {Opcode.SYNC: dataclasses.replace(DESCRIPTORS[Opcode.SYNC], functional_rule="no_such_rule")}
    with pytest.raises(NameError, match="SYNC.*no_such_rule"):
        replay.handlers(bad)
    imported = {Opcode.SYNC: dataclasses.replace(DESCRIPTORS[Opcode.SYNC], functional_rule="np")}
    with pytest.raises(NameError, match="SYNC.*'np'"):  # a name the module imports is not a rule of it
        replay.handlers(imported)


def test_a_missing_entry_is_named_everywhere(monkeypatch):
    monkeypatch.delitem(DESCRIPTORS, Opcode.SYNC)
    assert missing() == ["SYNC"]
    with pytest.raises(KeyError, match="opcode 12 \\(SYNC\\) has no descriptor"):
        descriptor(Opcode.SYNC)
    with pytest.raises(KeyError, match="SYNC"):
        with_opcode_table(DOC.read_text())
    assert Opcode.SYNC not in costs.rules(DESCRIPTORS)
    monkeypatch.setattr(costs, "RULES", costs.rules(DESCRIPTORS))
    records = empty(2)
    records["op"] = Opcode.SYNC
    ctx = costs.Ctx(None, None, records, None, None, *[np.zeros(0, np.int64)] * 4)
    with pytest.raises(InputError, match="no cost rule for opcode 12 \\(SYNC\\)"):
        costs.record_costs(ctx, "p")


def test_the_module_prints_the_table(capsys):
    assert descriptors.main([]) == 0
    assert capsys.readouterr().out == opcode_table_markdown()
