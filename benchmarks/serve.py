"""Serving a 10^4-request trace on Llama-2-7B (LoRA r=8 on Q,V), each policy against its absence.

Places the model once, generates a seeded Poisson trace (3 adapters, Zipf
popularity, prompts 32-256 and generations 16-128 tokens, uniform; a 512-token
context, so 4 sequences fit the KV space) busy
enough for requests to queue, and serves it under the default policy
(prefetch on, block-sparse LoRA on, no batching), then with each
optimisation switched the other way, on the same placement and trace. Prints
each run's wall time (the replays of the shapes it needs and the
simulation) and, apart, the simulation's alone, the peak memory, and the
report's figures as a markdown table.

Then context save: two traces of conversations (2-6 turns, new prompts
32-128 and generations 16-64 tokens, at most the context in all), one with
30 s between turns (people chatting: many conversations alive at once) and
one with 0.5 s (an agent's loop), each served with context save and
without it (one cost table per policy, shared by both traces).
Run: python benchmarks/serve.py [--requests 10000] [--rate 10] [--model llama2-7b] [--context 512]
     [--part all|policies|conversations]
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from primal_compiler.serve.costs import CostTable, Policy
from primal_compiler.serve.report import serve_report
from primal_compiler.serve.run import place
from primal_compiler.serve.sim import simulate
from primal_compiler.serve.trace import poisson_trace
from primal_compiler.target import load_primal_target

RUNS = [("default: prefetch, block-sparse, no batching", Policy()),
        ("no prefetch", Policy(prefetch=False)),
        ("no block-sparse encoding", Policy(sparse=False)),
        ("no prefetch, no block-sparse encoding", Policy(prefetch=False, sparse=False)),
        ("batching up to 4 per adapter", Policy(max_batch=4, batching="same-adapter"))]
THINK_S = (30.0, 0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama2-7b")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--context", type=int, default=512)  # 4 sequences of 512 tokens fit Llama-2-7B's KV space
    parser.add_argument("--part", choices=("all", "policies", "conversations"), default="all")
    args = parser.parse_args()
    target = load_primal_target("primal-7nm")
    clock = time.perf_counter()
    placed = place(args.model, "q,v:8", target, "default", args.context, 4)
    print(f"{args.model}: placed in {time.perf_counter() - clock:.1f} s; context {args.context}")
    if args.part in ("all", "policies"):
        policies(args, placed, target)
    if args.part in ("all", "conversations"):
        conversations(args, placed, target)
    print(f"\npeak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


def policies(args, placed, target) -> None:
    trace = poisson_trace(args.requests, args.rate, ("A", "B", "C"), 1.0, (32, 256), (16, 128), seed=0)
    print(f"\ntrace of {len(trace):,} requests over {trace.arrival_s[-1]:.0f} s ({args.rate:g}/s)\n")
    print("| run | wall s (simulate s) | shapes | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | tokens/s | tokens/J "
          "| switches (cold / warm) | CONFIG time (s) | exposed reconfiguration (s) | reconfiguration J |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for label, policy in RUNS:
        clock = time.perf_counter()
        table = CostTable(placed, target, args.context, policy)
        run = simulate(trace, table)  # replays the shapes it needs
        wall = time.perf_counter() - clock
        clock = time.perf_counter()
        run = simulate(trace, table)  # the request simulation alone
        sim = time.perf_counter() - clock
        r = serve_report(trace, policy, run, placed.model.name, target.name, args.context, per_request=False)
        t, i, sw = r["ttft_s"], r["itl_s"], r["adapter_switches"]
        print(f"| {label} | {wall:.1f} ({sim:.2f}) | {len(r['shapes'])} | {t['p50'] * 1e3:.1f} / {t['p99'] * 1e3:.1f} "
              f"| {i['p50'] * 1e3:.3f} / {i['p99'] * 1e3:.3f} | {r['tokens_per_s']:.1f} | {r['tokens_per_j']:.1f} "
              f"| {sw['total']:,} ({sw['cold']:,} / {sw['warm']:,}) | {r['reconfiguration']['config_s']:.4f} "
              f"| {r['reconfiguration']['exposed_s']:.4f} "
              f"| {r['reconfiguration']['energy_j']:.3f} |", flush=True)


def conversations(args, placed, target) -> None:
    print("\n| trace | context save | wall s | shapes | returning turns | resumed | prefilled tokens | saved tokens "
          "| evictions | TTFT p50 / p99 (ms) | returning TTFT p50 / p99 (ms) | tokens/s | tokens/J | prefill J |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    tables = {save: CostTable(placed, target, args.context, Policy(context_save=save)) for save in (True, False)}
    for think in THINK_S:
        trace = poisson_trace(args.requests, args.rate, ("A", "B", "C"), 1.0, (32, 128), (16, 64), seed=0,
                              turns=(2, 6), think_s=think, context=args.context)
        back = trace.history > 0
        for save, table in tables.items():
            clock = time.perf_counter()
            run = simulate(trace, table)
            wall = time.perf_counter() - clock
            r = serve_report(trace, table.policy, run, placed.model.name, target.name, args.context, per_request=False)
            cs, t = r["context_save"], r["ttft_s"]
            ttft = (run["first_token_s"] - trace.arrival_s)[back] * 1e3
            print(f"| {think:g} s between turns, {len(trace):,} requests over {trace.arrival_s[-1]:.0f} s "
                  f"| {'on' if save else 'off'} | {wall:.1f} | {len(r['shapes'])} | {cs['returning']:,} "
                  f"| {cs['resumed']:,} | {cs['prefilled_tokens']:,} | {cs['saved_tokens']:,} | {cs['evictions']:,} "
                  f"| {t['p50'] * 1e3:.1f} / {t['p99'] * 1e3:.1f} "
                  f"| {np.percentile(ttft, 50):.1f} / {np.percentile(ttft, 99):.1f} | {r['tokens_per_s']:.1f} "
                  f"| {r['tokens_per_j']:.1f} | {r['energy_by_phase_j']['prefill']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
