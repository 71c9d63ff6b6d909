"""Hop validation: stream legs are the legs the mapping and kv-ring placed."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from primal_compiler.errors import InputError
from primal_compiler.executor.replay import replay
from primal_compiler.executor.validate import validate_hops
from primal_compiler.isa.opcodes import BufKind, Opcode


def test_compiled_program_validates(replayed):
    counts = validate_hops(replayed)
    assert counts["mapped_legs"] > 0 and counts["kv_legs"] > 0 and counts["d2d_legs"] > 0


def test_a_transfer_whose_reader_finds_nothing_is_named(compiled, small_target):
    """Misrouting the first hand-off leaves its reader with a buffer no record wrote: the replay names it."""
    program, meta, arrays = compiled
    r = program.stream.records
    index = int(np.flatnonzero((r["op"] == Opcode.UNICAST) & (r["ct"] == r["dst_ct"]) & (r["dst_buf"] >> 12 == BufKind.HIDDEN))[0])
    records = r.copy()
    records["dst_pe"][index] = (int(records["dst_pe"][index]) + 9) % 64
    with pytest.raises(InputError, match=r"record \d+ \(\w+\) reads HIDDEN\.0x\w+ at CT \d+ PE \d+, which no earlier record wrote"):
        replay(meta, arrays, replace(program.stream, records=records), small_target)


def _mutated(compiled, small_target, pick, field, value):
    program, meta, arrays = compiled
    records = program.stream.records.copy()
    index = pick(records)
    records[field][index] = value(records[index])
    stream = replace(program.stream, records=records)
    return index, replay(meta, arrays, stream, small_target)


def test_a_misrouted_transfer_is_named(compiled, small_target):
    def pick(r):  # the last one: its reader still finds the buffer an earlier step wrote, so the replay runs
        return int(np.flatnonzero((r["op"] == Opcode.UNICAST) & (r["ct"] == r["dst_ct"]) & (r["dst_buf"] >> 12 == BufKind.HIDDEN))[-1])

    index, rp = _mutated(compiled, small_target, pick, "dst_pe", lambda rec: (int(rec["dst_pe"]) + 9) % 64)
    with pytest.raises(InputError, match=rf"hop validation: record {index} \(UNICAST\) leg .* is not a flow the mapping placed"):
        validate_hops(rp)


def test_a_kv_append_to_the_wrong_router_is_named(compiled, small_target):
    program = compiled[0]
    kv = set(zip(compiled[2]["kv_ct"].tolist(), compiled[2]["kv_pe"].tolist()))

    def pick(r):
        return int(np.flatnonzero(r["op"] == Opcode.KV_APPEND)[0])

    r = program.stream.records[pick(program.stream.records)]
    free = next(pe for pe in range(64) if (int(r["dst_ct"]), pe) not in kv)
    index, rp = _mutated(compiled, small_target, pick, "dst_pe", lambda rec: free)
    with pytest.raises(InputError, match=rf"record {index} \(KV_APPEND\) .* appends K to a router without K chunks"):
        validate_hops(rp)


def test_kv_legs_across_cts_follow_the_kv_ring_layout():
    """On 3x3 CTs a layer spans CTs, so KV appends and queries cross die-to-die links."""
    from primal_compiler.api import compile_model
    from primal_compiler.compiled import program_file
    from primal_compiler.executor.transfers import attention_legs
    from primal_compiler.frontend import load_model
    from primal_compiler.isa.opcodes import CONTROLLER
    from primal_compiler.target import load_target, with_overrides

    target = with_overrides(load_target("primal-7nm"), {"ct.mesh_rows": 3, "ct.mesh_cols": 3})
    program = compile_model(load_model("tiny-llama", "q,v:8"), target,
                            "lower-tiles,blocking,zcurve-order,kv-ring{context=64},codegen,srpg")
    meta, arrays = program_file(program, target)
    rp = replay(meta, arrays, program.stream, target)
    tr = rp.transfers
    ctl = (tr.src_ct == CONTROLLER) | (tr.dst_ct == CONTROLLER)
    assert (attention_legs(program.stream.records, tr.rec) & (tr.src_ct != tr.dst_ct) & ~ctl).sum() > 0
    assert validate_hops(rp)["kv_legs"] > 0
