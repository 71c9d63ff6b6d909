"""Hop tables: one program's statistics and the comparison of placement strategies."""

from __future__ import annotations

import time

import numpy as np

from primal_compiler.mapping.exact import star_bound
import primal_compiler.transforms  # noqa: F401  (registers every pass)
from primal_compiler.passmgr import PassManager, parse_pipeline

STRATEGIES = {
    "row-major": "row-major-order{hubs=port}",
    "snake": "snake-order",
    "spiral": "spiral-order",
    "zigzag": "zigzag-order",
    "zcurve": "zcurve-order",
    "hilbert": "hilbert-order",
}


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


def compare_strategies(model, target, context: int = 2048, seed: int = 0, generations: int = 30) -> dict:
    """Hop statistics of every ordering, the GA and the exact lower bound, keyed by strategy.

    Every pipeline is parsed (so ``context``, ``seed`` and ``generations`` are range-checked by the
    passes that take them) before any work starts.
    """
    from primal_compiler.ir.program import Program

    head = parse_pipeline(f"lower-tiles,blocking{{context={context}}}")
    runs = {name: parse_pipeline(spec) for name, spec in STRATEGIES.items()}
    runs["ga"] = parse_pipeline(f"zcurve-order,ga-placement{{seed={seed},generations={generations}}}")
    start = time.perf_counter()
    blocked = PassManager(head).run(Program(model), target)
    base_seconds = time.perf_counter() - start
    table = {}
    for name, passes in runs.items():
        t0 = time.perf_counter()
        prog = PassManager(passes).run(blocked, target)
        table[name] = _row(prog.records[-1].details["hops"], base_seconds + time.perf_counter() - t0)
    t0 = time.perf_counter()
    table["exact-bound"] = _bound_row(blocked.layout, base_seconds + 0.0)
    table["exact-bound"]["seconds"] = round(base_seconds + time.perf_counter() - t0, 3)
    return table


def _bound_row(layout, seconds: float) -> dict:
    uses = np.bincount(layout.ct_template, minlength=len(layout.templates))
    bh = hs = nbytes = flows = 0.0
    mx = 0
    for k, tp in enumerate(layout.templates):
        b = star_bound(tp.instance)
        bh += uses[k] * b.byte_hops
        hs += uses[k] * b.hops
        nbytes += uses[k] * tp.instance.weight.sum()
        flows += uses[k] * len(tp.instance.weight)
        mx = max(mx, b.max_hops)
    return {"max_hops": mx, "mean_hops": round(hs / flows, 4), "weighted_hops": round(bh / nbytes, 4),
            "seconds": round(seconds, 3)}


def render_comparison(table: dict) -> str:
    lines = [f"{'strategy':<12} {'max hops':>9} {'mean hops':>10} {'weighted hops':>14} {'seconds':>8}"]
    for name, r in table.items():
        lines.append(f"{name:<12} {r['max_hops']:>9} {r['mean_hops']:>10.3f} {r['weighted_hops']:>14.3f} {r['seconds']:>8.2f}")
    lines.append("row-major = naive (hubs at the CT port); others: hubs at weighted medians; "
                 "exact-bound = star lower bounds (no placement reaches below)")
    return "\n".join(lines)
