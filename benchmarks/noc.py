"""Latency against offered load on a PE mesh: the executor's links (cut-through and in-order) beside the
flit-level reference model (docs/refsim.md).

Open-loop Bernoulli traffic (tests/executor/noc.py): uniform random, transpose, bit-complement,
hotspot (a quarter of the packets to the centre) and all-to-one (every packet to the centre) on 8x8 with 1- and 4-flit packets and on 32x32 with
4-flit packets, executor (cut-through and in-order links) and reference side by side. 16-flit
buffers, 2-cycle hops, one injection and one ejection port per node, 1000 cycles of which 200 warm-up. Prints mean latency (cycles) and accepted
throughput (flits per node per cycle) per offered load, and each model's saturation load (accepted
under 95% of offered). ``--plot FILE.svg`` also draws the 8x8 curves. About 12 minutes (the
reference is a Python flit loop).
Run: python benchmarks/noc.py [--plot docs/img/noc.svg]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from primal_compiler.viz.style import save  # noqa: E402
from tests.executor.noc import PATTERNS, Load, run_executor, run_reference, stats  # noqa: E402

MODELS = {"cut-through": lambda load: run_executor(load), "in-order": lambda load: run_executor(load, "in-order"),
          "reference": run_reference}


def sweep(rows: int, pattern: str, flits: int, models: tuple[str, ...], rates) -> dict[str, list[dict]]:
    """Per model, the stats at each rate; a model stops once it accepts under 80% of the offer."""
    out: dict[str, list[dict]] = {m: [] for m in models}
    for rate in rates:
        for m in models:
            if out[m] and out[m][-1]["accepted"] < 0.8 * out[m][-1]["offered"]:
                continue
            load = Load(rows, rows, pattern, float(rate), flits, cycles=1000, warmup=200)
            out[m].append({"rate": float(rate), **stats(load, *MODELS[m](load))})
    return out


def saturation(points: list[dict]) -> str:
    hit = next((p["rate"] for p in points if p["accepted"] < 0.95 * p["offered"]), None)
    return f"{hit:.2f}" if hit is not None else f"> {points[-1]['rate']:.2f}"


def report(rows: int, pattern: str, flits: int, curves: dict[str, list[dict]]) -> None:
    print(f"\n{rows}x{rows} {pattern}, {flits}-flit packets; saturation: "
          + ", ".join(f"{m} {saturation(c)}" for m, c in curves.items()))
    print("offered  " + "  ".join(f"{m + ' latency':>22} {'accepted':>8}" for m in curves))
    rates = sorted({p["rate"] for c in curves.values() for p in c})
    for r in rates:
        cells = []
        for c in curves.values():
            p = next((p for p in c if p["rate"] == r), None)
            cells.append(f"{p['latency']:>22.1f} {p['accepted']:>8.3f}" if p else " " * 31)
        print(f"{r:>7.2f}  " + "  ".join(cells))


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(PATTERNS), figsize=(4 * len(PATTERNS), 7), sharey=True)
    for (pattern, flits), curves in results.items():
        ax = axes[[1, 4].index(flits), PATTERNS.index(pattern)]
        for m, c in curves.items():
            ax.plot([p["offered"] for p in c], [p["latency"] for p in c], marker="o", ms=3, label=m)
        ax.set_title(f"8x8 {pattern}, {flits}-flit packets", fontsize=9)
        ax.set_yscale("log")
        ax.set_xlabel("offered flits/node/cycle")
    axes[0, 0].set_ylabel("mean latency (cycles)")
    axes[1, 0].set_ylabel("mean latency (cycles)")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    save(fig, path, "svg")  # no date, fixed ids: the same curves are the same bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plot", type=Path, help="write the 8x8 curves as an SVG")
    args = ap.parse_args()
    results = {}
    for flits in (1, 4):
        for pattern in PATTERNS:
            start = time.perf_counter()
            curves = sweep(8, pattern, flits, ("cut-through", "in-order", "reference"), np.arange(0.05, 0.61, 0.05))
            results[(pattern, flits)] = curves
            report(8, pattern, flits, curves)
            print(f"({time.perf_counter() - start:.0f} s)")
    for pattern in PATTERNS:
        start = time.perf_counter()
        report(32, pattern, 4, sweep(32, pattern, 4, ("cut-through", "in-order", "reference"),
                                     np.arange(0.02, 0.31, 0.02)))
        print(f"({time.perf_counter() - start:.0f} s)")
    if args.plot:
        plot(results, args.plot)
        print(f"\nwrote {args.plot}")


if __name__ == "__main__":
    main()
