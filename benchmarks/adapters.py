"""How many distinct adapters can share a batch before reprogramming, not compute, sets the pace: PRIMAL
against the GPU family (issue 50).

For each LoRA rank and each count k of distinct adapters in a batch, compiles one program on the placed
model: a batch of ``--batch`` sequences on k adapters in runs as even as they go (``codegen{requests=
0+0+1+1+...}``, ``srpg`` pipelining every layer's writes behind the previous layer of the same pass), a
``--prompt``-token prompt and 3 decode steps in a ``--context``-token KV ring, and replays it. Prints the
settled decode step's throughput (batch / ITL), ITL p50 and p99, tokens/J and the CONFIG bytes a step writes,
the SRAM-DCIM slots the rank leaves, and the crossover: the first k whose ITL p50 exceeds the one-adapter
batch's by more than 5% (reprogramming exposed). Beside each row, the GPU family member
(``--gpu``/``--engine``, unmerged LoRA with an SGMV-class gather per adapter, docs/baselines.md) at the same
batch, prompt, generation, rank and k.

Run: python benchmarks/adapters.py [--model llama2-7b] [--batch 8] [--ranks 8,16,64] [--adapters 1,2,4,8]
     [--prompt 8] [--context 256] [--gpu h100] [--engine vllm]
On 2 cores, Llama-2-7B at batch 8: about 70-90 s a program. k is at most the batch; 16 adapters need a batch
of 16 (context 128 at most on Llama-2-7B), 64 a batch of 64 (context 32; 311 s and 8 GiB to compile and be
refused). A program the machine cannot hold (a CT's program past its instruction buffer) is a row saying why.
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from primal_compiler import compiled
from primal_compiler.api import compile_model
from primal_compiler.baselines.engine import serve as gpu_serve
from primal_compiler.baselines.profile import load_engine
from primal_compiler.codegen.residency import sram_slots
from primal_compiler.errors import InputError
from primal_compiler.executor.metrics import metrics
from primal_compiler.executor.replay import replay
from primal_compiler.frontend import load_model
from primal_compiler.isa.opcodes import Opcode
from primal_compiler.passmgr import PassManager, parse_pipeline
from primal_compiler.serve.costs import mixed
from primal_compiler.target import load_gpu_target, load_primal_target

STEPS = 3
EXPOSED = 1.05  # ITL p50 past 5% over one adapter's: reprogramming shows


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def primal_row(placed, target, batch: int, k: int, prompt: int, context: int) -> dict:
    """The replayed figures of a batch of ``batch`` on ``k`` adapters."""
    spec = (f"kv-ring{{context={context},batch={batch}}},codegen{{requests={mixed(batch, k, 0)},prompt={prompt},"
            f"steps={STEPS}}},srpg")
    program = PassManager(parse_pipeline(spec)).run(placed, target)
    meta, arrays = compiled.program_file(program, target)
    rp = replay(meta, arrays, program.need_stream(), target)
    m = metrics(rp, 0)
    rec = program.need_stream().records
    dec = next(s for s in program.need_stream().sections if s.name == "decode:0")
    part = rec[dec.start : dec.stop]
    written = int(part["nbytes"][part["op"] == Opcode.CONFIG].astype(np.int64).sum()) / STEPS
    return {"tokens_per_s": batch / m["itl_p50_s"], "itl_p50_s": m["itl_p50_s"], "itl_p99_s": m["itl_p99_s"],
            "tokens_per_j": m["tokens_per_j"], "config_bytes_per_step": written, "records": len(rec)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--ranks", type=_ints, default=[8, 16, 64])
    ap.add_argument("--adapters", type=_ints, default=[1, 2, 4, 8])
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--engine", default="vllm")
    args = ap.parse_args()
    target = load_primal_target("primal-7nm")
    gpu, engine = load_gpu_target(args.gpu, "--gpu"), load_engine(args.engine)
    print(f"{args.model}, LoRA on q,v, batch {args.batch}, prompt {args.prompt}, {STEPS} decode steps, context "
          f"{args.context}; PRIMAL on {target.name} against {args.engine}:fp16 on {args.gpu} (unmerged)\n")
    print("| rank | slots | adapters | PRIMAL tokens/s | ITL p50 | ITL p99 | tokens/J | CONFIG a step | "
          f"{args.gpu} tokens/s | {args.gpu} ITL | {args.gpu} tokens/J | wall |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    crossover: dict[int, int] = {}
    measured: set[int] = set()
    refused: set[int] = set()
    for rank in args.ranks:
        model = load_model(args.model, f"q,v:{rank}")
        placed = compile_model(model, target, "lower-tiles,blocking,zcurve-order")
        slots = sram_slots(placed.need_tiles(), target, model.precision.lora_weight_bits)
        one = None
        for k in [a for a in args.adapters if a <= args.batch]:
            t0 = time.perf_counter()
            try:
                row = primal_row(placed, target, args.batch, k, args.prompt, args.context)
            except InputError as exc:  # the machine cannot hold this program: say so in the row
                print(f"| {rank} | {slots} | {k} | refused: {exc.problem} |", flush=True)
                refused.add(rank)
                continue
            measured.add(rank)
            wall = time.perf_counter() - t0
            one = one or row
            if k > 1 and rank not in crossover and row["itl_p50_s"] > EXPOSED * one["itl_p50_s"]:
                crossover[rank] = k
            g = gpu_serve(model, gpu, engine, precision="fp16", batch=args.batch, prompt=args.prompt,
                          generate=STEPS + 1, adapters=k)
            print(f"| {rank} | {slots} | {k} | {row['tokens_per_s']:,.0f} | {row['itl_p50_s'] * 1e6:,.1f} us | "
                  f"{row['itl_p99_s'] * 1e6:,.1f} us | {row['tokens_per_j']:,.1f} | "
                  f"{row['config_bytes_per_step'] / 2**20:,.2f} MiB | {g.tokens_per_s:,.0f} | {g.itl_s * 1e6:,.1f} us | "
                  f"{g.tokens_per_j:,.2f} | {wall:.0f} s |", flush=True)
    print()
    for rank in args.ranks:
        where = crossover.get(rank)
        if rank not in measured:
            print(f"rank {rank}: no program of this grid fits the machine")
        elif where:
            print(f"rank {rank}: reprogramming exposed from {where} adapters a batch")
        else:
            top = max(a for a in args.adapters if a <= args.batch)
            print(f"rank {rank}: reprogramming hidden up to {top} adapters"
                  + (" (some rows refused)" if rank in refused else ""))
    print(f"peak memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GiB")


if __name__ == "__main__":
    main()
