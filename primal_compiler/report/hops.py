"""Hop tables: one program's statistics and the comparison of placement strategies."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from primal_compiler.errors import InputError

from primal_compiler.mapping.coupled import coupled_bound
from primal_compiler.mapping.exact import star_bound
from primal_compiler.mapping.hops import template_hops
from primal_compiler.mapping.layout import Layout
from primal_compiler.mapping.rules import layout_rules
import primal_compiler.transforms  # noqa: F401  (registers every pass)
from primal_compiler.mapping.curves import CURVES
from primal_compiler.report.text import table as text_table
from primal_compiler.terminal import steps
from primal_compiler.passmgr import REGISTRY, PassManager, parse_pipeline
from primal_compiler.transforms.ordering import OrderingPass

if TYPE_CHECKING:
    from primal_compiler.target.spec import PrimalTarget

def strategies() -> dict[str, str]:
    """The pipeline tail of every registered ordering pass, keyed by its curve in the order of
    :data:`~primal_compiler.mapping.curves.CURVES`: a new ordering pass is compared without being listed."""
    by_curve = {cls.curve: cls for cls in REGISTRY.values() if issubclass(cls, OrderingPass)}
    return {curve: by_curve[curve].name + ("" if by_curve[curve].compared_hubs == "median" else
                                           f"{{hubs={by_curve[curve].compared_hubs}}}")
            for curve in CURVES if curve in by_curve}


def render_hops(h: dict | None) -> str:
    if not h:
        return "hops: (not placed)"
    i = h["inter_ct"]
    return "\n".join([
        f"hops per decode step (XY, intra-CT): max {h['max_hops']}, mean {h['mean_hops']:.2f}, "
        f"traffic-weighted {h['weighted_hops']:.2f} over {h['transfers']:,} transfers, {h['bytes'] / 1e6:.2f} MB",
        f"die-to-die: max {i['max_hops']}, mean {i['mean_hops']:.2f}, traffic-weighted {i['weighted_hops']:.2f} "
        f"CT hops over {i['transfers']:,} transfers, {i['bytes'] / 1e6:.3f} MB "
        f"(+{i['controller_transfers']} controller transfers)",
    ])


def _row(h: dict, seconds: float) -> dict:
    return {"max_hops": h["max_hops"], "mean_hops": round(h["mean_hops"], 4),
            "weighted_hops": round(h["weighted_hops"], 4), "seconds": round(seconds, 3)}


def compare_strategies(model, target: PrimalTarget, context: int = 2048, seed: int = 0, generations: int = 30,
                       enforce: tuple[str, ...] | None = None, lns_rounds: int = 0) -> dict:
    """Hop statistics of every ordering, the GA and the exact lower bound, keyed by strategy.

    Every pipeline is parsed (so ``context``, ``seed``, ``generations``, ``lns_rounds`` and the GA's
    ``enforce``d rules, None for the pass's default, are checked by the passes that take them) before any
    work starts.
    """
    from primal_compiler.ir.program import Program

    head = parse_pipeline(f"lower-tiles,blocking{{context={context}}}")
    runs = {name: parse_pipeline(spec) for name, spec in strategies().items()}
    kept = "" if enforce is None else f",enforce={':'.join(enforce)}"
    runs["ga"] = parse_pipeline(f"zcurve-order,ga-placement{{seed={seed},generations={generations},"
                                f"lns_rounds={lns_rounds}{kept}}}")
    start = time.perf_counter()
    with steps(len(runs) + 2, "map") as step:  # a bar on a terminal: blocking, each strategy, the exact bound
        step("blocking")
        blocked = PassManager(head).run(Program(model), target)
        base_seconds = time.perf_counter() - start
        table = {}
        for name, passes in runs.items():
            step(name)
            t0 = time.perf_counter()
            prog = PassManager(passes).run(blocked, target)
            table[name] = _row(prog.records[-1].details["hops"], base_seconds + time.perf_counter() - t0)
            if name == "ga":
                table[name]["templates"] = [dict(row, rules=rules) for row, rules
                                            in zip(template_gaps(prog.need_layout()), layout_rules(prog))]
                table[name]["gap"] = _total_gap(table[name]["templates"])
                table[name].update(_kv_legs(prog, target, context, table[name]["max_hops"]))
        step("exact bound")
        t0 = time.perf_counter()
        table["exact-bound"] = _bound_row(blocked.layout, base_seconds + 0.0)
        table["exact-bound"]["seconds"] = round(base_seconds + time.perf_counter() - t0, 3)
    return table


def _kv_legs(prog, target: PrimalTarget, context: int, mapped_max: int) -> dict:
    """``kv_max_hops`` (kv-ring's bound on the attention legs at ``context``, batch 1) and
    ``max_hops_all_legs``; or, when the cache does not fit, ``kv_problem`` saying why and no all-legs figure."""
    try:
        kv = PassManager(parse_pipeline(f"kv-ring{{context={context}}}")).run(prog, target)
    except InputError as exc:
        return {"kv_problem": exc.problem}
    attention = kv.records[-1].details["kv_placement"]["max_hops_bound"]
    return {"kv_max_hops": attention, "max_hops_all_legs": max(mapped_max, attention)}


def template_gaps(layout: Layout) -> list[dict]:
    """Per CT template: uses, tiles, placed byte-hops, the lower bound (star, coupled on matrix blocks:
    ``mapping/coupled.py``) and the gap.

    ``gap`` is ``cost / bound - 1`` (0.1 = 10% above the bound): an upper limit on how far the
    placement is from the optimum, since no placement costs less than the bound. ``weighted_hops``
    and ``weighted_bound`` divide by the template's bytes.
    """
    uses = np.bincount(layout.ct_template, minlength=len(layout.templates))
    out = []
    for k, tp in enumerate(layout.templates):
        inst = tp.instance
        cost = float(template_hops(tp) @ inst.weight)
        bound = coupled_bound(inst)
        total = float(inst.weight.sum())
        out.append({"template": k, "uses": int(uses[k]), "tiles": inst.num_tiles, "byte_hops": round(cost, 1),
                    "bound": round(bound, 1), "gap": round(cost / bound - 1, 4) if bound else 0.0,
                    "weighted_hops": round(cost / total, 4) if total else 0.0,
                    "weighted_bound": round(bound / total, 4) if total else 0.0})
    return out


def _total_gap(rows: list[dict]) -> float:
    """Gap of the whole model: every template's byte-hops and bound counted once per CT that uses it."""
    cost = sum(r["uses"] * r["byte_hops"] for r in rows)
    bound = sum(r["uses"] * r["bound"] for r in rows)
    return round(cost / bound - 1, 4) if bound else 0.0


def _bound_row(layout, seconds: float) -> dict:
    uses = np.bincount(layout.ct_template, minlength=len(layout.templates))
    bh = hs = nbytes = flows = 0.0
    mx = 0
    for k, tp in enumerate(layout.templates):
        b = star_bound(tp.instance)
        bh += uses[k] * coupled_bound(tp.instance)
        hs += uses[k] * b.hops
        nbytes += uses[k] * tp.instance.weight.sum()
        flows += uses[k] * len(tp.instance.weight)
        mx = max(mx, b.max_hops)
    return {"max_hops": mx, "mean_hops": round(hs / flows, 4), "weighted_hops": round(bh / nbytes, 4),
            "seconds": round(seconds, 3)}


def render_comparison(table: dict) -> str:
    lines = text_table([(name, r["max_hops"], f"{r['mean_hops']:.3f}", f"{r['weighted_hops']:.3f}", f"{r['seconds']:.2f}")
                        for name, r in table.items()], ("strategy", "max hops", "mean hops", "weighted hops", "seconds"))
    lines.append("row-major = naive (hubs at the CT port); others: hubs at weighted medians; "
                 "exact-bound = lower bounds (star; coupled on matrix blocks): no placement reaches below")
    ga = table.get("ga", {})
    if "kv_problem" in ga:
        lines.append(f"ga with kv-ring: no KV placement at this context ({ga['kv_problem']}), so no all-legs figure")
    if "kv_max_hops" in ga:
        lines.append(f"ga with kv-ring (placement near, batch 1): attention and KV legs at most {ga['kv_max_hops']} "
                     f"on-CT hops; all legs at most {ga['max_hops_all_legs']}")
    if "templates" in ga:
        lines.append("")
        lines.append(f"ga per CT template (gap = byte-hops / lower bound - 1; whole model {ga['gap']:.1%}):")
        lines += text_table([(r["template"], r["uses"], r["tiles"], f"{r['byte_hops']:.0f}", f"{r['bound']:.0f}",
                              f"{r['gap']:.1%}", ", ".join(k for k, v in r.get("rules", {}).items() if not v["holds"]) or "-")
                             for r in ga["templates"]],
                            ("template", "uses", "tiles", "byte-hops", "bound", "gap", "seed layout rules broken"),
                            ("right",) * 6 + ("left",))
    return "\n".join(lines)
