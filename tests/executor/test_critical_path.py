"""``primal run --critical-path``: the breakdown sums to TTFT and ITL, the path is a chain of real
constraints, hand-built streams have the answer worked out by hand, and the CLI shows it."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from primal_compiler.cli import main
from primal_compiler.errors import InputError
from primal_compiler.executor.critical import CLASS_KEYS, Via, critical_path, request_windows, walks
from primal_compiler.executor.metrics import metrics
from primal_compiler.executor.replay import blocking, replay
from primal_compiler.isa.descriptors import PathClass
from primal_compiler.isa.opcodes import CONTROLLER, ActFn, BufKind, Opcode, buf
from primal_compiler.isa.stream import StreamBuilder
from primal_compiler.target import with_overrides

META = {"num_cts": 2, "mesh_rows": 8, "mesh_cols": 8, "num_layers": 1, "package_cols": 1}
MVM = 260  # primal-7nm rram.mvm_latency_cycles


@pytest.fixture(scope="module", params=["distributed", "central", "in-order"])
def paths(request, compiled, small_target):
    """The fixture's replay under each control mode (``in-order``: distributed control, in-order links),
    and the TTFT and decode-window paths of both requests."""
    program, meta, arrays = compiled
    target = with_overrides(small_target, {"router.link_schedule": "in-order"}) if request.param == "in-order" \
        else small_target
    rp = replay(meta, arrays, program.stream, target, mode=None if request.param == "in-order" else request.param)
    out = []
    for req in (0, 1):
        ttft, decode, steps = request_windows(rp, req)
        out += walks(rp, [ttft, decode])
    return rp, out


def _tokens(rp, name):
    s = next(x for x in rp.stream.sections if x.name == name)
    r = rp.stream.records
    rec = np.arange(s.start, s.stop)
    return rec[(r["op"][rec] == Opcode.ACT) & (r["arg"][rec] == ActFn.ARGMAX) & (r["ct"][rec] == CONTROLLER)]


def _pass_itls(rp):
    """Per pass (TOKEN buffer): (last decode ARGMAX finish - its prefill ARGMAX finish) / its steps, seconds."""
    tag, pre, dec = rp.stream.records["dst_buf"], _tokens(rp, "prefill:0"), _tokens(rp, "decode:0")
    return [rp.seconds(rp.finish[dec[tag[dec] == tag[p]]].max() - rp.finish[p]) / int((tag[dec] == tag[p]).sum())
            for p in pre]


def _last_pass_itl(rp):
    tag, pre, dec = rp.stream.records["dst_buf"], _tokens(rp, "prefill:0"), _tokens(rp, "decode:0")
    last = dec[np.argmax(rp.finish[dec])]
    return _pass_itls(rp)[int(np.flatnonzero(tag[pre] == tag[last])[0])]


def test_breakdown_sums_exactly_to_ttft_and_itl(paths):
    replayed, paths = paths
    m = metrics(replayed)
    for p in paths:
        assert (p.by_class >= 0).all() and int(p.by_class.sum()) == p.end - p.begin > 0
    ttft, decode = paths[:2]
    assert replayed.seconds(ttft.end - ttft.begin) == m["ttft_s"]
    itl = _last_pass_itl(replayed)  # the fixture pipelines its batch of 2: ITL of the pass that ends last
    assert replayed.seconds(decode.end - decode.begin) / m["decode_steps"] == pytest.approx(itl, rel=1e-12)
    assert m["passes"] == 2 and min(_pass_itls(replayed)) <= m["itl_s"] <= max(_pass_itls(replayed))
    cp = critical_path(replayed)
    for part, total in (("ttft", m["ttft_s"]), ("itl", itl)):
        assert cp[part]["total_s"] == pytest.approx(total, rel=1e-12)
        assert sum(cp[part]["by_class_s"].values()) == pytest.approx(total, rel=1e-12)
        assert set(cp[part]["by_class_s"]) == set(CLASS_KEYS) and cp[part]["bound_by"] in CLASS_KEYS
    assert cp["itl"]["steps"] == m["decode_steps"] and cp["ttft"]["records"] == len(ttft.records)


def _links(rp, i: int) -> set:
    tr = rp.transfers
    return set(tr.link[tr.link_ptr[i]:tr.link_ptr[i + 1]].tolist())


def _touches(rp, i: int) -> set:
    r = rp.stream.records[i]
    return {int(r["ct"]), int(r["dst_ct"])}


def _constraint_holds(rp, later: int, earlier: int, via: Via) -> bool:
    """Whether ``earlier`` sets the start (or dispatch) of ``later`` by ``via``, from the replay's columns alone."""
    r, c = rp.stream.records, rp.control
    op, start, finish, dispatch = r["op"], rp.start, rp.finish, rp.dispatch
    between = slice(earlier + 1, later)
    same_seq = c.seq[earlier] == c.seq[later] and not (c.seq[between] == c.seq[later]).any()
    step = c.issue_cycles[c.seq[later]]
    pg = (Opcode.PG_ON, Opcode.PG_OFF)
    return {
        Via.PRED: earlier in rp.pred[rp.pred_ptr[later]:rp.pred_ptr[later + 1]] and finish[earlier] == start[later],
        Via.UNIT: rp.unit[earlier] == rp.unit[later] >= 0 and not (rp.unit[between] == rp.unit[later]).any()
        and finish[earlier] == start[later],
        Via.BLOCKING: same_seq and (blocking(r, rp.control.mode)[earlier] or op[earlier] == Opcode.SYNC)
        and finish[earlier] + step == dispatch[later],
        Via.SEQUENCER: same_seq and dispatch[earlier] + step == dispatch[later],
        Via.BARRIER: op[earlier] == Opcode.SYNC and not (op[between] == Opcode.SYNC).any()
        and start[earlier] == dispatch[later],
        Via.HORIZON: op[later] == Opcode.SYNC and finish[earlier] == start[later] == finish[:later].max(),
        Via.CT_BUSY: op[later] == Opcode.PG_OFF and int(r["ct"][later]) in _touches(rp, earlier)
        and finish[earlier] == start[later],
        Via.POWER_ORDER: op[later] in pg and earlier == later - 1 and start[earlier] == start[later],
        Via.WAKE: op[earlier] == Opcode.PG_ON and int(r["ct"][earlier]) in _touches(rp, later)
        and finish[earlier] == start[later],
        Via.LINK: bool(_links(rp, earlier) & _links(rp, later)),
    }[via]


def test_the_path_is_a_chain_of_constraints(paths):
    replayed, paths = paths
    kinds = set()
    for p in paths:
        assert p.via[0] == -1 and (np.diff(p.records) < 0).all()
        for k in range(1, len(p.records)):
            later, earlier, via = int(p.records[k - 1]), int(p.records[k]), Via(p.via[k])
            assert _constraint_holds(replayed, later, earlier, via), (later, earlier, via.name)
            kinds.add(via)
    # in-order, a transfer's start waits for its links; under cut-through it never does (it waits inside
    # its own span, hop by hop), so LINK appears exactly in-order
    in_order = replayed.target.router.link_schedule == "in-order"
    assert Via.PRED in kinds and (Via.LINK in kinds) == in_order and len(kinds) >= 3 + in_order


def _replay(builder: StreamBuilder, target):
    return replay(META, {}, builder.build(), target)


def test_a_long_rram_chain_is_all_rram(small_target):
    b = StreamBuilder()
    b.records(1, op=Opcode.SMAC_RRAM, ct=0, pe=0, dst_buf=buf(BufKind.PSUM, 0), count=50)
    for k in range(1, 4):  # each reads the one before; short transfers elsewhere on the CT do not matter
        b.records(1, op=Opcode.UNICAST, ct=0, pe=5, dst_ct=0, dst_pe=6, dst_buf=buf(BufKind.IN, k), nbytes=64)
        b.records(1, op=Opcode.SMAC_RRAM, ct=0, pe=0, src_buf=buf(BufKind.PSUM, k - 1), dst_buf=buf(BufKind.PSUM, k),
                  count=50)
    rp = _replay(b, small_target)
    (p,) = walks(rp, [(len(rp.start) - 1, 0)])
    assert p.records.tolist() == [6, 4, 2, 0] and p.via.tolist() == [-1, Via.PRED, Via.PRED, Via.PRED]
    assert p.by_class[PathClass.RRAM_MVM] == p.end == 4 * 50 * MVM and p.by_class.sum() == p.end


@pytest.mark.parametrize("issue, bound", [(1, PathClass.RRAM_MVM), (5000, PathClass.CONTROL)])
def test_a_slow_sequencer_bounds_independent_work(small_target, issue, bound):
    b = StreamBuilder()
    b.records(20, op=Opcode.SMAC_RRAM, ct=0, pe=np.arange(20), count=1)  # no data, each on its own macro
    rp = _replay(b, with_overrides(small_target, {"ct.sequencer_issue_cycles": issue}))
    (p,) = walks(rp, [(19, 0)])
    assert p.records.tolist() == list(range(19, -1, -1)) and (p.via[1:] == Via.SEQUENCER).all()
    assert p.by_class[PathClass.CONTROL] == 19 * issue and p.by_class[PathClass.RRAM_MVM] == MVM
    assert int(np.argmax(p.by_class)) == bound


@pytest.mark.parametrize("links", ["in-order", "cut-through"])
def test_a_transfer_queued_behind_another_on_a_link_is_mesh_time(small_target, links):
    b = StreamBuilder()
    b.records(2, op=Opcode.UNICAST, ct=0, pe=0, dst_ct=0, dst_pe=3, dst_buf=[buf(BufKind.IN, 0), buf(BufKind.IN, 1)],
              nbytes=4096)
    rp = _replay(b, with_overrides(small_target, {"router.link_schedule": links}))
    (p,) = walks(rp, [(1, 0)])
    # by hand: 4096 B hold each link 256 cycles; 3 hops of 2 cycles: the first finishes at 262
    assert rp.finish[0] == 262 and rp.finish[1] == 262 + 256
    if links == "in-order":
        assert rp.start[1] == 256  # it waited at its source for the first transfer's links
        assert p.via.tolist() == [-1, Via.LINK]
        assert p.by_class[PathClass.MESH_TRANSFER] == p.end == rp.finish[1]
    else:  # dispatched at cycle 1, it waits 255 cycles in its router at the first link, then follows
        assert rp.start[1] == rp.dispatch[1] == 1 and rp.link_wait.wait.tolist() == [0, 0, 0, 255, 255, 255]
        assert p.via.tolist() == [-1, Via.SEQUENCER]
        assert p.by_class[PathClass.MESH_TRANSFER] == p.end - 1 and p.by_class[PathClass.CONTROL] == 1


@pytest.mark.parametrize("ct, via, control", [(0, Via.BLOCKING, 1), (1, Via.BARRIER, 0)])
def test_a_sync_holds_back_what_follows(small_target, ct, via, control):
    b = StreamBuilder()
    b.records(1, op=Opcode.SMAC_RRAM, ct=0, pe=0, count=10)
    b.records(1, op=Opcode.SYNC, ct=0)
    b.records(1, op=Opcode.SMAC_RRAM, ct=ct, pe=1, count=1)  # no data: only the SYNC holds it back
    rp = _replay(b, small_target)
    (p,) = walks(rp, [(2, 0)])
    assert p.records.tolist() == [2, 1, 0] and p.via.tolist() == [-1, via, Via.HORIZON]
    assert p.by_class[PathClass.RRAM_MVM] == 11 * MVM and p.by_class[PathClass.CONTROL] == control == p.end - 11 * MVM


def test_a_wake_up_waits_for_the_record_before_it(small_target):
    b = StreamBuilder()
    b.records(1, op=Opcode.SMAC_RRAM, ct=0, pe=0, dst_buf=buf(BufKind.PSUM, 0), count=10)
    b.records(1, op=Opcode.UNICAST, ct=0, pe=0, dst_ct=0, dst_pe=1, src_buf=buf(BufKind.PSUM, 0),
              dst_buf=buf(BufKind.IN, 0), nbytes=64)
    b.records(1, op=Opcode.PG_ON, ct=1)  # keeps its place: starts with the transfer before it
    b.records(1, op=Opcode.SMAC_RRAM, ct=1, pe=0, count=1)
    rp = _replay(b, small_target)
    (p,) = walks(rp, [(3, 0)])
    assert p.records.tolist() == [3, 2, 1, 0] and p.via.tolist() == [-1, Via.WAKE, Via.POWER_ORDER, Via.PRED]
    wake = small_target.power_gating.wakeup_cycles
    assert p.by_class[PathClass.RRAM_MVM] == 11 * MVM and p.by_class[PathClass.WAKEUP] == wake
    assert p.by_class.sum() == p.end == 11 * MVM + wake


def test_a_request_ends_at_the_controller_argmax(small_target):
    b = StreamBuilder()
    for name in ("prefill:0", "decode:0"):  # each: an MVM, its result to the controller, the argmax there
        b.begin(name)
        b.records(1, op=Opcode.SMAC_RRAM, ct=0, pe=0, dst_buf=buf(BufKind.PSUM, 0), count=10)
        b.records(1, op=Opcode.UNICAST, ct=0, pe=0, dst_ct=CONTROLLER, dst_pe=0, src_buf=buf(BufKind.PSUM, 0),
                  dst_buf=buf(BufKind.HIDDEN, 0), nbytes=64)
        b.records(1, op=Opcode.ACT, ct=CONTROLLER, pe=0, src_buf=buf(BufKind.HIDDEN, 0), arg=ActFn.ARGMAX)
    rp = _replay(b, small_target)
    ttft, decode, steps = request_windows(rp)
    assert ttft == (2, 0) and decode == (5, int(rp.finish[2])) and steps == 1
    (p,) = walks(rp, [decode])
    assert p.records.tolist() == [5, 4, 3]  # the decode MVM began (after the prefill's transfer) inside the window
    cp = critical_path(rp)
    assert cp["itl"]["by_class_s"]["rram_mvm"] == rp.seconds(rp.finish[3] - rp.finish[2])
    assert cp["ttft"]["by_class_s"]["rram_mvm"] == rp.seconds(10 * MVM)
    assert cp["ttft"]["bound_by"] == cp["itl"]["bound_by"] == "rram_mvm"


def test_an_unexplained_start_is_an_error_naming_the_record(small_target):
    b = StreamBuilder()
    b.records(2, op=Opcode.SMAC_RRAM, ct=0, pe=0, count=5)
    rp = _replay(b, small_target)
    late = replace(rp, start=rp.start + [0, 1], finish=rp.finish + [0, 1])
    with pytest.raises(InputError, match=r"critical path: record 1 \(SMAC_RRAM\) starts at cycle 1301 .* no constr"):
        walks(late, [(1, 0)])
    with pytest.raises(InputError, match="not within the replay"):
        walks(rp, [(0, int(rp.finish[0]) + 1)])


FAST = "lower-tiles,blocking,zcurve-order,kv-ring,codegen,srpg"


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cp") / "tiny"
    assert main(["run", "tiny-llama", "--lora", "q,v:8", "-p", FAST, "--context", "64", "-o", str(out), "--json"]) == 0
    return out


def test_cli_critical_path_json_and_table(out_dir, capsys):
    capsys.readouterr()
    assert main(["run", str(out_dir), "--critical-path", "--json"]) == 0
    m = json.loads(capsys.readouterr().out)["metrics"]
    cp = m["critical_path"]
    assert cp["ttft"]["total_s"] == pytest.approx(m["ttft_s"]) and cp["itl"]["total_s"] == pytest.approx(m["itl_s"])
    assert sum(cp["itl"]["by_class_s"].values()) == pytest.approx(m["itl_s"]) and cp["ttft"]["records"] > 0
    assert main(["run", str(out_dir), "--critical-path"]) == 0
    text = capsys.readouterr().out
    assert "where the time goes (critical path)" in text and "bound by" in text and "RRAM MVM" in text
    assert main(["run", str(out_dir), "--json"]) == 0
    assert "critical_path" not in json.loads(capsys.readouterr().out)["metrics"]
