"""Replay speed and memory of the executor: Llama-2-13B (and 70B), LoRA r=8 on Q,V, 2048-token context.

Compiles with the cheap placement (Z-curve, no GA), then replays the whole
stream (adapter load, 2047-token prefill, ``--generate`` decode steps) and
prints each replay stage's time, the rate in instructions per second, the
metrics (TTFT, ITL with p50/p99, throughput) and the peak RSS of the
process. Goal (issue 13): Llama-2-13B, prompt 2047 + 64 generated tokens,
under 30 s and 4 GiB on 2 cores.
Run: python benchmarks/executor.py [--generate N] [model ...]
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


def main(models: list[str], steps: int) -> None:
    target = load_target("primal-7nm")
    for name in models:
        program = compile_model(load_model(name, "q,v:8"), target,
                                f"lower-tiles,blocking,zcurve-order,kv-ring,codegen{{steps={steps}}},srpg")
        meta, arrays = program_file(program, target)
        start = time.perf_counter()
        rp = replay(meta, arrays, program.stream, target)
        m = metrics(rp)
        seconds = time.perf_counter() - start
        n = len(program.stream)
        stages = ", ".join(f"{k} {v:.2f} s" for k, v in rp.stages)
        print(f"{name}, {steps} generated: {n:,} records replayed in {seconds:.1f} s = {n / seconds:,.0f} "
              f"instructions/s ({stages})")
        print(f"    {len(rp.transfers.rec):,} legs, {len(rp.transfers.link):,} (record, link) rows, "
              f"{len(rp.pred):,} dependency edges; TTFT {m['ttft_s']:.3f} s, ITL {m['itl_s'] * 1e3:.3f} ms "
              f"(p50 {m['itl_p50_s'] * 1e3:.3f}, p99 {m['itl_p99_s'] * 1e3:.3f}), {m['tokens_per_s']:.1f} tokens/s")
        print(f"    peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--generate", type=int, default=1, help="decode steps to compile and replay (goal: 64)")
    ap.add_argument("models", nargs="*", default=["llama2-13b"])
    args = ap.parse_args()
    main(args.models, args.generate)
