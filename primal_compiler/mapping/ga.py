"""Genetic-algorithm placement of tile groups on slot groups, then assignment polishing.

A gene sequence is a permutation of slot groups (2x2 PE quads for
``group_size=4``, single PEs for 1, 1x2 pairs for 2); gene k holds tile group
k (consecutive tiles of a CT's sequence, so a group stays inside one
reduction column). Crossover is partially matched (PMX) and mutation shuffles
indices, so children stay permutations; pinned groups are repaired into
place after every variation. Fitness (byte-hops, then max hops,
lexicographically) is evaluated for a whole population at once in numpy and
split over a ``concurrent.futures`` executor. The best individual is then
refined by :func:`~primal_compiler.mapping.lap.lap_polish` at tile level. The GA is written plainly:
every random draw comes from a private ``random.Random(seed)``, so the result depends only on the
inputs and seed, also when the GA runs in a thread of a process whose other threads use ``random`` (a
Dask worker's event loop does). Its PMX crossover and index-shuffle mutation are DEAP's
(``cxPartialyMatched``, ``mutShuffleIndexes``), which draw from the global ``random`` module and take
no generator; the copies here draw from the private one and make the same draws (a test holds them to
DEAP's, which the tests alone depend on). The initial population holds the placements of the curves
``GaConfig.curves`` names, in that order, then random permutations: adding a curve to
:data:`~primal_compiler.mapping.curves.CURVES` changes no GA result.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from primal_compiler.mapping.bands import UNUSED, build_bands
from primal_compiler.mapping.curves import CURVES
from primal_compiler.mapping.coupled import coupled_bound
from primal_compiler.mapping.instance import Instance, evaluate
from primal_compiler.mapping.lap import lap_polish, lower_max_hops, swap_descent
from primal_compiler.mapping.lns import lns_search


LARGE_CT = 256  # above this many PEs an assignment costs ~0.2 s: only the final best is polished


SEED_CURVES = ("row-major", "snake", "spiral", "zigzag", "zcurve", "hilbert", "column-major")


@dataclass(frozen=True)
class GaConfig:
    """The GA's settings; the ``ga-placement`` pass takes its option defaults from these."""

    seed: int = 0
    population: int = 32
    generations: int = 30
    time_limit_s: float = 0.0  # 0 = no wall-time budget
    target_gap: float = 0.0  # stop once byte-hops <= (1 + target_gap) x the lower bound; 0 = never
    group_size: int = 4
    cx_prob: float = 0.7
    mut_prob: float = 0.9
    tournament: int = 2
    polish_rounds: int = 20
    max_hop_slack: float = 0.02  # byte-hops given up, at most, to lower max hops
    polish_every: int = 10  # generations between memetic polishes of the elite (0 = never)
    polish_top: int = 4  # distinct best individuals polished at the end
    lns_rounds: int = 0  # destroy-and-repair rounds over hub positions after the polish (mapping/lns.py)
    policy: str = "median"
    pins: tuple[tuple[int, int], ...] = ()  # (tile, slot)
    bands: tuple[int, ...] = ()  # column band of each tile (mapping.bands; 0 = free); () = no band constraint
    curves: tuple[str, ...] = SEED_CURVES  # the curves whose placements seed the population, in order
    progress: bool = False
    label: str = ""


@dataclass
class GaResult:
    slots: np.ndarray
    cost: float
    max_hops: float
    log: list[dict] = field(default_factory=list)
    generations: int = 0
    lns: dict = field(default_factory=dict)  # rounds, accepted, byte_hops_before, kept when the LNS ran


def slot_groups(rows: int, cols: int, g: int) -> np.ndarray:
    """PE indices of each slot group (Q, g), in row-major group order."""
    if g == 1:
        return np.arange(rows * cols, dtype=np.int64).reshape(rows * cols, 1)
    if g == 2 and cols % 2 == 0:
        return np.arange(rows * cols, dtype=np.int64).reshape(rows * cols // 2, 2)
    if g == 4 and rows % 2 == 0 and cols % 2 == 0:
        r2, c2 = np.meshgrid(np.arange(0, rows, 2), np.arange(0, cols, 2), indexing="ij")
        r, c = r2.ravel(), c2.ravel()
        return np.stack([r * cols + c, r * cols + c + 1, (r + 1) * cols + c, (r + 1) * cols + c + 1], axis=1)
    raise ValueError(f"group_size {g} does not tile a {rows}x{cols} mesh; use 1, 2 (even cols) or 4 (even rows and cols)")


class _Decoder:
    """Genes to placements. Without bands gene k is tile group k's slot group. With bands
    (:mod:`~primal_compiler.mapping.bands`) a gene sequence is a priority over slot groups: the
    unpinned tile groups of a band take its unpinned slot groups in gene order, so every decoded
    placement keeps every tile in its band."""

    def __init__(self, inst: Instance, g: int, pins: tuple[tuple[int, int], ...], bands: tuple[int, ...] = ()):
        self.inst, self.g = inst, g
        self.bands = build_bands(inst.rows, inst.cols, np.array(bands, np.int64), g) if bands else None
        if self.bands is None:
            self.groups = slot_groups(inst.rows, inst.cols, g)
            self.tile_group = np.arange(inst.num_tiles) // g
            self.tile_pos = np.arange(inst.num_tiles) % g
        else:
            self.groups, self.tile_group, self.tile_pos = self.bands.groups, self.bands.tile_group, self.bands.tile_pos
        self.n_groups = int(self.tile_group.max()) + 1 if inst.num_tiles else 0
        if self.n_groups > len(self.groups):
            raise ValueError("more tile groups than slot groups")
        self.pins = self._pin_genes(pins)
        if self.bands is not None:
            self._band_plan()

    @property
    def regions(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(band of each tile, band of each PE) for the polishers; None without bands."""
        return None if self.bands is None else (self.bands.tile_band, self.bands.pe_band)

    def _band_plan(self) -> None:
        """Reserved groups join the pins; sort keys of slot groups; each free tile group's index into the sorted genes."""
        b = self.bands
        assert b is not None
        for q in np.flatnonzero(b.reserved >= 0):
            gene = int(b.reserved[q])
            if self.pins.get(gene, q) != q or any(p == q and k != gene for k, p in self.pins.items()):
                raise ValueError(f"a pin moves the last, partial group of column band {b.group_band[q]}; "
                                 "use group_size=1")
            self.pins[gene] = int(q)
        if any(b.reserved[q] == UNUSED for q in self.pins.values()):
            raise ValueError(f"a pin uses the free PEs left over by group_size={self.g}; use group_size=1")
        key = b.group_band.copy()
        never = np.array(sorted(self.pins.values()) + np.flatnonzero(b.reserved == UNUSED).tolist(), dtype=np.int64)
        key[never] = key.max(initial=0) + 1  # pinned, reserved and unused slot groups sort last, never handed out
        self.sort_key = key
        free = np.bincount(key, minlength=key.max(initial=0) + 1)
        offset = np.concatenate([[0], np.cumsum(free)[:-1]])
        index = np.zeros(self.n_groups, dtype=np.int64)
        rank = np.zeros(len(free), dtype=np.int64)
        for k in range(self.n_groups):
            if k not in self.pins:
                band = b.tile_group_band[k]
                index[k] = offset[band] + rank[band]
                rank[band] += 1
        self.band_index = index

    def _pin_genes(self, pins) -> dict[int, int]:
        where = {int(pe): (q, k) for q, row in enumerate(self.groups) for k, pe in enumerate(row) if pe >= 0}
        genes: dict[int, int] = {}
        used: dict[int, int] = {}
        for tile, slot in pins:
            if not 0 <= slot < self.inst.num_slots:
                raise ValueError(f"pin of tile {tile} to PE {slot} is off the {self.inst.rows}x{self.inst.cols} mesh")
            if not 0 <= tile < self.inst.num_tiles:
                raise ValueError(f"pinned tile {tile} is not in this CT")
            q, k = where[slot]
            gene, pos = int(self.tile_group[tile]), int(self.tile_pos[tile])
            if self.bands is not None and self.bands.group_band[q] != self.bands.tile_group_band[gene]:
                raise ValueError(f"pin of tile {tile} to PE {slot} is outside the tile's column band "
                                 "(enforce=columns)")
            if pos != k:
                raise ValueError(f"pin of tile {tile} to PE {slot} conflicts with group_size={self.g}; use group_size=1")
            if used.get(q, gene) != gene or genes.get(gene, q) != q:
                raise ValueError(f"pin of tile {tile} to PE {slot}: PE is occupied by another pinned tile")
            genes[gene], used[q] = q, gene
        return genes

    def repair(self, perm: list[int]) -> None:
        if self.bands is not None:  # band decoding hands pinned groups out itself
            return
        for gene, q in self.pins.items():
            at = perm.index(q)
            perm[gene], perm[at] = perm[at], perm[gene]

    def slots(self, perms: np.ndarray) -> np.ndarray:
        """Tile PEs (P, T) of gene permutations (P, Q)."""
        if self.bands is None:
            q = perms[:, self.tile_group]
        else:
            order = np.argsort(self.sort_key[perms], axis=1, kind="stable")
            q = np.take_along_axis(perms, order, axis=1)[:, self.band_index]
            for gene, slot_group in self.pins.items():
                q[:, gene] = slot_group
            q = q[:, self.tile_group]
        return self.groups[q, self.tile_pos[None, :]]

    def from_slots(self, slots: np.ndarray) -> list[int]:
        """Gene permutation closest to a tile placement: each group to the slot group of its first tile."""
        pe_group = np.empty(self.inst.num_slots, dtype=np.int64)
        on = self.groups >= 0
        pe_group[self.groups[on]] = np.nonzero(on)[0]
        perm, taken = [], set()
        first = np.full(self.n_groups, self.inst.num_tiles, dtype=np.int64)
        np.minimum.at(first, self.tile_group, np.arange(self.inst.num_tiles))  # first tile of each group
        for k in range(self.n_groups):
            q = int(pe_group[slots[first[k]]])
            perm.append(q if q not in taken else -1)
            taken.add(q)
        rest = iter(q for q in range(len(self.groups)) if q not in taken)
        perm = [q if q >= 0 else next(rest) for q in perm]
        perm += list(rest)
        self.repair(perm)
        return perm


def _eval_chunk(args) -> tuple[np.ndarray, np.ndarray]:
    inst, slots, policy = args
    return evaluate(inst, slots, policy)


def _evaluate(dec: _Decoder, perms: np.ndarray, policy: str, executor: Executor | None, chunks: int):
    slots = dec.slots(perms)
    if executor is None or chunks <= 1 or len(slots) < 2 * chunks:
        return evaluate(dec.inst, slots, policy)
    parts = np.array_split(slots, chunks)
    results = list(executor.map(_eval_chunk, [(dec.inst, p, policy) for p in parts]))
    return np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results])


def _pmx(rng: random.Random, ind1: list[int], ind2: list[int]) -> None:
    """Partially matched crossover in place: ``deap.tools.cxPartialyMatched`` drawing from ``rng``."""
    size = min(len(ind1), len(ind2))
    p1, p2 = [0] * size, [0] * size
    for i in range(size):
        p1[ind1[i]] = i
        p2[ind2[i]] = i
    cxpoint1 = rng.randint(0, size)
    cxpoint2 = rng.randint(0, size - 1)
    if cxpoint2 >= cxpoint1:
        cxpoint2 += 1
    else:
        cxpoint1, cxpoint2 = cxpoint2, cxpoint1
    for i in range(cxpoint1, cxpoint2):
        temp1, temp2 = ind1[i], ind2[i]
        ind1[i], ind1[p1[temp2]] = temp2, temp1
        ind2[i], ind2[p2[temp1]] = temp1, temp2
        p1[temp1], p1[temp2] = p1[temp2], p1[temp1]
        p2[temp1], p2[temp2] = p2[temp2], p2[temp1]


def _shuffle_mutation(rng: random.Random, individual: list[int], indpb: float) -> None:
    """Index-shuffle mutation in place: ``deap.tools.mutShuffleIndexes`` drawing from ``rng``."""
    size = len(individual)
    for i in range(size):
        if rng.random() < indpb:
            swap_indx = rng.randint(0, size - 2)
            if swap_indx >= i:
                swap_indx += 1
            individual[i], individual[swap_indx] = individual[swap_indx], individual[i]


def _seeds(dec: _Decoder, inst: Instance, cfg: GaConfig) -> list[list[int]]:
    """One gene sequence per curve: its first tiles' placement, or with bands its order as priority."""
    seeds = []
    for name in cfg.curves:
        order = CURVES[name](inst.rows, inst.cols)
        if dec.bands is None:
            seeds.append(dec.from_slots(order[: inst.num_tiles]))
        else:
            rank = np.empty(inst.num_slots, dtype=np.int64)
            rank[order] = np.arange(inst.num_slots)
            first = np.where(dec.groups >= 0, rank[dec.groups], inst.num_slots).min(axis=1)
            seeds.append([int(q) for q in np.argsort(first, kind="stable")])
    return seeds


def run_ga(inst: Instance, cfg: GaConfig, executor: Executor | None = None, chunks: int = 1) -> GaResult:
    """Best placement found within the generation and wall-time budgets.

    With ``target_gap`` > 0 the generations stop as soon as the best individual's byte-hops are
    within that fraction of the lower bound (``coupled.coupled_bound``: a proven gap, so the stop does not depend on
    timing and the result stays a function of the inputs and seed); polishing runs either way.
    Then ``lns_rounds`` rounds of :func:`~primal_compiler.mapping.lns.lns_search` (hub policy ``median``
    only), which stop at the same gap and within ``time_limit_s`` of the start, then the max-hop trade.
    """
    dec = _Decoder(inst, cfg.group_size, cfg.pins, cfg.bands)
    Q = len(dec.groups)
    start = time.perf_counter()
    rng = random.Random(cfg.seed)
    pop = _seeds(dec, inst, cfg)
    while len(pop) < cfg.population:
        perm = rng.sample(range(Q), Q)
        dec.repair(perm)
        pop.append(perm)
    pop = pop[: cfg.population]
    fit = np.stack(_evaluate(dec, np.array(pop), cfg.policy, executor, chunks), axis=1)
    log: list[dict] = []
    gen = 0
    goal = (1 + cfg.target_gap) * coupled_bound(inst) if cfg.target_gap > 0 else -1.0
    for gen in range(1, cfg.generations + 1):
        if (cfg.time_limit_s and time.perf_counter() - start > cfg.time_limit_s) or fit[:, 0].min() <= goal:
            gen -= 1
            break
        pop, fit = _generation(dec, pop, fit, cfg, executor, chunks, Q, rng)
        if cfg.polish_every and gen % cfg.polish_every == 0:
            _polish_elite(dec, pop, fit, cfg)
        best = int(np.lexsort((fit[:, 1], fit[:, 0]))[0])
        log.append({"generation": gen, "best_byte_hops": float(fit[best, 0]),
                    "best_max_hops": float(fit[best, 1]), "mean_byte_hops": float(fit[:, 0].mean())})
        if cfg.progress:
            sys.stderr.write(f"\r  ga {cfg.label} gen {gen}/{cfg.generations} best {fit[best, 0]:.4g} byte-hops")
            sys.stderr.flush()
    if cfg.progress:
        sys.stderr.write("\n")
    pins = {int(t): int(s) for t, s in cfg.pins}
    slots = _polish_best(dec, pop, fit, cfg, pins)
    lns: dict = {}
    found = [slots]
    if cfg.lns_rounds and cfg.policy == "median":
        before = float(evaluate(inst, slots[None, :], cfg.policy)[0][0])
        deadline = start + cfg.time_limit_s if cfg.time_limit_s else 0.0
        searched, ran, accepted = lns_search(inst, slots, pins, cfg.lns_rounds, cfg.seed, dec.regions, deadline,
                                             goal, _lns_progress(cfg) if cfg.progress else None)
        if cfg.progress:
            sys.stderr.write("\n")
        found += [searched] if accepted else []
        lns = {"rounds": ran, "accepted": accepted, "byte_hops_before": before}
    # the max-hop trade of the LNS's placement may give back more than the search won: the searched
    # placement is kept only when, traded, it has fewer byte-hops and no more max hops
    traded = [lower_max_hops(inst, s, cfg.policy, pins, cfg.max_hop_slack, dec.regions) for s in found]
    scores = [tuple(float(v[0]) for v in evaluate(inst, s[None, :], cfg.policy)) for s in traded]
    k = 1 if len(traded) > 1 and scores[1][0] < scores[0][0] and scores[1][1] <= scores[0][1] else 0
    if lns:
        lns["kept"] = k == 1
    return GaResult(traded[k], scores[k][0], scores[k][1], log, gen, lns)


def _lns_progress(cfg: GaConfig) -> Callable[[int, float], None]:
    def say(r: int, byte_hops: float) -> None:
        sys.stderr.write(f"\r  lns {cfg.label} round {r}/{cfg.lns_rounds} best {byte_hops:.4g} byte-hops")
        sys.stderr.flush()
    return say


def _polish_elite(dec: _Decoder, pop: list, fit: np.ndarray, cfg: GaConfig) -> None:
    """Memetic step: replace the elite by its assignment-polished placement, as genes."""
    if dec.inst.num_slots > LARGE_CT:
        return
    best = int(np.lexsort((fit[:, 1], fit[:, 0]))[0])
    slots = dec.slots(np.array(pop[best])[None, :])[0]
    pins = {int(t): int(s) for t, s in cfg.pins}
    polished = lap_polish(dec.inst, slots, cfg.policy, pins, cfg.polish_rounds, dec.regions)
    perm = dec.from_slots(polished)
    c, m = evaluate(dec.inst, dec.slots(np.array([perm])), cfg.policy)
    if (c[0], m[0]) < (fit[best, 0], fit[best, 1]):
        pop[best], fit[best] = perm, (c[0], m[0])


def _polish_best(dec: _Decoder, pop: list, fit: np.ndarray, cfg: GaConfig, pins: dict[int, int]) -> np.ndarray:
    """Polish the ``polish_top`` best distinct individuals; return the best result."""
    order = np.lexsort((fit[:, 1], fit[:, 0]))
    seen: set[bytes] = set()
    best, best_key = dec.slots(np.array(pop[order[0]])[None, :])[0].astype(np.int32), None
    for i in order:
        slots = dec.slots(np.array(pop[i])[None, :])[0].astype(np.int32)
        key = slots.tobytes()
        if key in seen:
            continue
        seen.add(key)
        slots = lap_polish(dec.inst, slots, cfg.policy, pins, cfg.polish_rounds, dec.regions)
        slots = swap_descent(dec.inst, slots, cfg.policy, pins, regions=dec.regions)
        c, m = evaluate(dec.inst, slots[None, :], cfg.policy)
        if best_key is None or (c[0], m[0]) < best_key:
            best, best_key = slots, (c[0], m[0])
        if len(seen) >= (cfg.polish_top if dec.inst.num_slots <= LARGE_CT else 1):
            break
    return best


def _generation(dec, pop, fit, cfg, executor, chunks, Q, rng):
    """One generation: tournament selection, PMX, shuffle mutation, elitism."""
    n = len(pop)
    idx = np.arange(n)
    chosen = []
    for _ in range(n):
        cand = rng.sample(list(idx), min(cfg.tournament, n))
        chosen.append(min(cand, key=lambda i: (fit[i, 0], fit[i, 1])))
    children = [list(pop[i]) for i in chosen]
    for i in range(0, n - 1, 2):
        if rng.random() < cfg.cx_prob:
            _pmx(rng, children[i], children[i + 1])
    for child in children:
        if rng.random() < cfg.mut_prob:
            _shuffle_mutation(rng, child, 2.0 / Q)
        dec.repair(child)
    cfit = np.stack(_evaluate(dec, np.array(children), cfg.policy, executor, chunks), axis=1)
    elite = int(np.lexsort((fit[:, 1], fit[:, 0]))[0])
    worst = int(np.lexsort((cfit[:, 1], cfit[:, 0]))[-1])
    children[worst], cfit[worst] = list(pop[elite]), fit[elite]
    return children, cfit
