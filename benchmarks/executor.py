"""Replay speed and memory of the executor: Llama-2-13B (and 70B), LoRA r=8 on Q,V, 2048-token context.

Compiles with the cheap placement (Z-curve, no GA) for ``--generate`` tokens
(default 64) of which ``--replay-steps`` decode steps (default 3) are in the
stream, then replays it (adapter load, 2047-token prefill, those steps;
the later tokens repeat the periodic last step, executor/steady.py) and
prints each replay stage's time, the rate in instructions per second, the
metrics (TTFT, ITL with p50/p99, throughput) and the peak RSS of the
process. ``--replay-steps`` equal to ``--generate`` replays every step.
Goal (issue 13): Llama-2-13B, prompt 2047 + 64 generated tokens, under 30 s
and 4 GiB on 2 cores.
Run: python benchmarks/executor.py [--generate N] [--replay-steps K] [model ...]
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


def main(models: list[str], generate: int, replayed: int) -> None:
    target = load_target("primal-7nm")
    steps = min(generate, replayed)
    for name in models:
        program = compile_model(load_model(name, "q,v:8"), target,
                                f"lower-tiles,blocking,zcurve-order,kv-ring,codegen{{steps={steps}}},srpg")
        meta, arrays = program_file(program, target)
        start = time.perf_counter()
        rp = replay(meta, arrays, program.stream, target)
        m = metrics(rp, generate=generate)
        seconds = time.perf_counter() - start
        n = len(program.stream)
        stages = ", ".join(f"{k} {v:.2f} s" for k, v in rp.stages)
        print(f"{name}, {generate} generated ({steps} decode steps replayed): {n:,} records replayed in {seconds:.1f} s = {n / seconds:,.0f} "
              f"instructions/s ({stages})")
        print(f"    {len(rp.transfers.rec):,} legs, {len(rp.transfers.link):,} (record, link) rows, "
              f"{len(rp.pred):,} dependency edges; TTFT {m['ttft_s']:.3f} s, ITL {m['itl_s'] * 1e3:.3f} ms "
              f"(p50 {m['itl_p50_s'] * 1e3:.3f}, p99 {m['itl_p99_s'] * 1e3:.3f}), {m['tokens_per_s']:.1f} tokens/s")
        print(f"    peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--generate", type=int, default=64, help="tokens generated per sequence (goal: 64)")
    ap.add_argument("--replay-steps", type=int, default=3, help="decode steps replayed record by record")
    ap.add_argument("models", nargs="*", default=["llama2-13b"])
    args = ap.parse_args()
    main(args.models, args.generate, args.replay_steps)
