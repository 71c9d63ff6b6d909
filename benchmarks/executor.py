"""Replay speed and memory of the executor: Llama-2-13B, LoRA r=8 on Q,V, 2048-token context.

Compiles with the cheap placement (Z-curve, no GA), then replays the whole
stream (adapter load, 2047-token prefill, one decode step) and prints each
replay stage's time, the rate in instructions per second and the peak RSS of
the process. Goal (issue 5): a 13B decode step plus prefill replays in under
30 s on 2 cores.
Run: python benchmarks/executor.py [model ...]
"""

from __future__ import annotations

import resource
import sys
import time

from primal_compiler.api import compile_model, program_file
from primal_compiler.executor.metrics import metrics
from primal_compiler.executor.replay import replay
from primal_compiler.frontend import load_model
from primal_compiler.target import load_target


def main(models: list[str]) -> None:
    target = load_target("primal-7nm")
    for name in models:
        program = compile_model(load_model(name, "q,v:8"), target,
                                "lower-tiles,blocking,zcurve-order,kv-ring,codegen,srpg")
        meta, arrays = program_file(program, target)
        start = time.perf_counter()
        rp = replay(meta, arrays, program.stream, target)
        m = metrics(rp)
        seconds = time.perf_counter() - start
        n = len(program.stream)
        stages = ", ".join(f"{k} {v:.2f} s" for k, v in rp.stages)
        print(f"{name}: {n:,} records replayed in {seconds:.1f} s = {n / seconds:,.0f} instructions/s ({stages})")
        print(f"    {len(rp.transfers.rec):,} legs, {len(rp.transfers.link):,} (record, link) rows; "
              f"TTFT {m['ttft_s']:.3f} s, ITL {m['itl_s'] * 1e3:.3f} ms")
        print(f"    peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main(sys.argv[1:] or ["llama2-13b"])
