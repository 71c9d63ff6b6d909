"""Layer pipelining on Llama-2-13B, LoRA r=8 on Q,V (docs/executor.md, Pipelining).

Places the model once (the default pipeline's GA placement), then compiles and
replays: decode at batch 1 and at batch 4 with and without per-sequence
passes (context 256, 4 generated tokens), and the 2047-token prefill in one
pass and in prompt chunks (context 2048). Prints TTFT, ITL (mean, p50, p99),
throughput, tokens/J, the record count and each replay's time and the peak
RSS. About 6 minutes on 2 cores.
Run: python benchmarks/pipelining.py
"""

from __future__ import annotations

import resource
import time

from primal_compiler.errors import InputError
from primal_compiler.report.reproduce import Runner, Study

RUNS = (
    ("batch 1", "kv-ring{context=256,batch=1},codegen{steps=4},srpg"),
    ("batch 4, pipelining off", "kv-ring{context=256,batch=4},codegen{steps=4,pipeline=false},srpg"),
    ("batch 4, pipelining on", "kv-ring{context=256,batch=4},codegen{steps=4},srpg"),
    ("prefill in one pass", "kv-ring{context=2048,batch=1},codegen,srpg"),
    ("prefill in 512-token chunks", "kv-ring{context=2048,batch=1},codegen{prefill_chunk=512},srpg"),
    ("prefill in 256-token chunks", "kv-ring{context=2048,batch=1},codegen{prefill_chunk=256},srpg"),
)


def main() -> None:
    runner = Runner(Study())
    for label, tail in RUNS:
        start = time.perf_counter()
        try:
            m = runner.run(tail)
        except InputError as exc:
            print(f"{label:<30} refused: {exc}")
            continue
        seconds = time.perf_counter() - start
        print(f"{label:<30} TTFT {m['ttft_s']:.3f} s, ITL {m['itl_s'] * 1e3:.3f} ms (p50 {m['itl_p50_s'] * 1e3:.3f}, "
              f"p99 {m['itl_p99_s'] * 1e3:.3f}), {m['tokens_per_s']:,.0f} tokens/s, {m['tokens_per_j']:.1f} tokens/J, "
              f"{m['records']['total']:,} records in {seconds:.0f} s, peak RSS "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GiB")


if __name__ == "__main__":
    main()
