"""The link model of the schedule (``router.link_schedule``), on hand-built streams worked out by hand.

Row 0 of an 8x8 mesh: PE ``x`` is column ``x``, PE 10 is row 1 column 2. 128-bit links carry 16 B per
cycle and a hop takes 2 cycles, so a transfer of ``n`` bytes over ``H`` hops alone takes ``2H + n/16``
cycles. All records sit on CT 0, whose sequencer dispatches one per cycle (record k at cycle k).
"""

from __future__ import annotations

import pytest

from primal_compiler.executor.replay import replay
from primal_compiler.isa.opcodes import BufKind, Opcode, ReduceOp, buf
from primal_compiler.isa.stream import StreamBuilder
from primal_compiler.target import with_overrides

META = {"num_cts": 1, "mesh_rows": 8, "mesh_cols": 8, "num_layers": 1, "package_cols": 1}


def _replay(b: StreamBuilder, target, **overrides):
    return replay(META, {}, b.build(), with_overrides(target, overrides) if overrides else target)


def _send(b: StreamBuilder, src: int, dst: int, nbytes: int) -> None:
    b.records(1, op=Opcode.UNICAST, ct=0, pe=src, dst_ct=0, dst_pe=dst, nbytes=nbytes)


@pytest.mark.parametrize("links", ["cut-through", "in-order"])
def test_a_younger_transfer_uses_a_link_an_older_one_reserved_for_later(small_target, links):
    """Record 1 waits for a 2600-cycle RRAM product; record 2, dispatched later, crosses the same links at once
    under cut-through; in-order it must queue behind record 1's reservation."""
    b = StreamBuilder()
    b.records(1, op=Opcode.SMAC_RRAM, ct=0, pe=0, dst_buf=buf(BufKind.PSUM, 0), count=10)
    b.records(1, op=Opcode.UNICAST, ct=0, pe=0, dst_ct=0, dst_pe=3, src_buf=buf(BufKind.PSUM, 0), nbytes=4096)
    _send(b, 1, 3, 64)
    rp = _replay(b, small_target, **{"router.link_schedule": links})
    assert rp.start[1] == rp.finish[0] == 2600
    if links == "cut-through":
        assert rp.finish[2] == 2 + 2 * 2 + 4
    else:
        assert rp.start[2] == 2600 + 2 + 256  # link 1->2 is free once record 1's tail has crossed it


def test_a_reduction_crosses_each_shared_link_once(small_target):
    """Members PE 1 and PE 0 reduce into PE 3 (160 B, 10 cycles a link): link 1->2 carries the combined
    partials once, from the nearer member's head (cycle 0) to the farther one's tail (2 + 10); a transfer
    over 1->2 dispatched at cycle 1 enters it at 12. Were the legs sent apart, 1->2 would be busy to 20."""
    b = StreamBuilder()
    g = b.groups([2], [0, 0], [1, 0])
    b.records(1, op=Opcode.REDUCE, ct=0, pe=1, group=g[0], dst_ct=0, dst_pe=3, nbytes=160)
    _send(b, 1, 2, 160)
    rp = _replay(b, small_target)
    ptr = rp.transfers.link_ptr
    assert ptr[1] == 3 and rp.link_wait.wait[:3].tolist() == [0] * 3  # one row per link; it waited nowhere
    assert rp.finish[1] == 12 + 2 + 10


@pytest.mark.parametrize("buffer, first, waits, second", [(16, 262, [3, 3, 254], 266), (4, 264, [5, 258, 258], 270)])
def test_a_head_waits_behind_the_packet_ahead_of_it_in_its_input_buffer(small_target, buffer, first, waits, second):
    """Record 0 holds link 2->3 for 256 cycles; its tail leaves router 3's buffer at 258. Record 1 (PE 0 ->
    3) reaches router 2 at cycle 5 and waits there for 2->3: with 16-flit buffers until 256 (record 0's 2
    flits still on the link leave room for its 4), with 4-flit buffers until 258 (credits: a packet's
    flits count against the buffer from the cycle they are sent, and a 4-flit packet needs all 4).
    Record 2 (PE 0 -> 10: east to column 2, then south) reaches router 2 behind it and, its own output
    free, leaves only after record 1 has (first in, first out). With 16-flit buffers: 0->1 at 5 (record
    1 held it 1..5), 2->10 at 260, 254 cycles more than its path alone. With 4-flit buffers record 1's
    flits also fill router 1's buffer until 7 and router 2's until 262, so record 2 enters 0->1 at 7 and
    1->2 at 262."""
    b = StreamBuilder()
    _send(b, 2, 3, 4096)
    _send(b, 0, 3, 64)
    _send(b, 0, 10, 64)
    rp = _replay(b, small_target, **{"router.buffer_flits": buffer})
    assert rp.finish[1] == first == 1 + 3 * 2 + 4 + rp.link_wait.wait[3]
    lw = rp.link_wait.wait
    assert lw[1:3].tolist() == [0, 0]  # record 1 waits at router 2 only (record 0 has row 0)
    assert lw[-3:].tolist() == waits
    assert rp.finish[2] == second == 2 + 3 * 2 + 4 + waits[-1]


@pytest.mark.parametrize("buffer, finish", [(16, 260 + 4), (4, 262 + 2 + 4)])
def test_a_delivered_head_leaves_its_buffer_in_order_and_a_full_buffer_holds_back_the_link_into_it(
        small_target, buffer, finish):
    """As above, but record 2 ends at router 2 (PE 0 -> 2). With 16-flit buffers it reaches router 2's
    buffer behind record 1 and is ejected only once record 1 has left it, at 260; with 4-flit buffers
    record 1 fills that buffer until 262, so record 2 enters 1->2 only then."""
    b = StreamBuilder()
    _send(b, 2, 3, 4096)
    _send(b, 0, 3, 64)
    _send(b, 0, 2, 64)
    rp = _replay(b, small_target, **{"router.buffer_flits": buffer})
    assert rp.finish[2] == finish


def test_in_order_waits_at_the_source_for_the_whole_route(small_target):
    """The executor before cut-through: record 1 starts when 2->3 is free at its head's offset (4), so at
    252, and then crosses without waiting; record 2 queues behind record 1 on 0->1 in stream order."""
    b = StreamBuilder()
    _send(b, 2, 3, 4096)
    _send(b, 0, 3, 64)
    _send(b, 0, 10, 64)
    rp = _replay(b, small_target, **{"router.link_schedule": "in-order"})
    assert rp.start[1] == 256 - 4 and rp.finish[1] == 256 + 2 + 4
    assert rp.link_wait.wait.max() == 0 and rp.start[2] == 252 + 4


@pytest.mark.parametrize("links", ["cut-through", "in-order"])
def test_terminal_channels_add_latency_but_never_contend(small_target, links):
    """1 injection + 2 ejection cycles: a lone transfer takes 2H + F + 3 (as a router pipeline with
    terminal channels, BookSim2's +3); two PEs sending at once still cross their own links unhindered."""
    b = StreamBuilder()
    _send(b, 0, 3, 64)
    _send(b, 8, 11, 64)  # row 1: no link in common
    rp = _replay(b, small_target, **{"router.injection_cycles": 1, "router.ejection_cycles": 2,
                                     "router.link_schedule": links})
    assert rp.finish.tolist() == [2 * 3 + 4 + 3, 1 + 2 * 3 + 4 + 3]


@pytest.mark.parametrize("arbitration, finish", [("age", [266, 262]), ("program-order", [262, 266])])
def test_arbitration_picks_the_oldest_or_the_first_in_the_stream(small_target, arbitration, finish):
    """Record 2 (PE 1 -> 3) waits for record 1's 64 B into PE 1, so starts at 7; record 3 (PE 0 -> 3) starts
    at 3, gets 0->1 at 5 once record 1 is off it and reaches router 1 at 7: both ask for 1->2 at 7. Age
    gives it to record 3 (the earlier start), program order to record 2 (earlier in the stream). The
    winner leads at router 2, where both wait behind record 0 until 256: it finishes at 256 + 2 + 4 and
    the other, 4 cycles behind on 2->3, at 266."""
    b = StreamBuilder()
    _send(b, 2, 3, 4096)
    b.records(1, op=Opcode.UNICAST, ct=0, pe=0, dst_ct=0, dst_pe=1, dst_buf=buf(BufKind.IN, 0), nbytes=64)
    b.records(1, op=Opcode.UNICAST, ct=0, pe=1, dst_ct=0, dst_pe=3, src_buf=buf(BufKind.IN, 0), nbytes=64)
    _send(b, 0, 3, 64)
    rp = _replay(b, small_target, **{"router.arbitration": arbitration})
    assert rp.start[2:].tolist() == [7, 3]
    assert rp.finish[2:].tolist() == finish


@pytest.mark.parametrize("units, tail", [(16, 1), (1, None)])
def test_a_reduction_combines_each_flit_as_it_arrives(small_target, units, tail):
    """4096 B of FP16 partial sums from two members: 2048 elements in 256 flits of 8. With 16 DMAC MACs a
    cycle the combine keeps up with the link and only the last flit's shows (1 cycle past the network
    time); with one MAC a cycle it falls behind by 2048 - 256 cycles."""
    b = StreamBuilder()
    g = b.groups([2], [0, 0], [1, 8])
    b.records(1, op=Opcode.REDUCE, ct=0, pe=1, dst_ct=0, dst_pe=2, group=g[0], nbytes=4096, arg=ReduceOp.SUM)
    rp = _replay(b, small_target, **{"router.dmac_units": units, "router.dmac_ops_per_cycle": 1})
    net = int(rp.transfers.net_cycles[0])
    assert int(rp.busy[0]) == net + (tail if tail is not None else 2048 - 256)


@pytest.mark.parametrize("ports, waits", [(1, True), (2, False)])
def test_a_reduction_ejects_through_whichever_port_is_free(small_target, ports, waits):
    """Record 0 (PE 2 -> 3, 4096 B) holds PE 3's ejection port until its tail arrives at 260. Record 1, a
    reduction of PEs 5 and 4 into PE 3 from the other side (no link in common), needs an ejection port at
    PE 3 too: with one it waits for record 0's; with two it takes the free one and waits nowhere."""
    b = StreamBuilder()
    _send(b, 2, 3, 4096)
    g = b.groups([2], [0, 0], [5, 4])
    b.records(1, op=Opcode.REDUCE, ct=0, pe=5, group=g[0], dst_ct=0, dst_pe=3, nbytes=160)
    rp = _replay(b, small_target, **{"router.ejection_ports": ports})
    alone = 1 + 2 * 2 + 10  # dispatched at 1, two hops from PE 5, 10 flits (+1: the last flit's combine)
    assert (rp.finish[1] > 256) if waits else (rp.finish[1] <= alone + 1)


@pytest.mark.parametrize("ports", [1, 2])
def test_transfers_between_cts_leave_through_the_port_nearest_their_pe(small_target, ports):
    """Two CTs side by side. PE 9 (row 1, column 1) and PE 13 (column 5) of CT 0 each send 4096 B to the
    same PE of CT 1. With one port (PE 0) both climb to it through link 8 -> 0 (16 B a cycle): 512 cycles of
    flits in a row, 532 in all. With two (PEs 0 and 4) PE 13 leaves through PE 4, so the legs share only
    the package link, which takes each packet in 128 cycles (32 B a cycle): the second waits for the
    first's, 128 + 268 = 396. Each leg's mesh hops are those to and from its nearest port."""
    meta = {**META, "num_cts": 2, "package_cols": 2}
    b = StreamBuilder()
    for pe in (9, 13):
        b.records(1, op=Opcode.UNICAST, ct=0, pe=pe, dst_ct=1, dst_pe=pe, nbytes=4096)
    rp = replay(meta, {}, b.build(), with_overrides(small_target, {"d2d.ports_per_ct": ports}))
    hops = rp.transfers.routes.mesh_hops.tolist()
    assert hops == ([2 * 2, 2 * 6] if ports == 1 else [2 * 2, 2 * 2])  # 9 <-> 0: 2 hops; 13 <-> 0: 6, <-> 4: 2
    last = int(rp.finish.max())
    assert last == (532 if ports == 1 else 128 + 268)


def test_no_package_link_carries_more_than_its_bandwidth_under_a_flood_of_adapter_writes(target):
    """OPT-1.3B (31 CTs), rank-64 LoRA on q,v, a batch of two sequences on two adapters and one SRAM slot: every
    decode pass rewrites its adapter, so thousands of CONFIGs queue on the controller link and the die-to-die
    links out of CT 0, and transfers start after the schedule ran ahead of them. Over every die-to-die and the
    controller link, the cycles the records crossing it hold it fit between the first one's start and the last
    one's finish. With 16 windows per calendar these links forgot reservations and carried 1.2% more than that
    (a Llama-2-7B step 20% short); linkstate.BIG_CALENDAR keeps theirs."""
    import numpy as np

    from primal_compiler import compiled
    from primal_compiler.api import compile_model
    from primal_compiler.frontend import load_model
    from primal_compiler.passmgr import PassManager, parse_pipeline

    placed = compile_model(load_model("opt-1.3b", "q,v:64"), target, "lower-tiles,blocking,zcurve-order")
    program = PassManager(parse_pipeline("kv-ring{context=64,batch=2},codegen{requests=0+1,prompt=8,steps=3},srpg")
                          ).run(placed, target)
    meta, arrays = compiled.program_file(program, target)
    rp = replay(meta, arrays, program.need_stream(), target)
    tr = rp.transfers
    rec = np.repeat(np.arange(len(tr.link_ptr) - 1), np.diff(tr.link_ptr))
    package = tr.link >= rp.topo.d2d_base
    assert (tr.link == rp.topo.ctl_link).any()
    for lk in np.unique(tr.link[package]):
        crossing = np.unique(rec[tr.link == lk])
        held = int(tr.hold_other[crossing].sum())
        assert held <= int(rp.finish[crossing].max() - rp.start[crossing].min()), f"link {lk}"
