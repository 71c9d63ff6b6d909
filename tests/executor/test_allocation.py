"""The compiler's scratchpad allocation (``executor/allocation.py``) and the prefill chunk codegen fits to it
(``codegen/fit.py``).

The allocation is checked against a second count made here from the replay's buffer instances (a dict of
each location's largest instance, summed per PE with its KV), and against the replay's own occupancy: no PE
ever holds more than its allocation. The chunk codegen picks is checked for being the largest that fits: one
token more overflows, and a forced chunk past it is refused under ``memory=strict`` naming the limit.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from primal_compiler.api import compile_model
from primal_compiler.codegen.fit import largest_chunk
from primal_compiler.compiled import program_file
from primal_compiler.errors import InputError
from primal_compiler.executor.allocation import Allocation, of_program
from primal_compiler.executor.replay import replay
from primal_compiler.frontend import load_model
from primal_compiler.isa.opcodes import CONTROLLER, ActFn, Opcode
from primal_compiler.target import with_overrides
from tests.functional.conftest import compiled, replay_target  # noqa: F401  (replay_target: a fixture)

CASES = ["llama_lora_qv_r4_torchscript", "gpt2_lora_cattn_r4_dynamo", "opt_lora_qv_r4_optimum"]
PIPE = "lower-tiles,blocking,zcurve-order,kv-ring{context=64,chunk_tokens=4,reserve_bytes=0},codegen{%s},srpg"


def _codegen(program) -> dict:
    return next(r.details for r in program.records if r.name == "codegen")


@pytest.mark.parametrize("case", CASES)
def test_the_allocation_is_each_location_at_its_largest_and_bounds_the_replay(case, replay_target):  # noqa: F811
    program = compiled(case, replay_target, 6, 2)
    meta, arrays = program_file(program, replay_target)
    mem = replay(meta, arrays, program.stream, replay_target).memory
    alloc = of_program(program, replay_target, program.stream)[0]
    largest: dict[int, int] = defaultdict(int)
    for loc, size in zip(mem.inst_loc.tolist(), mem.inst_bytes.tolist(), strict=True):
        largest[loc] = max(largest[loc], size)
    per_pe = mem.kv_bytes.copy()
    for loc, size in largest.items():
        per_pe[(loc >> 32) * mem.pes + ((loc >> 16) & 0xFFFF)] += size
    assert np.array_equal(alloc.pe_bytes, per_pe)
    assert (mem.peak_bytes <= alloc.pe_bytes).all()  # no timing holds more than the allocation
    assert alloc.fits == (alloc.pe_bytes.max() <= replay_target.router.scratchpad_bytes)


def test_largest_chunk_bisects_a_falling_predicate():
    assert largest_chunk(lambda c: c <= 37, 100) == 37
    assert largest_chunk(lambda c: c <= 100, 100) == 100
    assert largest_chunk(lambda c: False, 100) == 0
    calls: list[int] = []
    largest_chunk(lambda c: calls.append(c) or c <= 5, 1000)
    assert len(calls) <= 10  # bisection, not a scan


def test_a_location_shared_by_passes_is_allocated_once_at_its_largest():
    loc = np.array([1 << 16 | 7, 1 << 16 | 7, 1 << 16 | 8, 1 << 32 | 7], dtype=np.int64)  # PE 1 twice, CT 1 PE 0
    a = Allocation.of(loc, np.array([100, 300, 50, 10]), np.array([5, 0, 0, 0]), 2, 400)
    assert a.pe_bytes.tolist() == [5, 350, 10, 0] and a.fits and a.peak_bytes == 350
    assert [size for _, size in a.largest(1)] == [300, 50]
    assert not Allocation.of(loc, np.array([100, 300, 50, 10]), np.array([5, 0, 0, 0]), 2, 349).fits


@pytest.fixture(scope="module")
def tight(small_target):
    """tiny-llama at context 64 on the 8x8 test target with 6 KiB scratchpads: one prefill pass overflows."""
    return with_overrides(small_target, {"router.scratchpad_bytes": 6144})


def test_under_strict_codegen_takes_the_largest_chunk_that_fits(tight):
    model = load_model("tiny-llama", "q,v:8")
    program = compile_model(model, tight, PIPE % "memory=strict")
    details = _codegen(program)
    chunk = details["prefill_chunk"]
    assert 1 <= chunk < 63 and details["scratchpad"]["fits"] and of_program(program, tight, program.stream)[0].fits
    sec = next(s for s in program.stream.sections if s.name == "prefill:0")
    r = program.stream.records[sec.start:sec.stop]
    embeds = (r["op"] == Opcode.ACT) & (r["ct"] == CONTROLLER) & ((r["arg"] & 0xFF) == ActFn.EMBED)
    assert int(embeds.sum()) == -(-63 // chunk)  # one pass a chunk
    whole = compile_model(model, tight, PIPE % "")  # report mode: the prompt stays one pass, and overflows
    assert _codegen(whole)["prefill_chunk"] == 63 and "scratchpad" not in _codegen(whole)
    assert not of_program(whole, tight, whole.stream)[0].fits
    with pytest.raises(InputError, match=rf"^pass codegen: prefill chunk {chunk + 1} does not fit the scratchpads: "
                                         rf"CT \d+ PE \d+ needs [\d,]+ B of its 6,144 B .*; at most {chunk} tokens"):
        compile_model(model, tight, PIPE % f"prefill_chunk={chunk + 1},memory=strict")
    assert _codegen(compile_model(model, tight, PIPE % f"prefill_chunk={chunk},memory=strict"))["prefill_chunk"] == chunk


def test_strict_refuses_a_fitting_chunk_that_takes_too_many_records(tight, monkeypatch):
    """The chunk that fits would make the stream longer than codegen emits for its own choice: refused in
    one line giving the chunk, the passes and the records, before the stream is emitted."""
    from primal_compiler.codegen import fit

    model = load_model("tiny-llama", "q,v:8")
    program = compile_model(model, tight, PIPE % "memory=strict")
    monkeypatch.setattr(fit, "STREAM_RECORDS_LIMIT", len(program.stream.records) - 1)
    chunk = _codegen(program)["prefill_chunk"]
    with pytest.raises(InputError, match=rf"^pass codegen: the program fits the scratchpads only in prefill passes "
                                         rf"of at most {chunk} token\(s\): {-(-63 // chunk)} passes, about [\d,]+ "
                                         r"records, more than the [\d,]+ codegen emits .*\(--memory strict\)$"):
        compile_model(model, tight, PIPE % "memory=strict")


def test_strict_refuses_at_compile_time_what_no_chunk_fits(small_target):
    """Even one token's buffers overflow 1 KiB: strict refuses, naming the PE, its bytes and its buffers."""
    tiny = with_overrides(small_target, {"router.scratchpad_bytes": 1024})
    model = load_model("tiny-llama", "q,v:8")
    with pytest.raises(InputError, match=r"^pass codegen: the program does not fit the scratchpads: CT \d+ PE \d+ "
                                         r"needs [\d,]+ B of its 1,024 B scratchpad \(.+\); [\d,]+ PEs over \(--memory "
                                         r"strict\)$"):
        compile_model(model, tiny, PIPE % "memory=strict")


def test_a_pipelined_batch_never_holds_more_than_the_allocation(compiled, replayed, small_target):
    """Two sequences' passes overlap in time on the layers' CTs (pipelined decode, two requests); each
    location's instances still follow one another, so no PE's replayed peak exceeds its allocation."""
    program = compiled[0]
    alloc = of_program(program, small_target, program.stream)[0]
    assert (replayed.memory.peak_bytes <= alloc.pe_bytes).all()
    assert not alloc.fits and replayed.memory.pes_over <= alloc.pes_over
