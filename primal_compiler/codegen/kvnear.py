"""KV chunks placed near the roots they exchange data with (``kv-ring{placement=near}``).

K and V of one chunk share a *domino*: two routers adjacent on their CT's
snake, so a chunk's scores travel one hop. Every (sequence, KV head) needs
``chunks`` dominoes of its layer's CTs; a domino holds at most
ceil(pairs / dominoes) K/V pairs (the fewest that fit), so the cache stays
balanced over the routers, their DMACs and scratchpads.
A head's cost at a domino is the byte-hops of one decode step's transfers
between its roots and the two units (:func:`codegen.attention.unit_flows`:
the query multicast and 1/``chunks`` of the append into K; the append and the
softmax merge of V), in the better of the two orientations. A transfer inside
one CT costs its XY hops; one between CTs its hops to the source CT's nearest
port, over the package mesh and from the destination CT's nearest port, as the
executor routes it (``docs/executor.md``, Network).

Each pair pays its transfers in full. Where a domino holds several pairs
of one head (a context larger than the layer's routers), the emitter's query
multicast and merge reach that router once, so the model overcounts them
and the byte-hop step is no longer exact for the emitted stream; the hop
bound still is (Llama-2-13B at 2048 context: one pair per domino).

The placement is exact for this cost model, in two steps: first the
smallest bound ``D`` on the on-CT hops of any of those transfers for which
every head still gets its dominoes (bisection over the distinct hop counts,
each a max-flow feasibility test), then, among placements within ``D``, the
least byte-hops (a min-cost flow). Both flows are OR-Tools'.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.codegen.attention import unit_flows
from primal_compiler.codegen.kvmap import KvMap, snake_routers
from primal_compiler.codegen.routes import LayerRoutes
from primal_compiler.errors import InputError
from primal_compiler.executor.topology import port_pes
from primal_compiler.mapping.lower import geometry, layer_templates

if TYPE_CHECKING:
    from primal_compiler.ir.program import Program
    from primal_compiler.target.spec import PrimalTarget

Ends = list[tuple[tuple[int, int], float]]  # ((global CT, PE), bytes per decode step) of a unit's transfers


@dataclass(frozen=True)
class Mesh:
    """The geometry distances are measured on: CT mesh shape and every CT's package-mesh coordinates."""

    rows: int
    cols: int
    ct_x: np.ndarray  # int64, indexed by global CT
    ct_y: np.ndarray
    ports: tuple[int, ...] = (0,)  # PEs of each CT's die-to-die ports (executor.topology.port_pes)

    def hops(self, a: tuple[int, int], ct: np.ndarray, pe: np.ndarray) -> np.ndarray:
        """Hops from position ``a`` to every (``ct``, ``pe``): XY in one CT, else via the source CT's port
        nearest ``a`` and the destination CT's port nearest the PE, as the executor routes them."""
        xy = lambda p, q: np.abs(p // self.cols - q // self.cols) + np.abs(p % self.cols - q % self.cols)  # noqa: E731
        actx, pe = int(a[0]), np.asarray(pe, dtype=np.int64)
        pkg = np.abs(self.ct_x[actx] - self.ct_x[ct]) + np.abs(self.ct_y[actx] - self.ct_y[ct])
        leave = min(xy(a[1], p) for p in self.ports)
        enter = np.min(np.stack([xy(np.int64(p), pe) for p in self.ports]), axis=0)
        return np.where(ct == actx, xy(a[1], pe), leave + pkg + enter)


def dominoes(cts: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(CT, first router, second router) of every domino: consecutive router pairs on each CT's snake."""
    snake = snake_routers(rows, cols)
    half = len(snake) // 2
    a, b = snake[0:2 * half:2], snake[1:2 * half:2]
    return np.repeat(np.asarray(cts, dtype=np.int64), half), np.tile(a, len(cts)), np.tile(b, len(cts))


def _leg_costs(mesh: Mesh, ends: Ends, ct: np.ndarray, pe: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """(byte-hops x ``scale``, largest on-CT hops) of one unit's transfers at every (``ct``, ``pe``)."""
    cost, worst = np.zeros(len(ct), dtype=np.int64), np.zeros(len(ct), dtype=np.int64)
    for pos, nbytes in ends:
        h = mesh.hops(pos, ct, pe)
        cost += np.int64(round(nbytes * scale)) * h
        worst = np.maximum(worst, np.where(ct == pos[0], h, 0))
    return cost, worst


def head_costs(mesh: Mesh, k_ends: list[Ends], v_ends: list[Ends], doms, chunks: int):
    """Per head, domino and orientation (0: K on the first router): byte-hops (integers, bytes x 8 x
    ``chunks``) and the largest on-CT hops, the score hop between the two routers included."""
    dct, da, db = doms
    heads = len(k_ends)
    cost = np.zeros((heads, 2, len(dct)), dtype=np.int64)
    worst = np.ones((heads, 2, len(dct)), dtype=np.int64)
    for g in range(heads):
        for o, (kpe, vpe) in enumerate(((da, db), (db, da))):
            kc, kw = _leg_costs(mesh, k_ends[g], dct, kpe, 8 * chunks)
            vc, vw = _leg_costs(mesh, v_ends[g], dct, vpe, 8 * chunks)
            cost[g, o], worst[g, o] = kc + vc, np.maximum(worst[g, o], np.maximum(kw, vw))
    return cost, worst


def _feasible(ok: np.ndarray, demand: int, slots: int) -> bool:
    from ortools.graph.python import max_flow  # heavy: imported when used, not to parse a command line

    heads, n = ok.shape
    g, p = np.nonzero(ok)
    mf = max_flow.SimpleMaxFlow()
    src, sink = heads + n, heads + n + 1
    mf.add_arcs_with_capacity(np.concatenate([np.full(heads, src), g, heads + np.arange(n)]),
                              np.concatenate([np.arange(heads), heads + p, np.full(n, sink)]),
                              np.concatenate([np.full(heads, demand), np.full(len(g), slots), np.full(n, slots)]))
    return mf.solve(src, sink) == mf.OPTIMAL and mf.optimal_flow() == heads * demand


def bottleneck(worst: np.ndarray, demand: int, slots: int) -> int:
    """The smallest hop bound under which every head can take ``demand`` pairs (each domino ``slots``)."""
    best = worst.min(axis=1)
    values = np.unique(best)
    lo, hi = 0, len(values) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _feasible(best <= values[mid], demand, slots):
            hi = mid
        else:
            lo = mid + 1
    return int(values[lo])


def place(cost: np.ndarray, worst: np.ndarray, demand: int, slots: int) -> tuple[int, list[np.ndarray], list[np.ndarray]]:
    """(hop bound, per head its dominoes in ascending order with repeats for several pairs, and the
    orientation of each): least byte-hops among the placements within the smallest bound."""
    from ortools.graph.python import min_cost_flow  # heavy: imported when used, not to parse a command line

    heads, _, n = cost.shape
    bound = bottleneck(worst, demand, slots)
    big = np.iinfo(np.int64).max
    masked = np.where(worst <= bound, cost, big)
    orient, best = masked.argmin(axis=1), masked.min(axis=1)
    g, p = np.nonzero(best < big)
    mcf = min_cost_flow.SimpleMinCostFlow()
    src, sink = heads + n, heads + n + 1
    arcs = mcf.add_arcs_with_capacity_and_unit_cost(
        np.concatenate([np.full(heads, src), g, heads + np.arange(n)]),
        np.concatenate([np.arange(heads), heads + p, np.full(n, sink)]),
        np.concatenate([np.full(heads, demand), np.full(len(g), slots), np.full(n, slots)]),
        np.concatenate([np.zeros(heads, np.int64), best[g, p], np.zeros(n, np.int64)]))
    mcf.set_nodes_supplies(np.array([src, sink]), np.array([heads * demand, -heads * demand]))
    if mcf.solve() != mcf.OPTIMAL:  # the bisection proved a flow exists within the bound
        raise AssertionError("kv-ring: no min-cost placement within the feasible hop bound")
    flow = np.asarray(mcf.flows(arcs))[heads:heads + len(g)]
    doms, orients = [], []
    for h in range(heads):
        mine = (g == h) & (flow > 0)
        d = np.repeat(p[mine], flow[mine])
        doms.append(d)
        orients.append(orient[h, d])
    return bound, doms, orients


def units(doms, per_head: list[np.ndarray], orients: list[np.ndarray], *, chunks: int,
          batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(CT, PE, slot) of every unit of one layer (``kvmap`` numbering) from each head's pairs: pair ``j`` of
    head ``g`` is sequence ``j // chunks``, chunk ``j % chunks``; pairs sharing a domino take its slots in
    head, then pair, order, K and V of a pair the same slot on their two routers."""
    dct, da, db = doms
    heads = len(per_head)
    g = np.repeat(np.arange(heads), [len(d) for d in per_head])
    j = np.concatenate([np.arange(len(d)) for d in per_head])
    d, o = np.concatenate(per_head), np.concatenate(orients)
    order = np.argsort(d, kind="stable")
    slot = np.empty(len(d), dtype=np.int64)
    first = np.searchsorted(d[order], d[order])
    slot[order] = np.arange(len(d)) - first
    u = ((j % chunks * batch + j // chunks) * heads + g) * 2
    n = 2 * len(d)
    ct, pe, sl = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    for kind, router in ((0, np.where(o == 0, da[d], db[d])), (1, np.where(o == 0, db[d], da[d]))):
        ct[u + kind], pe[u + kind], sl[u + kind] = dct[d], router, slot
    return ct, pe, sl


def near_map(program: Program, target: PrimalTarget, kv: KvMap, where: str) -> tuple[KvMap, dict]:
    """``kv`` with every layer's units placed near their roots, and the largest hop bound over layers.

    Each layer template is solved on its first layer and every other layer of it takes the same units
    shifted by its CT offset, as codegen shifts the template's records (on-CT hops are the same in each;
    byte-hops between CTs are the first layer's). An InputError naming ``where`` when a layer has too
    few dominoes."""
    model, layout = program.model, program.need_layout()
    geo, act_bytes = geometry(model, target), model.precision.activation_bits / 8
    x, y = layout.ct_xy(np.arange(layout.num_cts))
    mesh = Mesh(target.ct.mesh_rows, target.ct.mesh_cols, np.asarray(x, np.int64), np.asarray(y, np.int64),
                port_pes(target.ct.mesh_cols, target.d2d.ports_per_ct))
    ids, firsts = layer_templates(model)
    first_ct = [int(np.flatnonzero(layout.ct_layer == n)[0]) for n in range(model.num_layers)]
    solved = [_solve_layer(mesh, LayerRoutes(program, target, n, kv.context), model.layers[n],
                           np.flatnonzero(layout.ct_layer == n), kv, kv.chunks_of(n), geo, act_bytes, where)
              for n in firsts]
    ct, pe, slot = [], [], []
    for n in range(model.num_layers):
        t = int(ids[n])
        c, p, s, _ = solved[t]
        ct.append(c + first_ct[n] - first_ct[firsts[t]])
        pe.append(p)
        slot.append(s)
    cat = lambda parts: np.concatenate(parts).astype(np.uint16)  # noqa: E731
    placed = replace(kv, ct=cat(ct), pe=cat(pe), slot=cat(slot))
    return placed, {"placement": "near", "max_hops_bound": max((s[3] for s in solved), default=0)}


def _solve_layer(mesh: Mesh, routes: LayerRoutes, layer, cts: np.ndarray, kv: KvMap, chunks: int, geo,
                 act_bytes: float, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(CT, PE, slot) of one layer's units, its ring of ``chunks`` chunks, and its hop bound."""
    demand = kv.batch * chunks
    doms = dominoes(cts, mesh.rows, mesh.cols)
    if len(doms[0]) * kv.chunk_slots < kv.kv_heads * demand:
        raise InputError(where, f"placement near pairs K and V on neighbouring routers: a layer needs "
                                f"{kv.kv_heads * demand} pairs but its {len(cts)} CTs hold "
                                f"{len(doms[0]) * kv.chunk_slots}; use placement=spread or a smaller context")
    k_ends, v_ends = [], []
    for g in range(kv.kv_heads):
        k, v = unit_flows(layer, g, geo.rram_rows, geo.rram_cols, act_bytes, kv.kv_bytes, chunks)
        k_ends.append([(routes.hub_pos(r), b) for r, b in k])
        v_ends.append([(routes.hub_pos(r), b) for r, b in v])
    cost, worst = head_costs(mesh, k_ends, v_ends, doms, chunks)
    even = -(-kv.kv_heads * demand // len(doms[0]))  # the fewest pairs per domino that hold the cache
    bound, per_head, orients = place(cost, worst, demand, even)
    ct, pe, slot = units(doms, per_head, orients, chunks=chunks, batch=kv.batch)
    return ct, pe, slot, bound
