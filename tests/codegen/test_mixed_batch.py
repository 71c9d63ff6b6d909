"""Mixed-adapter batches (codegen{requests=a+b+...}): the SRAM-DCIM slots a target's macro has, the writes the
residency needs (checked against an exhaustive search for the fewest loads), slots the SMAC_SRAM records read,
and the replayed step bounded by a hand computation of the controller's writes."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from primal_compiler.api import compile_model
from primal_compiler.codegen.check import check_configs
from primal_compiler.codegen.residency import Slots, sram_slots
from primal_compiler.compiled import program_file
from primal_compiler.errors import InputError
from primal_compiler.executor.metrics import metrics
from primal_compiler.executor.replay import replay
from primal_compiler.frontend import load_model
from primal_compiler.ir.tiles import Macro
from primal_compiler.isa.opcodes import Opcode
from primal_compiler.passmgr import PassManager, parse_pipeline
from primal_compiler.transforms.codegen import parse_requests

PLACE = "lower-tiles,blocking,zcurve-order"


@pytest.fixture(scope="module")
def placed(small_target):
    return {rank: compile_model(load_model("tiny-llama", f"q,v:{rank}"), small_target, PLACE) for rank in (4, 8, 64)}


def _program(placed, target, requests: str, batch: int = 4, steps: int = 3, srpg: str = "srpg", prompt: int = 8):
    tail = f"kv-ring{{context=64,batch={batch}}},codegen{{requests={requests},prompt={prompt},steps={steps}}},{srpg}"
    return PassManager(parse_pipeline(tail)).run(placed, target)


def _configs(program) -> np.ndarray:
    return np.flatnonzero(program.need_stream().records["op"] == Opcode.CONFIG)


def _tiles_per_load(program) -> int:
    t = program.need_tiles()
    return int(((t.macro == Macro.SRAM) & (t.zero != 1)).sum())


@lru_cache(maxsize=None)
def _fewest_loads(uses: tuple[int, ...], held: frozenset, slots: int) -> int:
    """The fewest adapter loads serving ``uses`` in order with ``slots`` slots, over every eviction choice."""
    if not uses:
        return 0
    a, rest = uses[0], uses[1:]
    if a in held:
        return _fewest_loads(rest, held, slots)
    if len(held) < slots:
        return 1 + _fewest_loads(rest, held | {a}, slots)
    return 1 + min(_fewest_loads(rest, (held - {v}) | {a}, slots) for v in held)


def test_requests_name_each_sequence_adapter():
    assert parse_requests("0;1+1+2+3;2") == ((0,), (1, 1, 2, 3), (2,))
    with pytest.raises(ValueError, match="'\\+'-separated"):
        parse_requests("0+x")


def test_slots_follow_the_macro_and_the_tile(placed, small_target):
    """256x64-bit macro, 8-bit LoRA: 8 weights a row. tiny-llama's 256-row tiles: rank 8 fills it (1 slot), rank 4
    leaves two column groups (2 slots); rank 64 is cut into 8-wide tiles (1 slot)."""
    assert {r: sram_slots(p.need_tiles(), small_target, 8) for r, p in placed.items()} == {4: 2, 8: 1, 64: 1}


def test_resident_adapters_load_once_and_each_pass_reads_its_slot(placed, small_target):
    p = _program(placed[4], small_target, "0+0+1+1")
    rec = p.need_stream().records
    cfg = _configs(p)
    assert len(cfg) == 2 * _tiles_per_load(p)  # both adapters fit the two slots: each written once
    names = [s.name for s in p.need_stream().sections]
    assert names == ["adapter:0", "prefill:0", "decode:0"]
    assert sorted(set((rec["arg"][cfg] >> 16).tolist())) == [0, 1]
    assert {int(a >> 16): int(a & 0xFFFF) for a in rec["arg"][cfg]} == {0: 0, 1: 1}
    smac = rec[rec["op"] == Opcode.SMAC_SRAM]
    assert set(smac["arg"].tolist()) == {0, 1}
    check_configs(p.need_stream())


def test_more_adapters_than_slots_pin_all_but_one_and_repeat_each_step(placed, small_target):
    """Four adapters, two slots: adapter 0 stays pinned and 1, 2, 3 rotate through the other slot, so each
    decode step loads three (a least-recently-used policy would load before each of the 16 passes, the fewest
    possible is 12, in a pattern that never settles) and every step is the same: a generation past the
    replayed steps repeats the settled one."""
    steps = 3
    p = _program(placed[4], small_target, "0+1+2+3", steps=steps)
    uses = (0, 1, 2, 3) * (1 + steps)  # the prefill's four runs, then each step's four passes
    loads = len(_configs(p)) // _tiles_per_load(p)
    assert loads == 2 + 2 + 3 * steps  # 0 and 1 ahead, 2 and 3 in the prefill, then 1, 2, 3 each step
    assert _fewest_loads(uses, frozenset(), 2) <= loads < len(uses)
    rec, stream = p.need_stream().records, p.need_stream()
    smac = rec["op"] == Opcode.SMAC_SRAM
    dec = next(s for s in stream.sections if s.name == "decode:0")
    assert set(rec["arg"][dec.start : dec.stop][smac[dec.start : dec.stop]].tolist()) == {0, 1}
    check_configs(stream)
    long = _program(placed[4], small_target, "0+1+2+3", steps=4, prompt=63)  # a full KV ring: the same work a step
    meta, arrays = program_file(long, small_target)
    m = metrics(replay(meta, arrays, long.need_stream(), small_target), 0, generate=16)
    assert m["generation"]["repeated_steps"] == 12


def test_the_policy_pins_the_first_adapters_and_evicts_the_least_recently_used():
    s = Slots(3)
    assert s.request((5, 6, 7, 8)) == (5, 6, 7) and s.pinned == (5, 6)
    assert [s.load(a, (5, 6, 7)) for a in (5, 6, 7)] == [0, 1, 2]
    assert s.load(8, (8,)) == 2 and s.load(7, (7,)) == 2  # only the unpinned slot rotates
    s.request((9,))
    assert s.pinned == () and s.find(5) == 0
    assert s.load(9, (9,)) == 1  # 6 is the least recently used now


def test_a_mixed_request_is_refused_where_a_pass_would_need_two_slots(placed, small_target):
    with pytest.raises(InputError, match="codegen.requests: request 0 mixes adapters, which needs pipeline=true"):
        PassManager(parse_pipeline("kv-ring{context=64,batch=2},codegen{requests=0+1,pipeline=false}")).run(
            placed[8], small_target)
    with pytest.raises(InputError, match="request 1 names 3 adapters; a batch of 4"):
        _program(placed[8], small_target, "0;0+1+2")


def _step(program, target) -> tuple[float, dict]:
    meta, arrays = program_file(program, target)
    rp = replay(meta, arrays, program.need_stream(), target)
    return rp, metrics(rp, 0)


def test_a_step_that_rewrites_adapters_is_bounded_by_the_controllers_writes(placed, small_target):
    """Rank 64, one slot, four adapters in a batch of four: every decode pass rewrites its adapter's tiles from
    the controller over its die-to-die port (32 GB/s). A step then takes at least the four adapters' bytes over
    that port, and at most those writes plus the same step with one adapter resident (nothing overlapped)."""
    one = _program(placed[64], small_target, "0", steps=4)
    mixed = _program(placed[64], small_target, "0+1+2+3", steps=4)
    rp, m = _step(mixed, small_target)
    _, m1 = _step(one, small_target)
    rec = mixed.need_stream().records
    dec = next(s for s in mixed.need_stream().sections if s.name == "decode:0")
    written = rec["nbytes"][dec.start : dec.stop][rec["op"][dec.start : dec.stop] == Opcode.CONFIG].astype(np.int64)
    per_step = int(written.sum()) / 4
    assert per_step == 4 * int(rec["nbytes"][_configs(one)].astype(np.int64).sum())  # four adapters a step
    floor = per_step / small_target.d2d.bandwidth_bytes_per_s
    assert floor > 2 * m1["itl_s"]  # the writes, not the compute, set the pace here
    assert floor <= m["itl_p50_s"] <= floor + m1["itl_p50_s"]


def test_slots_past_the_macro_are_refused_before_the_replay(placed, small_target):
    p = _program(placed[8], small_target, "0")
    meta, arrays = program_file(p, small_target)
    stream = p.need_stream()
    rec = stream.records.copy()
    smac = np.flatnonzero(rec["op"] == Opcode.SMAC_SRAM)
    rec["arg"][smac[0]] = 1
    bad = type(stream)(rec, stream.group_ptr, stream.group_ct, stream.group_pe, stream.sections)
    with pytest.raises(InputError, match=f"record {smac[0]} \\(SMAC_SRAM\\) names SRAM slot 1 of CT .* its 256x8 "
                                         "LoRA tile leaves room for 1 in the 256x64-bit SRAM-DCIM macro"):
        replay(meta, arrays, bad, small_target)
