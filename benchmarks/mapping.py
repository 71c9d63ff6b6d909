"""Mapping speed and memory: full default pipeline on Llama-2-13B and Llama-2-70B (LoRA r=8 on Q,V).

Prints wall time, peak resident memory (largest of this process and its workers) and the hop statistics per model.
Goals (issue 3): 13B under 60 s and 4 GiB on 2 cores; 70B under 5 minutes.
Run: python benchmarks/mapping.py [model ...]
"""

from __future__ import annotations

import resource
import sys
import time

from primal_compiler.api import compile_model, last_details
from primal_compiler.frontend import load_model
from primal_compiler.target import load_target


def main(models: list[str]) -> None:
    target = load_target("primal-7nm")
    for name in models:
        model = load_model(name, "q,v:8")
        start = time.perf_counter()
        prog = compile_model(model, target, "default")
        seconds = time.perf_counter() - start
        peak_kib = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        peak_gib = peak_kib / 2**20
        hops = last_details(prog, "hops")
        print(f"{name}: {seconds:.1f} s, peak RSS {peak_gib:.2f} GiB, {prog.layout.num_cts} CTs, "
              f"{len(prog.layout.templates)} distinct CTs, {len(prog.tiles):,} tiles, max hops {hops['max_hops']}, "
              f"weighted hops {hops['weighted_hops']:.3f}")
        for rec in prog.records:
            print(f"    {rec.name:<14} {rec.seconds:7.2f} s")


if __name__ == "__main__":
    main(sys.argv[1:] or ["llama2-13b", "llama2-70b"])
