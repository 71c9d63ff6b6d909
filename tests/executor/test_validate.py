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


def _mutated(compiled, small_target, pick, field, value):
    program, meta, arrays = compiled
    records = program.stream.records.copy()
    index = pick(records)
    records[field][index] = value(records[index])
    stream = replace(program.stream, records=records)
    return index, replay(meta, arrays, stream, small_target)


def test_a_misrouted_transfer_is_named(compiled, small_target):
    def pick(r):
        return int(np.flatnonzero((r["op"] == Opcode.UNICAST) & (r["ct"] == r["dst_ct"]) & (r["dst_buf"] >> 12 == BufKind.HIDDEN))[0])

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
