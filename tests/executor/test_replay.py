"""The replay honours dependencies, units, links and power states, and follows the stream."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from primal_compiler.errors import InputError
from primal_compiler.executor import deps
from primal_compiler.executor.metrics import metrics
from primal_compiler.executor.replay import replay, used_links
from primal_compiler.executor.trees import legs
from primal_compiler.isa.opcodes import Opcode
from primal_compiler.isa.stream import Section, Stream


def _without(stream: Stream, index: int) -> Stream:
    """The stream with record ``index`` deleted (sections shrink around it)."""
    keep = np.ones(len(stream.records), dtype=bool)
    keep[index] = False
    sections = tuple(Section(s.name, s.start - (s.start > index), s.stop - (s.stop > index)) for s in stream.sections)
    return replace(stream, records=stream.records[keep], sections=sections)


def _with_copy(stream: Stream, index: int) -> Stream:
    """The stream with record ``index`` issued twice."""
    records = np.insert(stream.records, index, stream.records[index])
    sections = tuple(Section(s.name, s.start + (s.start > index), s.stop + (s.stop > index)) for s in stream.sections)
    return replace(stream, records=records, sections=sections)


def test_every_record_runs_after_what_it_reads(compiled, replayed):
    program = compiled[0]
    ptr, pred = deps.predecessors(program.stream)
    rec = np.repeat(np.arange(len(program.stream)), np.diff(ptr))
    assert len(pred) > len(program.stream) / 2
    assert (pred < rec).all()
    assert (replayed.start[rec] >= replayed.finish[pred]).all()
    assert (replayed.finish >= replayed.start).all()


def test_a_unit_runs_one_record_at_a_time(compiled, replayed):
    r = compiled[0].stream.records
    for op in (Opcode.SMAC_RRAM, Opcode.DMAC):
        rec = np.flatnonzero(r["op"] == op)
        key = r["ct"][rec].astype(np.int64) * 4096 + r["pe"][rec]
        order = np.lexsort((rec, key))
        same = key[order][1:] == key[order][:-1]
        assert same.any()
        assert (replayed.start[rec[order][1:]][same] >= replayed.finish[rec[order][:-1]][same]).all()


def _link_use(replayed):
    """One row per (record, link): the record, the link, when it takes it (its start plus the head's
    offset plus the cycles its heads waited in routers on the way) and when it lets it go. A record's
    legs over one link (a multicast's shared prefix, a reduction's shared suffix) make one window."""
    tr = replayed.transfers
    rec = np.repeat(np.arange(len(tr.link_ptr) - 1), np.diff(tr.link_ptr))
    key = rec * replayed.topo.num_links + tr.link
    order = np.argsort(key, kind="stable")
    key = key[order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    enter = replayed.start[rec] + tr.link_offset + replayed.link_wait.wait
    begin = np.minimum.reduceat(enter[order], first)
    end = np.maximum.reduceat((enter + tr.link_hold)[order], first)
    return rec[order][first], tr.link[order][first], begin, end


def test_transfers_sharing_a_link_do_not_overlap(replayed):
    rec, link, begin, end = _link_use(replayed)
    order = np.lexsort((begin, link))
    link, begin, end = link[order], begin[order], end[order]
    same = link[1:] == link[:-1]
    assert same.sum() > 10
    assert (begin[1:][same] >= end[:-1][same]).all()


def test_a_waiting_head_never_enters_a_link_early(replayed):
    """Per leg, each link is entered no earlier than the head left the one before plus its latency (the one
    before: its parent row, in a multicast tree too)."""
    tr, lw = replayed.transfers, replayed.link_wait
    rec = np.repeat(np.arange(len(tr.link_ptr) - 1), np.diff(tr.link_ptr))
    enter = replayed.start[rec] + tr.link_offset + lw.wait
    up, _ = legs(tr.link_ptr, tr.link_offset, tr.tree_at, tr.tree)
    inside = np.flatnonzero(up >= 0)  # not the first link of a leg
    assert (tr.tree_at >= 0).sum() > 10 and (up[inside] != inside - 1).any()  # trees that branch are among them
    assert (lw.wait >= 0).all() and (lw.wait[inside] >= lw.wait[up[inside]]).all()
    assert (enter[inside] - enter[up[inside]] >= tr.link_offset[inside] - tr.link_offset[up[inside]]).all()
    late = lw.wait.max() > 0
    assert late and (replayed.finish >= replayed.start + replayed.busy).all()


def test_a_record_finishes_its_busy_time_and_its_longest_wait_after_its_start(replayed):
    """finish = start + busy + the largest wait any of its legs accumulated in routers (0 without links):
    checked on every record, from the link rows' waits and each record's wait to eject alone. Reductions
    that waited are among them, so
    a finish the link model computed but failed to hand back to the schedule fails here."""
    ptr, wait = replayed.transfers.link_ptr, replayed.link_wait.wait.astype(np.int64)
    longest = np.zeros(len(replayed.start), dtype=np.int64)
    rows = np.diff(ptr) > 0
    longest[rows] = np.maximum.reduceat(wait, ptr[:-1][rows])
    longest = np.maximum(longest, replayed.link_wait.ejected)  # a leg's wait to eject at its destination
    assert (replayed.finish == replayed.start + replayed.busy + longest).all()
    reduce = replayed.stream.records["op"] == Opcode.REDUCE
    assert (longest[reduce] > 0).sum() > 10

def test_sync_waits_for_everything_before_it(compiled, replayed):
    r = compiled[0].stream.records
    for s in np.flatnonzero(r["op"] == Opcode.SYNC):
        assert replayed.start[s] >= replayed.finish[:s].max()
        assert (replayed.start[s + 1:] >= replayed.start[s]).all()


def test_deleting_or_adding_an_instruction_changes_the_numbers(compiled, replayed, small_target):
    program, meta, arrays = compiled
    base = metrics(replayed)
    decode = next(s for s in program.stream.sections if s.name == "decode:0")
    r = program.stream.records
    smac = decode.start + int(np.flatnonzero(r["op"][decode.start:decode.stop] == Opcode.SMAC_RRAM)[0])
    fewer = metrics(replay(meta, arrays, _without(program.stream, smac), small_target))
    assert fewer["energy_per_token_j"] < base["energy_per_token_j"]
    bcast = decode.start + int(np.flatnonzero(r["op"][decode.start:decode.stop] == Opcode.BCAST)[3])
    more = metrics(replay(meta, arrays, _with_copy(program.stream, bcast), small_target))
    assert more["energy_per_token_j"] > base["energy_per_token_j"]
    assert more["itl_s"] >= base["itl_s"]


def test_a_record_on_a_gated_ct_is_an_error_naming_it(compiled, small_target):
    program, meta, arrays = compiled
    r = program.stream.records
    decode = next(s for s in program.stream.sections if s.name == "decode:0")
    on = decode.start + int(np.flatnonzero(r["op"][decode.start:decode.stop] == Opcode.PG_ON)[-1])
    with pytest.raises(InputError, match=r"prog: record \d+ \(\w+ ct=\d+\) runs on a gated CT"):
        replay(meta, arrays, _without(program.stream, on), small_target, where="prog")


def test_a_missing_cost_rule_names_the_opcode(compiled, small_target, monkeypatch):
    from primal_compiler.executor import costs

    program, meta, arrays = compiled
    monkeypatch.delitem(costs.RULES, Opcode.DMAC)
    with pytest.raises(InputError, match="no cost rule for opcode 6 \\(DMAC\\)"):
        replay(meta, arrays, program.stream, small_target)


def test_replay_is_deterministic(compiled, replayed, small_target):
    program, meta, arrays = compiled
    again = replay(meta, arrays, program.stream, small_target)
    assert np.array_equal(again.start, replayed.start) and np.array_equal(again.finish, replayed.finish)
    for k, v in replayed.energy_pj.items():
        assert np.array_equal(again.energy_pj[k], v)


def test_link_energy_is_bits_times_distinct_links(compiled, replayed, small_target):
    r = compiled[0].stream.records
    rec, link, _, _ = _link_use(replayed)
    mesh = link < replayed.topo.d2d_base
    bits = r["nbytes"][rec].astype(np.float64) * 8
    expect = (bits[mesh].sum() * small_target.router.energy_pj_per_bit_hop
              + bits[~mesh].sum() * small_target.d2d.energy_pj_per_bit)
    assert replayed.energy_pj["links"].sum() == pytest.approx(expect)


def test_the_schedule_is_given_only_the_links_some_row_uses_in_their_order():
    """Link ids 1, 5, 7, 9 of 10 (PE-mesh links below 6) become 0..3, two of them PE-mesh links."""
    link, used, mesh_ids = used_links(np.array([5, 1, 5, 9, 7], dtype=np.int32), 10, 6)
    assert link.tolist() == [1, 0, 1, 3, 2] and link.dtype == np.int32
    assert (used, len(mesh_ids)) == (4, 2) and mesh_ids.tolist() == [1, 5]
