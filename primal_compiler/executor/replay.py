"""Replay a compiled program's instruction stream on the mesh/PIM model of its target.

Stages (each vectorized over records, named in :attr:`Replay.stages` with
their wall time): ``control`` (the sequencer of every record, :mod:`.control`;
first, so a program whose CT programs overflow their instruction buffers is refused before anything else
is built), ``transfers`` (legs and links of router records), ``costs`` (per-opcode busy time, unit and
dynamic energy), ``deps`` (RAW/WAR/WAW predecessors on element ranges), ``buffers`` (the scratchpad buffer
instances, :mod:`.buffers`; these two on a second thread beside ``transfers`` and ``costs``, timed by what they
add after ``costs``), ``schedule`` (the timing recurrence of :mod:`.kernel`), ``memory`` (their lifetimes
and every PE's occupancy, :mod:`.memory`) and ``power`` (CT state intervals). Every number a report
prints is computed from these arrays, so changing the stream changes them.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
import functools
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.executor import buffers, costs, deps, leakage, memory, power, transfers
from primal_compiler.executor.cache import ReplayCache, Schedule, lookup, replay_key, store
from primal_compiler.executor.buffers import program_tiles, tile_shapes
from primal_compiler.executor.control import Control, control
from primal_compiler.executor.linkstate import WAIT_LIMIT
from primal_compiler.executor.kernel import schedule
from primal_compiler.executor.sram_slots import check_slots, lora_bits
from primal_compiler.executor.topology import Topology, local_ports, port_pes
from primal_compiler.isa.opcodes import CONTROLLER, NONE16, Opcode
from primal_compiler.isa.stream import Stream
from primal_compiler.target.spec import PrimalTarget


@dataclass(frozen=True, eq=False)
class LinkWait:
    """What the links did (:mod:`.kernel`): per link row of the transfers, the cycles its leg's head has
    waited in routers up to entering that link (accumulated along the leg; cut-through; 0 in-order); per
    record, its legs' largest wait counting the wait to eject at a destination (a record finishes at its
    start plus its busy cycles plus the larger of that and its rows' waits), and the link constraint on its
    start (in-order; -1 none under cut-through): the earlier transfer whose reservation bounds it, that
    bound in cycles, and whether the link is a PE-mesh link."""

    wait: np.ndarray  # int32 per link row
    ejected: np.ndarray  # int64 per record: its legs' largest wait counting the wait to eject at the destination
    by: np.ndarray  # int64
    bound: np.ndarray  # int64
    mesh: np.ndarray  # bool


@dataclass(frozen=True, eq=False)
class Replay:
    """Per-record timing and energy of one replayed stream, and how it was obtained."""

    meta: dict
    arrays: dict
    stream: Stream
    target: PrimalTarget
    topo: Topology
    ctx: costs.Ctx
    control: Control
    pred_ptr: np.ndarray  # int64 CSR over records (deps.predecessors)
    pred: np.ndarray
    busy: np.ndarray  # int64 cycles each record holds its unit (or the network)
    unit: np.ndarray  # int64 unit of each record, -1 none
    dispatch: np.ndarray  # int64 cycles: when its sequencer dispatched it
    start: np.ndarray  # int64 cycles
    finish: np.ndarray
    energy_pj: dict[str, np.ndarray]  # component -> per record
    links_crossed: tuple[np.ndarray, np.ndarray]  # per record: distinct PE-mesh links, other links its bits cross
    timeline: power.Timeline
    stages: tuple[tuple[str, float], ...]
    link_wait: LinkWait
    memory: memory.Memory | None  # scratchpad occupancy (None for a hand-written stream without a model)
    max_active_pes: int = 0  # RRAM macros of a CT converting at once (costs.throttled); 0: no limit
    from_cache: bool = False  # its schedule read from a ReplayCache: no dependency edges, no per-link waits

    @property
    def transfers(self) -> transfers.Transfers:
        return self.ctx.transfers

    @property
    def end(self) -> int:
        return int(self.finish.max()) if len(self.finish) else 0

    def seconds(self, cycles) -> float:
        return float(cycles) / self.target.system.clock_hz

    def section(self, name: str) -> np.ndarray:
        """Record indices of section ``name``."""
        for s in self.stream.sections:
            if s.name == name:
                return np.arange(s.start, s.stop)
        raise KeyError(name)


def topology(meta: dict, target: PrimalTarget) -> Topology:
    r = target.router
    num_cts = int(meta["num_cts"])
    return Topology(
        num_cts=num_cts, mesh_rows=int(meta["mesh_rows"]), mesh_cols=int(meta["mesh_cols"]),
        package_cols=int(meta.get("package_cols") or max(1, math.ceil(math.sqrt(num_cts)))),
        routing=target.ct.routing, hop_cycles=r.hop_latency_cycles, d2d_cycles=target.d2d.latency_cycles,
        mesh_bytes_per_cycle=r.link_bits_per_cycle / 8,
        d2d_bytes_per_cycle=target.d2d.bandwidth_bytes_per_s / target.system.clock_hz,
        terminal_cycles=r.injection_cycles + r.ejection_cycles,
        ports=port_pes(int(meta["mesh_cols"]), target.d2d.ports_per_ct),
    )


def touched(records) -> tuple[np.ndarray, np.ndarray]:
    """The CT a record runs on and the other CT it writes to (-1 none)."""
    ct = records["ct"].astype(np.int64)
    dst = records["dst_ct"].astype(np.int64)
    a = np.where(ct == CONTROLLER, -1, ct)
    b = np.where((dst == NONE16) | (dst == CONTROLLER) | (dst == ct), -1, dst)
    return a, b


def blocking(records, mode: str) -> np.ndarray:
    """Records that hold back their sequencer until they finish: under central control, what the in-order
    NMC executes itself (EMBED, ARGMAX), so a step issues once the previous token is known; under
    distributed control none (the next EMBED waits for its token through the TOKEN buffer instead)."""
    own = (records["op"] == Opcode.ACT) & (records["ct"] == CONTROLLER)
    return own if mode == "central" else np.zeros(len(records), dtype=bool)


def replay(meta: dict, arrays: dict, stream: Stream, target: PrimalTarget, where: str = "program", mode: str | None = None,
           max_active_pes: int = 0, cache: ReplayCache | None = None, rows: bool = True) -> Replay:
    """Replay ``stream`` on ``target`` under control ``mode`` (default: the target's ``system.control``), with at
    most ``max_active_pes`` RRAM macros of a CT converting at once (:func:`costs.throttled`; 0: no limit).
    With ``cache`` (and no throttle), the ``deps``, ``buffers``, ``schedule`` and ``memory`` stages are read from it when it
    holds this replay, and kept in it otherwise (:mod:`.cache`); a schedule read from it needs no link rows, and
    without ``rows`` its transfers have none (:func:`.transfers.expand`: every figure a report prints is the same,
    only a traffic map draws the rows).

    InputError naming ``where`` if a record runs on a gated CT, reads a location no record wrote, or a
    CT's program overflows its instruction buffer.
    """
    stages = []
    clock = time.perf_counter()

    def mark(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        stages.append((name, now - clock))
        clock = now

    topo = topology(meta, target)
    rram_rows, rram_cols, sram_rows, sram_cols = tile_shapes(program_tiles(arrays), topo.num_cts, topo.pes)
    if "tile_macro" in arrays:  # a compiled program: its SRAM slots must exist (a hand-written stream has no tiles)
        check_slots(stream.records, sram_rows, sram_cols, topo.pes, target, lora_bits(meta), where)
    ctl = control(stream, target, topo.num_cts, where, mode)  # first: a program past a buffer is refused at once
    mark("control")
    key = replay_key(meta, arrays, stream, timing_hash(target), ctl.mode) if cache and not max_active_pes else None
    kept = lookup(cache, key) if cache and key else None
    hit = kept is not None
    if key:
        mark("cache")
    r = target.router
    local_rate = r.scratchpad_banks * r.scratchpad_bank_width_bits / 8
    kv = meta.get("kv") or {}
    with ThreadPoolExecutor(1) as beside:  # deps and buffers on the other core while transfers and costs run
        sizing = (buffers.Sizing(topo.pes, rram_rows, rram_cols, sram_rows, sram_cols, r.dmac_bits,
                                 memory.precision(meta)) if "model_ir" in meta and not hit else None)
        job = None if hit else beside.submit(_dependencies, stream, sizing, where)
        tr = transfers.expand(stream, topo, local_rate, rows or not hit)
        mark("transfers")
        ctx = costs.Ctx(target, topo, stream.records, stream, tr, rram_rows, rram_cols, sram_rows, sram_cols,
                        costs.bank_lanes(target, kv), int(kv.get("head_dim", 0)))
        busy, unit, energy = costs.record_costs(ctx, where)
        unit = costs.throttled(ctx, unit, max_active_pes)
        mark("costs")
        deps_done = job.result() if job else None
    if kept is not None:
        none64 = np.zeros(0, np.int64)
        ptr, pred, waits = np.zeros(len(stream.records) + 1, np.int64), none64, LinkWait(
            np.zeros(0, np.int32), none64, none64, none64, np.zeros(0, bool))
    else:
        assert deps_done is not None  # submitted on every miss
        ptr, pred, inst, ends = deps_done
        for name, end in zip(("deps", "buffers"), ends):  # what each added after costs, so the stages sum to the wall
            stages.append((name, max(0.0, end - clock)))
            clock = max(clock, end)
        kept, waits = _schedule(stream, target, topo, tr, ctx, ctl, busy, unit, ptr, pred, inst, meta, arrays, where, mark)
    energy["links"] = costs.link_energy(ctx, kept.n_mesh, kept.n_other)
    start, finish, mem = kept.start, kept.finish, kept.memory
    end = int(finish.max()) if len(finish) else 0
    tl = power.timeline(stream.records, start, finish, topo.num_cts, end,
                        power.sram_powered(arrays, topo.num_cts, topo.pes), topo.pes, target.thermal.leakage_reference_c)
    none = np.zeros(0, dtype=np.int64)
    tl = power.scratchpads_kept(tl, target, topo.pes, mem.kv_bytes if mem else None, mem.inst_pe if mem else none,
                                mem.inst_begin if mem else none, mem.inst_end if mem else none)
    tl = leakage.at_temperature(tl, stream.records, energy, end, topo, target, where)
    mark("power")
    if cache and key and not hit:
        store(cache, key, kept)
        mark("cache write")
    return Replay(meta, arrays, stream, target, topo, ctx, ctl, ptr, pred, busy, unit, kept.dispatch, start, finish,
                  energy, (kept.n_mesh, kept.n_other), tl, tuple(stages), waits, mem, max_active_pes, hit)


def _dependencies(stream: Stream, sizing: buffers.Sizing | None, where: str) -> tuple[
        np.ndarray, np.ndarray, buffers.Instances | None, tuple[float, float]]:
    """The ``deps`` and ``buffers`` stages (run beside ``transfers`` and ``costs``): the dependency CSR, the buffer
    instances (none without a ``sizing``: a stream without a model) and the clock when each stage ended. The
    instances are sized here so the footprints (8 M rows on the main job) are not held through the schedule."""
    prints = deps.footprints(stream)
    ptr, pred = deps.predecessors(stream, where, prints)
    done = time.perf_counter()
    inst = buffers.instances(stream, prints, sizing) if sizing is not None else None
    return ptr, pred, inst, (done, time.perf_counter())


def _schedule(stream: Stream, target: PrimalTarget, topo: Topology, tr: transfers.Transfers, ctx: costs.Ctx,
              ctl: Control, busy: np.ndarray, unit: np.ndarray, ptr: np.ndarray, pred: np.ndarray,
              inst: buffers.Instances | None, meta: dict, arrays: dict, where: str,
              mark: Callable[[str], None]) -> tuple[Schedule, LinkWait]:
    """The ``schedule`` and ``memory`` stages: (the schedule, link waits)."""
    r = target.router
    a, b = touched(stream.records)
    link, num_links, mesh_ids = used_links(tr.link, topo.num_links, topo.d2d_base)
    mesh_links = len(mesh_ids)
    ports = local_ports(topo, mesh_ids, r.injection_ports, r.ejection_ports)
    dispatch, start, finish, bad, n_mesh, n_other, wait, link_by, link_bound, link_mesh, stuck, ejected = schedule(
        stream.records["op"].astype(np.int64), busy, unit, ptr, pred, tr.link_ptr, link, tr.link_offset, tr.tree_at,
        tr.tree, tr.hold_mesh, tr.hold_other, a, b, blocking(stream.records, ctl.mode), ctl.seq, ctl.issue_cycles, ctl.reload,
        ctx.num_units, num_links, topo.num_cts, mesh_links, r.link_schedule == "cut-through",
        r.hop_latency_cycles, target.d2d.latency_cycles, r.buffer_link_cycles, r.arbitration == "age", *ports,
        r.injection_ports, r.ejection_ports)
    del link  # the renumbered link of every row (4 bytes each, 68 M rows on Llama-2-13B): the schedule's alone
    if bad >= 0:
        rec = stream.records[bad]
        raise InputError(where, f"record {bad} ({Opcode(rec['op']).name} ct={rec['ct']}) runs on a gated CT "
                                f"(no PG_ON after its PG_OFF)")
    if stuck >= 0:
        raise InputError(where, f"record {stuck} ({Opcode(stream.records['op'][stuck]).name}) is never delivered: its "
                                f"packets wait on one another in the routers' buffers (deadlock)")
    if len(wait) and int(wait.max()) >= WAIT_LIMIT:
        rec = int(np.searchsorted(tr.link_ptr, int(np.argmax(wait)), side="right") - 1)
        raise InputError(where, f"record {rec} ({Opcode(stream.records['op'][rec]).name}) waits {WAIT_LIMIT:,} cycles "
                                f"or more in routers, beyond what the replay records per link")
    mark("schedule")
    mem = memory.occupancy(stream, inst, start, finish, ctx, meta, arrays) if inst is not None else None
    mark("memory")
    return Schedule(dispatch, start, finish, n_mesh, n_other, mem), LinkWait(wait, ejected, link_by, link_bound, link_mesh)


def used_links(link: np.ndarray, num_links: int, mesh_links: int) -> tuple[np.ndarray, int, np.ndarray]:
    """``link`` renumbered over the links some row uses, in order, so PE-mesh links (ids below
    ``mesh_links``) stay first: (renumbered rows, links used, the original id of each PE-mesh link used,
    whose count is the first renumbered id that is not a PE-mesh link). The schedule keeps a calendar and a buffer per link it is given; Llama-2-70B's rows
    use 2.7 of its 4.3 million links, and the calendars and buffers of the others were 1.3 GB of memory it
    zeroed for nothing."""
    used = np.zeros(num_links, dtype=bool)
    used[link] = True
    ids = (np.cumsum(used) - 1).astype(link.dtype)
    return ids[link], int(ids[-1]) + 1 if num_links else 0, np.flatnonzero(used[:mesh_links])


ENERGY_UNITS = ("pJ", "uW")
"""Units of the target keys that change energy and never time (with the power-gating leakage fractions and
the thermal table, which sets the dies' temperature and so their leakage)."""


def energy_only(key: str) -> bool:
    """Whether target key ``key`` (dotted) prices energy only: a replay's timing does not depend on it, so
    :func:`reprice` gives what a replay under a changed value gives."""
    return (_units().get(key) in ENERGY_UNITS or key.startswith("thermal.")
            or key in ("power_gating.gated_leakage_fraction", "power_gating.retained_leakage_fraction"))


def timing_hash(target: PrimalTarget) -> str:
    """sha256 of every value of ``target`` a replay's timing and scratchpad occupancy depend on: all but its
    :func:`energy_only` keys and its name and description (what :mod:`.cache` keys a schedule by)."""
    flat = {k: v for k, v in _flat(target).items() if not energy_only(k) and k not in ("name", "description")}
    return hashlib.sha256(json.dumps(flat, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _flat(target: PrimalTarget) -> dict[str, object]:
    """Every value of ``target`` by its dotted key."""
    flat: dict[str, object] = {}

    def walk(prefix: str, d: dict) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                walk(f"{prefix}{k}.", v)
            else:
                flat[f"{prefix}{k}"] = v

    walk("", target.to_dict())
    return flat


COST_ONLY = ("act.",)
"""Target tables a replay reads only through its cost rules (:mod:`.costs`): a change there reaches the replay of a
given stream through each record's busy cycles, unit and energy alone (codegen also reads
``act.attn_softcap_ops_per_element``, into the stream it compiles)."""


def same_schedule(rp: Replay, target: PrimalTarget) -> bool:
    """Whether replaying ``rp``'s stream on ``target`` would schedule every record as ``rp`` did: ``target`` differs from
    ``rp.target`` only in :func:`energy_only` keys and keys of :data:`COST_ONLY` tables, and every record's busy cycles
    and unit come out the same under it (an activation's op count that no record of the stream uses, for one). Then
    :func:`reprice` gives what that replay gives."""
    a, b = _flat(rp.target), _flat(target)
    changed = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)} - {"name", "description"}
    if not all(energy_only(k) or k.startswith(COST_ONLY) for k in changed):
        return False
    busy, unit, _ = costs.record_costs(replace(rp.ctx, target=target), "program")
    return np.array_equal(busy, rp.busy) and np.array_equal(costs.throttled(rp.ctx, unit, rp.max_active_pes), rp.unit)


@functools.cache
def _units() -> dict[str, str]:
    from primal_compiler.target.table import schema

    return {f.key: f.unit for f in schema(PrimalTarget)}


def without_link_rows(rp: Replay) -> Replay:
    """``rp`` without its per-(record, link) rows and dependency edges, the bulk of a replay's memory: what
    :func:`~primal_compiler.executor.metrics.metrics` and :func:`reprice` read is kept (per record, per leg)."""
    none32, none64 = np.zeros(0, np.int32), np.zeros(0, np.int64)
    waits = replace(rp.link_wait, wait=none32)
    return replace(rp, ctx=replace(rp.ctx, transfers=rp.transfers.without_rows()), link_wait=waits, pred=none64,
                   pred_ptr=np.zeros(len(rp.pred_ptr), np.int64))


def reprice(rp: Replay, target: PrimalTarget) -> Replay:
    """``rp`` with its dynamic energy recomputed for ``target``, its timing kept: exact when ``target`` differs
    from the replayed one only in :func:`energy_only` keys (``tests/executor/test_reprice.py``)."""
    ctx = replace(rp.ctx, target=target)
    _, _, energy = costs.record_costs(ctx, "program")
    energy["links"] = costs.link_energy(ctx, *rp.links_crossed)
    tl = leakage.at_temperature(rp.timeline, rp.stream.records, energy, rp.end, rp.topo, target)
    return replace(rp, target=target, ctx=ctx, energy_pj=energy, timeline=tl)
