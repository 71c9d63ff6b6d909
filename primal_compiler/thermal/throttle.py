"""A thermal-aware policy: the most RRAM macros per CT that may convert at once so that, with the phase's
power sustained, no die passes a temperature limit (SEED.md section 6: throttle active PEs to limit heat
density), and what that costs in time.

Fewer macros converting at once stretch the same dynamic energy over a
longer window, so every CT's power, and so its steady temperature, falls
as the limit ``k`` falls; the search assumes that order and checks it on
the replays it makes: a bisection over ``k`` in ``1..PEs per CT`` for the
largest ``k`` that meets the limit, each candidate a full replay of the
stream with ``k`` lanes (``executor.costs.throttled``) and its thermal
report. Unthrottled is ``k`` = PEs per CT.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from primal_compiler.errors import InputError
from primal_compiler.executor.metrics import decode_steady, metrics
from primal_compiler.report.collect import planned_generation
from primal_compiler.executor.replay import Replay, replay
from primal_compiler.thermal.report import thermal_report

if TYPE_CHECKING:
    from primal_compiler.compiled import Compiled
    from primal_compiler.target.spec import PrimalTarget


def _point(rp: Replay, k: int, phase: str, generate: int | None) -> dict:
    """The figures of a throttled replay over the generation ``generate`` the program plans (as ``primal run``
    and the thermal report above the policy cover it)."""
    m = metrics(rp, generate=generate, required=False)
    t = thermal_report(rp, phase, steady=decode_steady(rp, 0, generate))
    return {"max_active_pes": k, "die_max_c": t["die_c"]["max"], "power_w": t["power_w"], "ttft_s": m["ttft_s"],
            "itl_s": m["itl_s"], "tokens_per_s": m["tokens_per_s"], "tokens_per_j": m["tokens_per_j"]}


def throttle_for_limit(c: Compiled, target: PrimalTarget, limit_c: float, phase: str = "decode",
                       say: Callable[[str], None] | None = None, free: Replay | None = None) -> dict:
    """The policy's result for ``limit_c`` (module docstring): ``free`` (unthrottled) and ``throttled`` (the
    largest ``k`` meeting the limit, or None when even one macro per CT does not), ``throughput_cost`` (the
    share of tokens/s given up, or of TTFT added for the prefill phase) and every replayed point. ``free``:
    the unthrottled replay on ``target``, when the caller has it (else it is replayed here)."""
    th = target.thermal
    if not th.model_min_c <= limit_c <= th.model_max_c:
        raise InputError("--limit-c", f"{limit_c:g} degC is outside the drift model's range {th.model_min_c:g}.."
                                      f"{th.model_max_c:g} degC")
    pes = int(c.meta["mesh_rows"]) * int(c.meta["mesh_cols"])
    points: dict[int, dict] = {}

    def at(k: int) -> dict:
        if k not in points:
            rp = free if k == pes and free is not None else replay(c.meta, c.arrays, c.stream, target, c.where,
                                                                    max_active_pes=k)
            points[k] = _point(rp, k, phase, planned_generation(c.meta))
            if say is not None:
                say(f"thermal policy: {k} macros per CT -> hottest die {points[k]['die_max_c']:.4f} degC")
        return points[k]

    unthrottled = at(pes)
    best: int | None = pes if unthrottled["die_max_c"] <= limit_c else None
    if best is None and at(1)["die_max_c"] <= limit_c:
        lo, hi = 1, pes  # lo meets the limit, hi does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if at(mid)["die_max_c"] <= limit_c else (lo, mid)
        best = lo
    ordered = sorted(points.values(), key=lambda p: p["max_active_pes"])
    monotone = all(a["die_max_c"] <= b["die_max_c"] + 1e-9 for a, b in zip(ordered, ordered[1:]))
    chosen = None if best is None else points[best]
    if chosen is None:
        cost = None
    elif phase == "decode":
        cost = 1.0 - chosen["tokens_per_s"] / unthrottled["tokens_per_s"]
    else:
        cost = chosen["ttft_s"] / unthrottled["ttft_s"] - 1.0
    return {"limit_c": limit_c, "phase": phase, "pes_per_ct": pes, "met": chosen is not None, "free": unthrottled,
            "throttled": chosen, "throughput_cost": cost, "monotone": monotone, "points": ordered}


def render_throttle(result: dict) -> str:
    """The text form of :func:`throttle_for_limit`."""
    free, chosen = result["free"], result["throttled"]
    head = f"thermal policy: hottest die at most {result['limit_c']:g} degC under sustained {result['phase']}"
    if chosen is None:
        return (f"{head}: not met; even 1 macro per CT converting at a time leaves it at "
                f"{result['points'][0]['die_max_c']:.4f} degC")
    what = "tokens/s given up" if result["phase"] == "decode" else "TTFT added"
    lines = [head + f": {chosen['max_active_pes']} of {result['pes_per_ct']} RRAM macros per CT at a time "
             f"({len(result['points'])} replays)"]
    for name, p in (("unthrottled", free), ("throttled", chosen)):
        lines.append(f"  {name:<12} hottest die {p['die_max_c']:.4f} degC, {p['power_w']:.4g} W, TTFT "
                     f"{p['ttft_s']:.4g} s, ITL {p['itl_s'] * 1e3:.4g} ms, {p['tokens_per_s']:,.1f} tokens/s, "
                     f"{p['tokens_per_j']:,.1f} tokens/J")
    lines.append(f"  cost         {100 * result['throughput_cost']:.1f}% {what}")
    if not result["monotone"]:
        lines.append("  warning      the replayed temperatures do not fall with the limit: the bisection may not "
                     "have found the largest one")
    return "\n".join(lines)
