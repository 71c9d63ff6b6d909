"""The fast executor against the flit-level reference model of ``refsim`` (docs/refsim.md).

Hops and zero-load latency must agree exactly; latency under contention within
the tolerances below, measured over many seeds (``python -m tests.executor.test_refsim``
prints the table of docs/refsim.md).
"""

from __future__ import annotations

import sys
from functools import lru_cache

import numpy as np
import pytest

from primal_compiler.executor.replay import replay
from primal_compiler.isa.opcodes import Opcode
from primal_compiler.isa.stream import StreamBuilder
from primal_compiler.target import load_target, with_overrides
from tests.executor.refsim import Deadlock, Mesh


#: The executor's link schedule that corresponds to each reference arbitration order.
SCHEDULE = {"stream": "in-order", "age": "cut-through"}


@lru_cache(maxsize=None)
def _target(rows, cols, hop, bits, issue, schedule, buffer):
    return with_overrides(load_target("primal-7nm"), {
        "ct.mesh_rows": rows, "ct.mesh_cols": cols, "router.hop_latency_cycles": hop, "router.flit_bits": bits,
        "router.link_bits_per_cycle": bits, "system.nmc_issue_cycles": issue, "router.link_schedule": schedule,
        "router.buffer_flits": buffer})


def fast(mesh: Mesh, traffic):
    """Replay ``traffic`` (source, destinations, nbytes) as UNICAST / BCAST records on one CT, under the
    link schedule matching the reference's arbitration order (``SCHEDULE``)."""
    b = StreamBuilder()
    for src, dsts, nbytes in traffic:
        if len(dsts) == 1:
            b.records(1, op=Opcode.UNICAST, ct=0, pe=src, dst_ct=0, dst_pe=dsts[0], nbytes=nbytes)
        else:
            g = b.groups([len(dsts)], np.zeros(len(dsts)), np.asarray(dsts))
            b.records(1, op=Opcode.BCAST, ct=0, pe=src, group=g[0], nbytes=nbytes)
    meta = {"num_cts": 1, "mesh_rows": mesh.rows, "mesh_cols": mesh.cols, "num_layers": 1, "package_cols": 1}
    target = _target(mesh.rows, mesh.cols, mesh.hop_cycles, mesh.link_bits, mesh.issue_cycles, SCHEDULE[mesh.order],
                     mesh.buffer_flits)
    return replay(meta, {}, b.build(), target, mode="central")  # the reference injects at one central issue rate


def random_traffic(rng, mesh: Mesh, n, sizes=(16, 4096), bcast=0.0, hot=0.0, max_group=6):
    """``n`` packets: uniform random pairs, a share ``hot`` sent to one of two hotspots, a share ``bcast`` multicast."""
    pes = mesh.rows * mesh.cols
    hotspots = rng.choice(pes, size=2, replace=False)
    out = []
    for _ in range(n):
        src = int(rng.integers(pes))
        others = np.delete(np.arange(pes), src)
        if rng.random() < bcast:
            k = int(rng.integers(2, min(max_group, pes - 1) + 1))
            dsts = [int(d) for d in rng.choice(others, size=k, replace=False)]
        elif rng.random() < hot and src not in hotspots[:1]:
            dsts = [int(hotspots[0])]
        elif rng.random() < hot and src not in hotspots[1:]:
            dsts = [int(hotspots[1])]
        else:
            dsts = [int(rng.choice(others))]
        out.append((src, dsts, int(rng.integers(sizes[0], sizes[1] + 1))))
    return out


def compare(mesh: Mesh, traffic):
    """(fast replay, reference packets), after checking that every leg has the same hop count."""
    rp, ref = fast(mesh, traffic), mesh.run(traffic)
    legs = rp.transfers
    ref_hops = [p.hops[d] for p in ref for d in p.dsts]
    assert legs.rec.tolist() == [i for i, p in enumerate(ref) for _ in p.dsts]
    assert legs.routes.mesh_hops.tolist() == ref_hops
    return rp, ref


def contention_stats(rp, ref):
    """(relative makespan difference, relative mean-latency difference, per-packet latencies fast/ref)."""
    issue = np.array([p.inject for p in ref])
    lat_fast = rp.finish - issue
    lat_ref = np.array([p.latency for p in ref])
    span_fast, span_ref = rp.end, max(p.done for p in ref)
    return (span_fast - span_ref) / span_ref, (lat_fast.mean() - lat_ref.mean()) / lat_ref.mean(), lat_fast, lat_ref


MESHES = [(2, 2), (3, 5), (4, 4), (6, 3), (8, 8)]


@pytest.mark.parametrize("rows,cols", MESHES)
def test_hops_match_on_random_pairs(rows, cols):
    rng = np.random.default_rng(rows * 10 + cols)
    mesh = Mesh(rows, cols, issue_cycles=1000)
    pes = rows * cols
    traffic = []
    for _ in range(60):
        src, dst = rng.choice(pes, size=2, replace=False)
        traffic.append((int(src), [int(dst)], 16))
    _, ref = compare(mesh, traffic)
    for (src, dsts, _), p in zip(traffic, ref):  # and both equal the Manhattan distance
        assert p.hops[dsts[0]] == abs(src % cols - dsts[0] % cols) + abs(src // cols - dsts[0] // cols)


@pytest.mark.parametrize("rows,cols,hop,bits", [(2, 2, 2, 128), (4, 4, 2, 128), (5, 7, 1, 64), (8, 8, 3, 256)])
@pytest.mark.parametrize("bcast", [0.0, 0.5])
def test_zero_load_latency_exact(rows, cols, hop, bits, bcast):
    """Packets spaced further apart than any one takes: latency = H * hop + F on both models, per leg."""
    mesh = Mesh(rows, cols, hop_cycles=hop, link_bits=bits, issue_cycles=hop * (rows + cols) + 4096 * 8 // bits + 1)
    rng = np.random.default_rng(rows * cols + hop)
    traffic = random_traffic(rng, mesh, 40, sizes=(16, 4096), bcast=bcast)
    rp, ref = compare(mesh, traffic)
    assert (rp.start == [p.inject for p in ref]).all()  # nothing waited
    flits = np.array([p.flits for p in ref])
    legs = rp.transfers
    assert (legs.routes.latency + flits[legs.rec]).tolist() == [p.arrive[d] - p.inject for p in ref for d in p.dsts]
    assert (rp.finish - rp.start).tolist() == [p.latency for p in ref]
    assert [p.latency for p in ref] == [max(hop * p.hops[d] + p.flits for d in p.dsts) for p in ref]


def test_shared_link_agree_when_stream_order_is_arrival_order():
    """The older packet reaches the shared link 1->2 first: both models hand it over at its tail."""
    mesh = Mesh(1, 3, hop_cycles=2, link_bits=128, issue_cycles=1)
    traffic = [(1, [2], 160), (0, [2], 32)]  # 10 flits over 1->2, then 2 flits over 0->1->2
    a, b = mesh.run(traffic)
    assert a.arrive[2] == 0 + 2 + 10
    assert b.arrive[2] == 10 + 2 + 2  # its head waits at router 1 until a's tail crossed 1->2 at cycle 9
    assert fast(mesh, traffic).finish.tolist() == [a.arrive[2], b.arrive[2]]


def test_shared_link_agree_when_a_younger_packet_gets_there_first():
    """The younger packet reaches the idle link 1->2 before the older one's head: both models let it go
    first and the older one wait (work-conserving); links in stream order make the younger one wait."""
    mesh = Mesh(1, 3, hop_cycles=2, link_bits=128, issue_cycles=1)
    traffic = [(0, [2], 160), (1, [2], 32)]  # a: 10 flits over 0->1->2; b, one cycle later: 2 flits over 1->2
    a, b = mesh.run(traffic)
    assert (a.arrive[2], b.arrive[2]) == (15, 5)  # b takes 1->2 at cycle 1, before a's head arrives at 2
    assert fast(mesh, traffic).finish.tolist() == [15, 5]
    mesh.order = "stream"
    assert [p.done for p in mesh.run(traffic)] == fast(mesh, traffic).finish.tolist() == [14, 16]


def test_multicast_trees_deadlock_under_wormhole_but_not_cut_through():
    """Two multicasts along one row, each holding the link the other's second branch needs (why "age" cuts through)."""
    traffic = [(1, [0, 3], 512), (2, [0, 3], 512)]  # 32 flits each, branching both ways at the source
    with pytest.raises(Deadlock):
        Mesh(1, 4, order="age", buffer_flits=4).run(traffic)
    mesh = Mesh(1, 4, order="stream", buffer_flits=4)  # the older one takes both links first, as in-order links do
    assert [p.done for p in mesh.run(traffic)] == fast(mesh, traffic).finish.tolist() == [36, 70]
    mesh = Mesh(1, 4, order="age", buffer_flits=32, cut_through=True)  # the younger one gets 2->3 first
    assert [p.done for p in mesh.run(traffic)] == fast(mesh, traffic).finish.tolist() == [69, 68]


# Contention on short bursts. Two references: "stream" arbitrates links in stream order like the
# executor's in-order links (so the difference is whole-route reservation vs an elastic flit
# pipeline); "age" is a work-conserving router (oldest present packet first; cut-through buffers so
# multicast trees cannot deadlock), compared with the executor's cut-through links (same buffers):
# unicast packets arrive in the same cycle in both; a multicast's branches move independently in the
# executor while the flit model grants all of a router's branches together and moves them in step.
# Steady open-loop load: test_noc.py.
_ROUTER = load_target("primal-7nm").router
REFERENCES = {  # the in-order links know no local ports; cut-through takes the target's
    "stream": dict(order="stream", buffer_flits=4),
    "age": dict(order="age", buffer_flits=32, cut_through=True, injection_ports=_ROUTER.injection_ports,
                ejection_ports=_ROUTER.ejection_ports),
}
SIZES = (16, 512)  # bytes: 1..32 flits of 128 bits
# name: (mesh, packets, issue interval in cycles, multicast share, hotspot share, saturated)
LOADS = {
    "uniform-i1": ((4, 4), 120, 1, 0.0, 0.0, True),
    "uniform-i2": ((4, 4), 120, 2, 0.0, 0.0, True),
    "uniform-i4": ((4, 4), 120, 4, 0.0, 0.0, False),
    "hotspot-i4": ((4, 4), 120, 4, 0.0, 0.5, True),
    "hotspot-i8": ((4, 4), 120, 8, 0.0, 0.5, False),
    "bcast-i4": ((4, 4), 120, 4, 0.3, 0.0, True),
    "bcast-i8": ((4, 4), 120, 8, 0.3, 0.0, False),
    "mixed8-i2": ((8, 8), 200, 2, 0.1, 0.2, True),
    "mixed8-i4": ((8, 8), 200, 4, 0.1, 0.2, False),
    "uniform2-i4": ((2, 2), 100, 4, 0.0, 0.0, False),
}
#: Tolerances (relative difference fast - reference, per run), from the 40-seed table of docs/refsim.md.
STREAM_MAKESPAN = (0.0, 0.15)
STREAM_MEAN_LATENCY = (0.0, 0.15)  # unicast only
STREAM_MEAN_LATENCY_MULTICAST = (0.0, 0.50)  # a multicast waits for its whole tree at once in the executor
AGE_MAKESPAN_MULTICAST = (-0.10, 0.10)  # unicast-only loads: equal, packet for packet
AGE_MEAN_LATENCY_MULTICAST = (-0.20, 0.15)


def run_load(name, reference, seed):
    (rows, cols), n, issue, bcast, hot, _ = LOADS[name]
    mesh = Mesh(rows, cols, issue_cycles=issue, **REFERENCES[reference])
    traffic = random_traffic(np.random.default_rng(seed), mesh, n, sizes=SIZES, bcast=bcast, hot=hot)
    return contention_stats(*compare(mesh, traffic))


def _within(x, bounds):
    lo, hi = bounds
    return (lo is None or x >= lo - 1e-12) and (hi is None or x <= hi + 1e-12)


@pytest.mark.parametrize("name", LOADS)
def test_contention_against_stream_order_reference(name):
    span, mean, lat_fast, lat_ref = run_load(name, "stream", seed=0)
    assert (lat_fast >= lat_ref).all(), "the executor is never faster than the flit model under its own link order"
    assert _within(span, STREAM_MAKESPAN), f"makespan differs by {span:+.1%}"
    bounds = STREAM_MEAN_LATENCY_MULTICAST if LOADS[name][3] else STREAM_MEAN_LATENCY
    assert _within(mean, bounds), f"mean latency differs by {mean:+.1%}"


@pytest.mark.parametrize("name", LOADS)
def test_contention_against_work_conserving_reference(name):
    span, mean, lat_fast, lat_ref = run_load(name, "age", seed=0)
    if not LOADS[name][3]:
        assert (lat_fast == lat_ref).all(), f"{int((lat_fast != lat_ref).sum())} packets differ"
        return
    assert _within(span, AGE_MAKESPAN_MULTICAST), f"makespan differs by {span:+.1%}"
    assert _within(mean, AGE_MEAN_LATENCY_MULTICAST), f"mean latency differs by {mean:+.1%}"


def offered_load(name) -> float:
    """Mean flits injected per PE per cycle while the packets issue."""
    (rows, cols), _, issue, *_ = LOADS[name]
    flits = np.mean([max(1, -(-b * 8 // 128)) for b in range(SIZES[0], SIZES[1] + 1)])
    return flits / (rows * cols * issue)


def table(seeds=range(40)):
    """Markdown table of the agreement under contention over ``seeds`` (docs/refsim.md)."""
    pct = lambda a: f"{np.mean(a):+.1%} / {np.min(a):+.1%} / {np.max(a):+.1%}"  # noqa: E731
    rows = ["| load | mesh | packets | issue every | offered flits/PE/cycle | saturated | reference "
            "| makespan diff mean / min / max | mean-latency diff mean / min / max | per-packet diff median / min |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for name, ((r, c), n, issue, *_, sat) in LOADS.items():
        for ref in REFERENCES:
            spans, means, per = [], [], []
            for seed in seeds:
                span, mean, lat_fast, lat_ref = run_load(name, ref, seed)
                spans.append(span)
                means.append(mean)
                per.append((lat_fast - lat_ref) / lat_ref)
            per = np.concatenate(per)
            rows.append(f"| {name} | {r}x{c} | {n} | {issue} | {offered_load(name):.2f} | {'yes' if sat else 'no'} "
                        f"| {ref} | {pct(spans)} | {pct(means)} | {np.median(per):+.1%} / {np.min(per):+.1%} |")
    return "\n".join(rows)


def exact_sweep(seed=7) -> str:
    """Hops of every PE pair on every mesh up to 8x8; zero-load latency of random traffic on each 2x2..8x8 mesh."""
    pairs = legs = wrong = 0
    for rows in range(1, 9):
        for cols in range(1 if rows > 1 else 2, 9):
            mesh, pes = Mesh(rows, cols), rows * cols
            traffic = [(s, [d], 16) for s in range(pes) for d in range(pes) if s != d]
            ref = [mesh.tree(s, d)[1][d[0]] for s, d, _ in traffic]
            wrong += int((fast(mesh, traffic).transfers.routes.mesh_hops != ref).sum())
            pairs += len(traffic)
    rng = np.random.default_rng(seed)
    for rows in range(2, 9):
        for cols in range(2, 9):
            hop, bits = int(rng.integers(1, 4)), int(rng.choice([64, 128, 256]))
            mesh = Mesh(rows, cols, hop_cycles=hop, link_bits=bits, buffer_flits=hop + 2,
                        issue_cycles=hop * (rows + cols) + 4096 * 8 // bits + 1)
            rp, ref = compare(mesh, random_traffic(rng, mesh, 30, sizes=(16, 4096), bcast=0.3))
            flits = np.array([p.flits for p in ref])
            got = (rp.transfers.routes.latency + flits[rp.transfers.rec]).tolist()
            wrong += sum(a != b for a, b in zip(got, [p.arrive[d] - p.inject for p in ref for d in p.dsts]))
            legs += len(got)
    return f"{pairs} PE pairs (hops) and {legs} zero-load legs (hops and latency) compared: {wrong} mismatches"


if __name__ == "__main__":
    print(exact_sweep())
    print(table(range(int(sys.argv[1]) if len(sys.argv) > 1 else 40)))
