"""The network legs of every router record and the links each record occupies.

A leg is one source-destination pair of a record: ``UNICAST``, ``KV_APPEND``
and ``CONFIG`` have one; ``BCAST`` one per member of its group (source to
member); ``REDUCE`` one per member (member to destination). Link rows come
record by record, leg by leg, in path order, a multicast's legs merged into a
tree where they share a path and a reduction's into one row per link
(:mod:`.trees`); a multicast's branches may still meet again on one link, and
the schedule counts such a link once: the record needs it from the earliest
offset at which one of its legs reaches it, holds it for
``ceil(nbytes / link bytes per cycle)`` cycles after the latest (a reduction's
row: its span later), and pays its energy once.

A record's network time is the largest over its legs of head latency plus
serialization on the slowest link of the leg; a leg that stays on one PE
copies through the scratchpad at its bank bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.arrays import ranges
from primal_compiler.executor import trees
from primal_compiler.executor.topology import Routes, Topology, plan
from primal_compiler.isa.opcodes import CONTROLLER, BufKind, Opcode

if TYPE_CHECKING:
    from primal_compiler.isa.stream import Stream


@dataclass(frozen=True)
class Transfers:
    """Legs (one row per leg) and occupied links (CSR over records) of a stream: a record's link rows are its legs'
    rows leg by leg in path order, a multicast's merged into a tree where its legs share a path (:mod:`.trees`);
    ``routes`` keeps the legs' hops and latencies, not their rows."""

    rec: np.ndarray  # int64 record of each leg
    src_ct: np.ndarray
    src_pe: np.ndarray
    dst_ct: np.ndarray
    dst_pe: np.ndarray
    routes: Routes
    link_ptr: np.ndarray  # int64 (N+1,): link rows of record i are link_ptr[i]:link_ptr[i+1]
    link: np.ndarray  # int32 link id (may repeat within a record, see above)
    link_offset: np.ndarray  # int32 cycles after the record starts
    tree_at: np.ndarray  # int64 per record: its first row of ``tree``, -1 when its rows are legs (not a tree)
    tree: np.ndarray  # int32 (rows, 4): trees.UP, KID, SIB, ENDS of every row of a tree record, record by record
    hold_mesh: np.ndarray  # int64 per record: cycles it holds a PE-mesh link
    hold_other: np.ndarray  # int64 per record: cycles it holds a die-to-die or controller link
    net_cycles: np.ndarray  # int64 per record: network time (0 for non-router records)
    mesh_links: int  # link ids below this are PE-mesh links

    @property
    def link_hold(self) -> np.ndarray:
        """Cycles each link row is held (for analysis; the schedule reads the per-record holds)."""
        rec = np.repeat(np.arange(len(self.link_ptr) - 1), np.diff(self.link_ptr))
        return np.where(self.link < self.mesh_links, self.hold_mesh[rec], self.hold_other[rec])

    def without_rows(self) -> Transfers:
        """These legs without their link rows (:func:`expand` without ``rows`` gives the same)."""
        kept, tree_at, tree, link, offset = _no_rows(len(self.tree_at))
        return replace(self, link_ptr=np.zeros(len(kept) + 1, np.int64), link=link, link_offset=offset,
                       tree_at=tree_at, tree=tree)


def _no_rows(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What :func:`.trees.build` gives for ``n`` records when no link row is walked: none kept, no tree records,
    no tree rows, links and offsets."""
    none32 = np.zeros(0, np.int32)
    return np.zeros(n, np.int64), np.full(n, -1, np.int64), np.zeros((0, 4), np.int32), none32, none32


def _one(rec, r):
    return rec, r["ct"][rec], r["pe"][rec], r["dst_ct"][rec], r["dst_pe"][rec]


def group_members(stream: Stream, rec):
    """(record, member CT, member PE) of every group member of records ``rec``."""
    g = stream.records["group"][rec].astype(np.int64)
    size = stream.group_ptr[g + 1] - stream.group_ptr[g]
    which = np.repeat(rec, size)
    k = ranges(stream.group_ptr[g], size)
    return which, stream.group_ct[k].astype(np.int64), stream.group_pe[k].astype(np.int64)


def _bcast(stream: Stream, rec):
    which, mct, mpe = group_members(stream, rec)
    r = stream.records
    return which, r["ct"][which], r["pe"][which], mct, mpe


def _reduce(stream: Stream, rec):
    which, mct, mpe = group_members(stream, rec)
    r = stream.records
    return which, mct, mpe, r["dst_ct"][which], r["dst_pe"][which]


#: How each router opcode expands into legs (source, destination per leg).
LEG_RULES = {
    Opcode.BCAST: _bcast,
    Opcode.REDUCE: _reduce,
    Opcode.UNICAST: lambda s, rec: _one(rec, s.records),
    Opcode.KV_APPEND: lambda s, rec: _one(rec, s.records),
    Opcode.CONFIG: lambda s, rec: _one(rec, s.records),
}


#: Buffer kinds written by attention and KV-cache transfers (placed by kv-ring, not by the mapping passes).
ATTENTION_KINDS = (BufKind.QVEC, BufKind.SCORE, BufKind.KV_K, BufKind.KV_V, BufKind.OBLK)


def attention_legs(records, leg_rec: np.ndarray) -> np.ndarray:
    """Which legs (given their records) move queries, scores, attention outputs or KV entries."""
    kind = records["dst_buf"][leg_rec].astype(np.int64) >> 12
    return np.isin(kind, ATTENTION_KINDS) | (records["op"][leg_rec] == Opcode.KV_APPEND)


def _pe(ct, pe):
    """Controller records carry no PE; route them from/to the controller itself."""
    return np.where(ct == CONTROLLER, 0, pe)


def expand(stream: Stream, topo: Topology, local_bytes_per_cycle: float, rows: bool = True) -> Transfers:
    """Legs and link occupancy of every router record of ``stream``; without ``rows``, no link rows (``link``,
    ``link_offset`` and ``tree`` empty, ``link_ptr`` zeros, ``tree_at`` -1): every leg's hops, latency and every
    record's network time and holds are there, what a schedule read from a replay cache needs."""
    r = stream.records
    n = len(r)
    parts = []
    for op, rule in LEG_RULES.items():
        rec = np.flatnonzero(r["op"] == op)
        parts.append([np.asarray(a, dtype=np.int64) for a in rule(stream, rec)])
    rec, sct, spe, dct, dpe = (np.concatenate(c) for c in zip(*parts))
    order = np.argsort(rec, kind="stable")
    rec, sct, spe, dct, dpe = rec[order], sct[order], _pe(sct[order], spe[order]), dct[order], dpe[order]
    dpe = _pe(dct, dpe)
    routes, walks = plan(topo, sct, spe, dct, dpe)
    nbytes = r["nbytes"].astype(np.int64)
    hold_mesh = np.maximum(1, np.ceil(nbytes / topo.mesh_bytes_per_cycle)).astype(np.int64)
    hold_other = np.maximum(1, np.ceil(nbytes / topo.d2d_bytes_per_cycle)).astype(np.int64)
    # serialization of a leg: its slowest kind of link (or the scratchpad for a local copy)
    slow = np.maximum(np.where(routes.mesh_hops > 0, hold_mesh[rec], 0), np.where(routes.pkg_hops > 0, hold_other[rec], 0))
    local = np.ceil(nbytes[rec] / local_bytes_per_cycle).astype(np.int64)
    leg_time = np.where(routes.latency > 0, routes.latency + slow, np.maximum(local, 1))
    net = np.zeros(n, dtype=np.int64)
    np.maximum.at(net, rec, leg_time)
    kind = np.where(r["op"] == Opcode.BCAST, trees.MULTICAST, np.where(r["op"] == Opcode.REDUCE, trees.REDUCTION, 0))
    kept, tree_at, tree, link, offset = (trees.build(rec, routes, walks, topo.num_links, kind) if rows else
                                         _no_rows(n))
    routes = replace(routes, ptr=np.zeros(0, np.int64))  # its rows are link, offset
    return Transfers(rec, sct, spe, dct, dpe, routes, np.r_[0, np.cumsum(kept)], link, offset, tree_at, tree,
                     hold_mesh, hold_other, net, topo.d2d_base)
