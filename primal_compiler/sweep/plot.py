"""Pictures of a sweep's results: the Pareto front of two metrics and each axis's sensitivity.

:func:`pareto_front` is pure (rows in, front out) and is what the plot and the
printed table use. A metric is maximised if it is a rate per unit
(``tokens_per_s``, ``tokens_per_j``, ``h100.tokens_per_*``) and minimised
otherwise (latency, power, energy, hops); ``METRIC:max`` / ``METRIC:min``
overrides. Failed points (an ``error``, or the metric missing) are left out
and counted in the title.

:func:`plot_results` writes ``pareto.png`` and ``sensitivity.png`` into the
results directory with matplotlib's Agg backend (no display needed): the
front over every point, and, for every axis with more than one value, the
median and min..max of both metrics over the other axes at each value of
that axis.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from primal_compiler.errors import InputError
from primal_compiler.sweep.metrics import readable


def direction(metric: str) -> tuple[str, bool]:
    """(name, maximise) of ``METRIC[:max|:min]``."""
    name, _, how = metric.partition(":")
    if how and how not in ("max", "min"):
        raise InputError(metric, "expected METRIC, METRIC:max or METRIC:min")
    if how:
        return name, how == "max"
    leaf = name.rsplit(".", 1)[-1]
    return name, leaf.startswith("tokens_per") or leaf.endswith("_per_s") or leaf == "kv_storage_utilisation"


def _ok(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def pareto_front(rows: list[dict[str, Any]], x: str, y: str) -> list[dict[str, Any]]:
    """The non-dominated rows on (x, y), sorted by x; rows without both metrics are ignored."""
    (xn, xmax), (yn, ymax) = direction(x), direction(y)
    pts = [r for r in rows if _ok(r.get(xn)) and _ok(r.get(yn))]
    sx, sy = (1 if xmax else -1), (1 if ymax else -1)
    pts.sort(key=lambda r: (-sx * r[xn], -sy * r[yn]))  # best x first, ties best y first
    front, best_y = [], -math.inf
    for r in pts:
        if sy * r[yn] > best_y:
            front.append(r)
            best_y = sy * r[yn]
    return sorted(front, key=lambda r: r[xn])


def _check_columns(rows: list[dict[str, Any]], names: list[str]) -> None:
    have = set(rows[0]) if rows else set()
    for n in names:
        if n not in have:
            metrics = sorted(k for k in have if "." in k or k.endswith(("_s", "_j", "_w", "hops")))
            raise InputError(n, f"not a column of the results; metric columns: {', '.join(metrics)}")


def plot_results(rows: list[dict[str, Any]], axes: list[str], out_dir: str | Path, x: str = "tokens_per_s",
                 y: str = "tokens_per_j", orders: dict[str, list[Any]] | None = None) -> list[Path]:
    """Write ``pareto.png`` and ``sensitivity.png`` into the directory ``out_dir``; their paths.

    ``orders`` gives a non-numeric axis's values in the order to draw them (the spec's); numbers are sorted.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (xn, xmax), (yn, ymax) = direction(x), direction(y)
    _check_columns(rows, [xn, yn])
    out_dir = Path(out_dir)
    good = [r for r in rows if _ok(r.get(xn)) and _ok(r.get(yn))]
    failed = len(rows) - len(good)
    front = pareto_front(rows, x, y)
    paths = []

    varied = [a for a in axes if len({repr(r.get(a)) for r in rows}) > 1]
    fig, ax = plt.subplots(figsize=(8, 5.5), layout="constrained")
    grids = sorted({r.get("grid") for r in good}, key=str)
    for k, g in enumerate(grids):
        pts = [r for r in good if r.get("grid") == g]
        ax.scatter([r[xn] for r in pts], [r[yn] for r in pts], s=18, alpha=0.6, color=f"C{k % 10}",
                   label=f"{g} ({len(pts)})" if len(grids) > 1 else f"{len(pts)} points")
    ax.plot([r[xn] for r in front], [r[yn] for r in front], "--", color="k", lw=1, label=f"Pareto front ({len(front)})")
    ax.scatter([r[xn] for r in front], [r[yn] for r in front], s=40, facecolors="none", edgecolors="k")
    if len(front) <= 12:
        mid = (min(r[xn] for r in good) + max(r[xn] for r in good)) / 2
        for r in front:  # the label on the side with room: left of a point in the right half
            right = r[xn] > mid
            ax.annotate(_label(r, varied), (r[xn], r[yn]), fontsize=6, xytext=(-6 if right else 6, -8),
                        textcoords="offset points", ha="right" if right else "left", annotation_clip=True)
    ax.set_xlabel(f"{readable(xn)}, {'higher' if xmax else 'lower'} is better")
    ax.set_ylabel(f"{readable(yn)}, {'higher' if ymax else 'lower'} is better")
    _log_if_wide(ax, [r[xn] for r in good], [r[yn] for r in good])
    ax.set_title(f"Pareto front: {readable(yn)} against {readable(xn)}"
                 + (f" ({failed} failed points left out)" if failed else ""))
    ax.legend(fontsize=8)
    paths.append(out_dir / "pareto.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    n = max(1, len(varied))
    fig, grid = plt.subplots(2, n, figsize=(3.2 * n + 1, 6), squeeze=False, layout="constrained")
    for j, a in enumerate(varied):
        for i, m in enumerate((xn, yn)):
            ax = grid[i][j]
            present = {repr(r.get(a)): r.get(a) for r in good}
            numeric = all(isinstance(v, (int, float)) for v in present.values())
            known = [] if numeric else [v for v in (orders or {}).get(a, []) if repr(v) in present]
            values = known + sorted((v for k, v in present.items() if v not in known),
                                    key=lambda v: (isinstance(v, str), str(v) if isinstance(v, str) else v or 0))
            pos = list(range(len(values)))
            meds, lows, highs = [], [], []
            for v in values:
                ys = sorted(r[m] for r in good if r.get(a) == v)
                meds.append(ys[len(ys) // 2] if len(ys) % 2 else (ys[len(ys) // 2 - 1] + ys[len(ys) // 2]) / 2)
                lows.append(ys[0])
                highs.append(ys[-1])
            ax.fill_between(pos, lows, highs, alpha=0.2)
            ax.plot(pos, meds, "o-")
            ax.set_xticks(pos, [str(v) for v in values], rotation=30, fontsize=7)
            if any(h > 0 for h in highs) and min(lows, default=1) > 0 and max(highs) / min(lows) > 100:
                ax.set_yscale("log")
            if i == 1:
                ax.set_xlabel(readable(a))
            if j == 0:
                ax.set_ylabel(readable(m))
    if not varied:
        grid[0][0].text(0.5, 0.5, "no axis has more than one value", ha="center")
    fig.suptitle("Sensitivity: each axis's median (dots) and min..max (band) over the other axes")
    paths.append(out_dir / "sensitivity.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def _label(r: dict[str, Any], varied: list[str]) -> str:
    """The values of the varied axes (short; pipelines and targets by their own text)."""
    return ", ".join(f"{a.rsplit('.', 1)[-1]}={r[a]}" for a in varied if a in r)[:48]


def _log_if_wide(ax, xs: list[float], ys: list[float]) -> None:
    for vals, setter in ((xs, ax.set_xscale), (ys, ax.set_yscale)):
        if vals and min(vals) > 0 and max(vals) / min(vals) > 100:
            setter("log")


def front_table(rows: list[dict[str, Any]], axes: list[str], x: str, y: str) -> str:
    """The Pareto front as text, one line per point."""
    (xn, _), (yn, _) = direction(x), direction(y)
    front = pareto_front(rows, x, y)
    varied = [a for a in axes if len({repr(r.get(a)) for r in rows}) > 1]
    lines = [f"Pareto front ({yn} vs {xn}): {len(front)} of {len(rows)} points"]
    for r in front:
        lines.append(f"  {xn}={r[xn]:.4g} {yn}={r[yn]:.4g}  " + " ".join(f"{a}={r.get(a)}" for a in varied))
    return "\n".join(lines)
