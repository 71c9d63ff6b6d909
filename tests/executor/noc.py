"""Open-loop traffic on one PE mesh, through the fast executor's link model and the flit-level reference.

Every node injects packets by a Bernoulli process (``rate`` flits per node per
cycle, packets of ``flits`` flits) to destinations of a synthetic pattern, for
``cycles`` cycles. The executor side runs the compiled timing recurrence
(:func:`primal_compiler.executor.kernel.schedule`) on the routes of
:func:`primal_compiler.executor.transfers.expand`, each node a sequencer that
dispatches one slot per cycle (a packet or nothing), so a packet is ready at
its injection cycle exactly as in :mod:`tests.executor.refsim`. Latency is
from injection to the tail's delivery; statistics cover the packets injected
after a warm-up, and accepted throughput counts the flits delivered inside the
measurement window. Used by ``test_noc.py`` and ``benchmarks/noc.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from primal_compiler.executor.kernel import schedule
from primal_compiler.executor.topology import Topology, local_ports
from primal_compiler.executor.transfers import expand
from primal_compiler.isa.opcodes import Opcode
from primal_compiler.isa.stream import StreamBuilder
from tests.executor.refsim import Mesh

PATTERNS = ("uniform", "transpose", "bitcomp", "hotspot", "all-to-one")


@dataclass(frozen=True)
class Load:
    """One open-loop experiment: mesh, pattern, offered flits per node per cycle, packet flits, cycles."""

    rows: int
    cols: int
    pattern: str
    rate: float
    flits: int
    cycles: int
    warmup: int
    seed: int = 0
    hop_cycles: int = 2
    link_bits: int = 128
    buffer_flits: int = 16
    ports: int = 1  # injection and ejection ports of every node (router.injection_ports, router.ejection_ports)


def _destination(load: Load, rng: np.random.Generator, src: np.ndarray) -> np.ndarray:
    pes = load.rows * load.cols
    x, y = src % load.cols, src // load.cols
    if load.pattern == "transpose":
        return x * load.cols + y
    if load.pattern == "bitcomp":
        return (load.rows - 1 - y) * load.cols + (load.cols - 1 - x)
    hot = (load.rows // 2) * load.cols + load.cols // 2  # the centre
    if load.pattern == "all-to-one":
        return np.full(len(src), hot)
    other = rng.integers(pes - 1, size=len(src))
    uniform = other + (other >= src)
    if load.pattern == "uniform":
        return uniform
    return np.where((rng.random(len(src)) < 0.25) & (src != hot), hot, uniform)  # hotspot: a quarter to the centre


def traffic(load: Load) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(injection cycle, source, destination) per packet, in injection order (then source)."""
    if load.pattern not in PATTERNS:
        raise ValueError(f"unknown pattern {load.pattern!r}")
    if load.pattern == "transpose" and load.rows != load.cols:
        raise ValueError("transpose needs a square mesh")
    rng = np.random.default_rng(load.seed)
    pes = load.rows * load.cols
    fire = rng.random((load.cycles, pes)) < load.rate / load.flits
    cycle, src = np.nonzero(fire)
    dst = _destination(load, rng, src)
    keep = dst != src  # transpose's diagonal and bitcomp's centre send nothing
    return cycle[keep].astype(np.int64), src[keep].astype(np.int64), dst[keep].astype(np.int64)


def run_executor(load: Load, schedule_name: str = "cut-through") -> tuple[np.ndarray, np.ndarray]:
    """(injection cycle, delivery cycle) per packet through the executor's routes and link model."""
    cycle, src, dst = traffic(load)
    b = StreamBuilder()
    nbytes = load.flits * load.link_bits // 8
    b.records(len(src), op=Opcode.UNICAST, ct=0, pe=src, dst_ct=0, dst_pe=dst, nbytes=nbytes)
    stream = b.build()
    topo = Topology(1, load.rows, load.cols, 1, "xy", load.hop_cycles, 1, load.link_bits / 8, 1.0)
    tr = expand(stream, topo, 1.0)
    # every (cycle, node) slot is a record: the packet injected there, or an empty slot
    pes = load.rows * load.cols
    slots = load.cycles * pes
    where = cycle * pes + src
    is_packet = np.zeros(slots, dtype=bool)
    is_packet[where] = True
    rows_per = np.zeros(slots, dtype=np.int64)
    rows_per[where] = np.diff(tr.link_ptr)
    link_ptr = np.concatenate([[0], np.cumsum(rows_per)])
    busy = np.zeros(slots, dtype=np.int64)
    busy[where] = tr.net_cycles
    hold = np.ones(slots, dtype=np.int64)
    hold[where] = tr.hold_mesh
    op = np.full(slots, int(Opcode.UNICAST), dtype=np.int64)
    none = np.full(slots, -1, dtype=np.int64)
    out = schedule(op, busy, none, np.zeros(slots + 1, np.int64), np.zeros(0, np.int64), link_ptr, tr.link,
                   tr.link_offset, none, tr.tree, hold, hold, none, none, np.zeros(slots, bool), np.tile(np.arange(pes), load.cycles),
                   np.ones(pes, np.int64), np.zeros(slots, np.int64), 1, topo.num_links, 1, topo.d2d_base,
                   schedule_name == "cut-through", load.hop_cycles, 1, load.buffer_flits, True,  # flit = link width here
                   *local_ports(topo, np.arange(topo.d2d_base), load.ports, load.ports), load.ports, load.ports)
    dispatch, finish = out[0], out[2]
    assert (dispatch[where] == cycle).all()
    return cycle, finish[where]


def run_reference(load: Load) -> tuple[np.ndarray, np.ndarray]:
    """(injection cycle, delivery cycle) per packet in the flit model: age order, cut-through buffers."""
    cycle, src, dst = traffic(load)
    mesh = Mesh(load.rows, load.cols, hop_cycles=load.hop_cycles, link_bits=load.link_bits, order="age",
                buffer_flits=load.buffer_flits, cut_through=True, injection_ports=load.ports, ejection_ports=load.ports)
    nbytes = load.flits * load.link_bits // 8
    pk = mesh.run([(int(s), [int(d)], nbytes) for s, d in zip(src, dst)], inject=cycle)
    return cycle, np.array([p.done for p in pk], dtype=np.int64)


def stats(load: Load, inject: np.ndarray, done: np.ndarray) -> dict:
    """Mean latency of the packets injected after the warm-up; accepted flits per node per cycle in the
    window [warm-up, cycles); offered load actually injected in that window."""
    measured = inject >= load.warmup
    window = load.cycles - load.warmup
    pes = load.rows * load.cols
    inside = (done > load.warmup) & (done <= load.cycles)
    return {
        "latency": float((done - inject)[measured].mean()),
        "accepted": float(inside.sum() * load.flits / (pes * window)),
        "offered": float(measured.sum() * load.flits / (pes * window)),
    }
