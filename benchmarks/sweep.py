"""Sweep throughput: points per second with the local process pool, and the scaling from 1 to 2 workers.

For each of two regimes — tiny-llama (LoRA r=8 on Q,V; ~0.03 s a point, so
the sweep machinery's own overhead dominates) and GPT-2 (no LoRA; ~0.8 s a
point, compile/replay-bound like real sweeps) — it runs the same sweep
(context x batch x SRPG gating x a cost-only target constant, cheap Z-curve
pipeline) into fresh result directories with 1 and then 2 pool workers, and
prints wall time, points/s and the speed-up. Wall time includes starting the
pool (each worker imports the compiler and JIT-compiles the replay kernels
once), which is what a user waits for; ``steady`` excludes the first point
each worker ran. Goal (issue 8): report points/s on 2 cores and the 1 -> 2
worker scaling. Point the benchmark at a bigger model to see the compile-bound
regime, e.g. ``python benchmarks/sweep.py llama2-7b``.

Run: python benchmarks/sweep.py [MODEL ...]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from primal_compiler.sweep import ResultStore, run_sweep, spec_from_dict


def spec(model: str):
    tiny = model.startswith("tiny")
    contexts = [32, 64, 128, 256] if tiny else [128, 256]
    return spec_from_dict({
        "sweep": {"model": model, "lora": "q,v:8" if "llama" in model else "none",
                  "metrics": ["tokens_per_s", "tokens_per_j", "power_w"]},
        "axes": {"context": contexts, "batch": [1, 2, 4], "srpg.gating": [True, False],
                 "rram.leakage_uw": [25.0, 50.0]},
    }, "<benchmark>")


def run(s, workers: int) -> tuple[float, int, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r"
        start = time.perf_counter()
        result = run_sweep(s, out, workers=workers, progress=False)
        wall = time.perf_counter() - start
        rows = ResultStore(out).read().to_pylist()
    # steady state: drop each worker's first point (imports, JIT) from the busy time
    by_worker: dict[str, list[float]] = {}
    for r in sorted(rows, key=lambda r: r["finished_at"]):
        by_worker.setdefault(r["worker"], []).append(r["wall_s"])
    busy = max(sum(w[1:]) for w in by_worker.values())
    steady = sum(len(w) - 1 for w in by_worker.values()) / busy if busy else float("nan")
    return wall, result.ran - result.failed, steady


def main(models: list[str]) -> None:
    for model in models or ["tiny-llama", "gpt2"]:
        s = spec(model)
        points = len(s.points())
        print(f"sweep benchmark: {model}, {points} points (context x batch x gating x leakage), "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
        rates = {}
        for workers in (1, 2):
            wall, ok, steady = run(s, workers)
            rates[workers] = points / wall
            print(f"  {workers} worker{'s' * (workers > 1)}: {points} points ({ok} ok) in {wall:.1f} s = "
                  f"{points / wall:.2f} points/s (steady state {steady:.2f} points/s)")
        print(f"  scaling 1 -> 2 workers: {rates[2] / rates[1]:.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
