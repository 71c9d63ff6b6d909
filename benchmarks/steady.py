"""Steady-state decode against the full replay on a large model (docs/executor.md, Steady-state decode).

Compiles Llama-2-13B (LoRA r=8 on Q,V, Z-curve placement; ``--context``, default 256, so the full replay
fits in memory) twice: with ``--generate`` decode steps (default 36: the appends cross from the last KV
chunk into the first and on into the second) replayed record by record, and with ``--replay-steps``
(default 3) replayed and the rest repeated (executor/steady.py). Prints each figure of both and their
relative difference, the time and the peak RSS. The full replay of 36 steps takes about 3 minutes and
17 GB on 2 cores.
Run: python benchmarks/steady.py [--context L] [--generate N] [--replay-steps K] [model]
"""

from __future__ import annotations

import argparse
import resource
import time

from primal_compiler.api import compile_model
from primal_compiler.compiled import program_file
from primal_compiler.executor.metrics import metrics
from primal_compiler.executor.replay import replay
from primal_compiler.frontend import load_model
from primal_compiler.target import load_target

FIGURES = ("ttft_s", "itl_first_step_s", "itl_s", "itl_p50_s", "itl_p99_s", "tokens_per_s", "tokens_per_j",
           "power_w", "prefill_energy_j")


def run(name: str, context: int, steps: int, generate: int) -> tuple[dict, float]:
    target = load_target("primal-7nm")
    pipeline = f"lower-tiles,blocking,zcurve-order,kv-ring{{context={context}}},codegen{{steps={steps}}},srpg"
    program = compile_model(load_model(name, "q,v:8"), target, pipeline)
    meta, arrays = program_file(program, target)
    start = time.perf_counter()
    m = metrics(replay(meta, arrays, program.stream, target), generate=generate)
    return m, time.perf_counter() - start


def main(name: str, context: int, generate: int, replayed: int) -> None:
    short, short_s = run(name, context, replayed, generate)
    full, full_s = run(name, context, generate, generate)
    print(f"{name}, context {context}, {generate} generated: {replayed} steps replayed and extended "
          f"({short_s:.1f} s) against all {generate} replayed ({full_s:.1f} s)")
    for key in FIGURES:
        a, b = full[key], short[key]
        print(f"    {key:<18} full {a:.6g}  extended {b:.6g}  difference {abs(b - a) / abs(a):.1e}")
    print(f"    peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--generate", type=int, default=36)
    ap.add_argument("--replay-steps", type=int, default=3)
    ap.add_argument("model", nargs="?", default="llama2-13b")
    args = ap.parse_args()
    main(args.model, args.context, args.generate, args.replay_steps)
