"""Pass ``ga-placement``: genetic-algorithm search of each distinct CT's placement."""

from __future__ import annotations

import os
import sys
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.ir.tiles import ROLE_CODES, Macro, Part
from primal_compiler.mapping.bands import tile_bands
from primal_compiler.mapping.blocking import apply_placement
from primal_compiler.mapping.curves import CURVES
from primal_compiler.mapping.ga import GaConfig, run_ga
from primal_compiler.mapping.hops import layout_hops
from primal_compiler.mapping.instance import Instance, hub_slots
from primal_compiler.mapping.rules import qk_flows
from primal_compiler.ir.facts import Fact, facts
from primal_compiler.passmgr import SEED_RANGE, Pass, internal, option
from primal_compiler.procs import worker_pool

if TYPE_CHECKING:
    from primal_compiler.ir.program import Program
    from primal_compiler.target.spec import PrimalTarget

EXECUTORS = ("process", "thread", "serial")
ENFORCEABLE = ("columns", "qk_horizontal")


@dataclass(frozen=True)
class GaPlacement(Pass):
    """Minimise byte-hops (then max hops) of every distinct CT with a genetic algorithm, then polish.

    Templates whose placement problems are identical (same mesh, flows, bytes
    and pins: the LM head's full CTs, for one) are solved once, with seed
    ``seed + index`` of the first of them, and share the result; so results
    are reproducible and do not depend on the executor. On a terminal a line
    on stderr counts the templates placed. The executor evaluates the CT templates'
    populations in parallel, one template per task (each population is
    scored in one vectorized numpy call); :func:`run_ga` can also split a
    single population over an executor. ``pins`` fix tiles as
    ``ROLE.BROW.BCOL@ROW.COL`` (slice 0, in every layer that has the tile).
    ``enforce`` names the seed layout rules the placement keeps, both by
    default (the seed's mapping; ``enforce=`` searches without them).
    ``columns`` keeps the seed's column bands (:mod:`~primal_compiler.mapping.bands`):
    Q, K, V and O each stay in their band of whole columns, and the GA and
    its polish search only placements that keep them; a pin outside its
    tile's band is an error. ``qk_horizontal`` ties each Q root's
    mesh row to its K root's (:attr:`Instance.row_ties`), so every q vector
    reaches its K root on horizontal links only.
    ``executor`` picks the fitness evaluator (``process`` pool by default);
    library callers may pass any ``concurrent.futures.Executor`` as
    ``executor_override``.
    """

    name = "ga-placement"
    summary = "genetic-algorithm placement of tile groups with assignment polishing"
    requires = facts(Fact.BLOCKED)
    provides = facts(Fact.PLACED, Fact.SEARCHED)

    seed: int = option(GaConfig.seed, *SEED_RANGE)
    # 4 individuals make a tournament; 1024 is 16x the thorough pipeline's 64 (fitness is scored
    # population x flows at once).
    population: int = option(GaConfig.population, 4, 1024)
    # 10^4 generations take ~4 h on Llama-2-13B's templates (1.5 s each on 2 cores), 40 s on tiny-llama;
    # longer searches are what time_limit_s is for. A GA of no generation is no search.
    generations: int = option(GaConfig.generations, 1, 10_000)
    # budget per template (generations and LNS), 0 = none; a day at most
    time_limit_s: float = option(GaConfig.time_limit_s, 0.0, 86_400.0)
    # stop a template's generations once its byte-hops are within this fraction of the lower bound
    # (mapping/coupled.py); 0 = never
    # (10 = 11x the bound, far above any gap seen on Llama-2).
    target_gap: float = option(GaConfig.target_gap, 0.0, 10.0)
    group_size: int = option(GaConfig.group_size, choices=(1, 2, 4))
    polish_rounds: int = option(GaConfig.polish_rounds, 0, 1000)  # assignment rounds per polish (~0.2 s on 32x32)
    # destroy-and-repair rounds over hub positions after the polish (mapping/lns.py; 0.01-0.07 s a round
    # per 32x32 template), 0 = none; 10^5 rounds take about two hours on Llama-2-13B's templates
    lns_rounds: int = option(GaConfig.lns_rounds, 0, 100_000)
    max_hop_slack: float = option(GaConfig.max_hop_slack, 0.0, 1.0)  # byte-hops given up, at most, to lower max hops
    seed_curves: tuple[str, ...] = option(GaConfig.curves)  # curves whose placements seed the population
    executor: str = option("process", choices=EXECUTORS)
    workers: int = option(0, 0, 1024)  # 0 = CPU count; 1024 is above any one host's cores
    pins: tuple[str, ...] = option(())
    enforce: tuple[str, ...] = option(ENFORCEABLE)  # seed layout rules the placement must keep
    progress: bool = option(True)
    executor_override: Executor | None = internal()  # run-time wiring, never parsed or printed

    def check(self) -> None:
        for pin in self.pins:
            _parse_pin(pin)
        rules = [r for r in self.enforce if r not in ENFORCEABLE]
        if rules:
            raise ValueError(f"enforce: unknown rule {rules[0]!r}; enforceable: {', '.join(ENFORCEABLE)}")
        unknown = [c for c in self.seed_curves if c not in CURVES]
        if unknown:
            raise ValueError(f"seed_curves: unknown curve {unknown[0]!r}; curves: {', '.join(CURVES)}")

    def run(self, program: Program, target: PrimalTarget) -> Program:
        layout = program.need_layout()
        workers = self.workers or os.cpu_count() or 1
        own = None
        executor = self.executor_override
        if executor is None and self.executor != "serial" and workers > 1:
            own = executor = (worker_pool if self.executor == "process" else ThreadPoolExecutor)(workers)
        logs = {}
        configs = [
            GaConfig(
                seed=self.seed + k, population=self.population, generations=self.generations,
                time_limit_s=self.time_limit_s, target_gap=self.target_gap, group_size=self.group_size,
                polish_rounds=self.polish_rounds, max_hop_slack=self.max_hop_slack, lns_rounds=self.lns_rounds,
                pins=_template_pins(program, tp, self.pins), curves=self.seed_curves,
                bands=_template_bands(program, tp) if "columns" in self.enforce else (),
                progress=self.progress and sys.stderr.isatty() and executor is None,
                label=f"CT template {k + 1}/{len(layout.templates)}",
            )
            for k, tp in enumerate(layout.templates)
        ]
        instances = [_tied(tp.instance) if "qk_horizontal" in self.enforce else tp.instance for tp in layout.templates]
        first = _first_identical(instances, configs)
        unique = sorted(set(first))
        jobs = [(instances[k], configs[k]) for k in unique]
        try:
            solved = _run_jobs(jobs, executor, self.progress and sys.stderr.isatty())
        finally:
            if own is not None:
                own.shutdown()
        by_first = dict(zip(unique, solved))
        results = [by_first[f] for f in first]
        for k, (inst, res) in enumerate(zip(instances, results)):
            if isinstance(res, str):
                raise InputError(f"pass {self.name}", res)
            layout = layout.replace_template(k, slots=res.slots, hubs=hub_slots(inst, res.slots))
            logs[f"template{k}"] = {"generations": res.generations, "byte_hops": res.cost,
                                    "max_hops": res.max_hops, "convergence": res.log, **({"lns": res.lns} if res.lns else {})}
        tiles = apply_placement(program.need_tiles(), layout)
        return program.evolve(tiles=tiles, layout=layout, pending_details={"hops": layout_hops(layout), "ga": logs})


def _first_identical(instances: list[Instance], configs: list[GaConfig]) -> list[int]:
    """For each template, the index of the first template with the same placement problem and pins."""
    seen: dict[tuple, int] = {}
    out = []
    for k, (i, cfg) in enumerate(zip(instances, configs)):
        key = (i.rows, i.cols, i.num_tiles, i.num_hubs, i.src.tobytes(), i.dst.tobytes(),
               i.weight.tobytes(), i.flow_class.tobytes(), i.row_ties, cfg.pins, cfg.bands)
        out.append(seen.setdefault(key, k))
    return out


def _run_jobs(jobs: list, executor: Executor | None, progress: bool) -> list:
    """Solve every job, in order; on a terminal, a line on stderr counts the templates done."""
    results = []
    it = executor.map(_solve, jobs) if executor is not None else map(_solve, jobs)
    for res in it:
        results.append(res)
        if progress and executor is not None:
            sys.stderr.write(f"\r  ga-placement: {len(results)}/{len(jobs)} distinct CT templates placed")
            sys.stderr.flush()
    if progress and executor is not None:
        sys.stderr.write("\n")
    return results


def _solve(job):
    """One CT template's GA run (top level so process pools can pickle it); errors come back as text."""
    inst, cfg = job
    try:
        return run_ga(inst, cfg)
    except ValueError as exc:
        return str(exc)


def _parse_pin(pin: str) -> tuple[str, int, int, int, int]:
    try:
        tile, pe = pin.split("@")
        role, brow, bcol = tile.split(".")
        row, col = pe.split(".")
        if role not in {r.value for r in ROLE_CODES}:
            raise ValueError
        return role, int(brow), int(bcol), int(row), int(col)
    except ValueError:
        raise InputError("pass ga-placement", f"pin {pin!r} is not ROLE.BROW.BCOL@ROW.COL (e.g. q.0.3@5.7)") from None


def _template_pins(program: Program, tp, pins: tuple[str, ...]) -> tuple[tuple[int, int], ...]:
    """(tile index, PE) pins that fall in this template's CT."""
    if not pins:
        return ()
    t = program.need_tiles()
    start = int(np.searchsorted(t.layer, tp.layer))
    rows = start + tp.rel_rows
    out = []
    for pin in pins:
        role, brow, bcol, r, c = _parse_pin(pin)
        if not (0 <= r < tp.instance.rows and 0 <= c < tp.instance.cols):
            raise InputError("pass ga-placement", f"pin {pin!r} is off the {tp.instance.rows}x{tp.instance.cols} mesh")
        code = [x.value for x in ROLE_CODES].index(role)
        hit = np.flatnonzero((t.role[rows] == code) & (t.part[rows] == Part.BASE) & (t.brow[rows] == brow)
                             & (t.bcol[rows] == bcol) & (t.slice[rows] == 0))
        if len(hit):
            out.append((int(hit[0]), r * tp.instance.cols + c))
    return tuple(out)


def _template_bands(program: Program, tp) -> tuple[int, ...]:
    """Column band of each of the template's tiles (:func:`~primal_compiler.mapping.bands.tile_bands`)."""
    t = program.need_tiles()
    rows = int(np.searchsorted(t.layer, tp.layer)) + tp.rel_rows
    bands = tile_bands(np.where(t.macro[rows] == Macro.RRAM, t.role[rows], -1))
    return tuple(int(b) for b in bands) if bands.any() else ()  # no attention matrix: nothing to keep


def _tied(inst: Instance) -> Instance:
    """``inst`` with each Q root row-tied to the K roots it sends q to (qk_horizontal)."""
    qk = qk_flows(inst)
    T = inst.num_tiles
    ties = sorted({(int(a) - T, int(b) - T) for a, b in zip(inst.src[qk], inst.dst[qk])})
    return replace(inst, row_ties=tuple(ties)) if ties else inst
