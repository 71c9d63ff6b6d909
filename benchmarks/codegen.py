"""Emit speed and size of the IPCN stream: Llama-2-13B, LoRA r=8 on Q,V, 2048-token context.

Prints records and bytes of the adapter load, the 2047-token prefill and the
decode step, and the time of kv-ring, codegen and srpg. Goal (issue 4): under
30 s for both phases on 2 cores.
Run: python benchmarks/codegen.py [model ...]
"""

from __future__ import annotations

import sys

from primal_compiler.api import compile_model
from primal_compiler.frontend import load_model
from primal_compiler.isa.opcodes import RECORD
from primal_compiler.passmgr import PassManager, parse_pipeline
from primal_compiler.target import load_target


def main(models: list[str]) -> None:
    target = load_target("primal-7nm")
    for name in models:
        placed = compile_model(load_model(name, "q,v:8"), target, "lower-tiles,blocking,zcurve-order")
        prog = PassManager(parse_pipeline("kv-ring,codegen,srpg")).run(placed, target)
        s = prog.stream
        print(f"{name}: {len(s):,} records, {s.nbytes / 2**20:.1f} MiB, {s.num_groups:,} groups")
        for sec in s.sections:
            n = sec.stop - sec.start
            print(f"    {sec.name:<10} {n:>10,} records {n * RECORD.itemsize / 2**20:8.1f} MiB")
        for rec in prog.records[-3:]:
            print(f"    {rec.name:<10} {rec.seconds:7.2f} s")
        print(f"    emit total {sum(r.seconds for r in prog.records[-3:]):.2f} s")


if __name__ == "__main__":
    main(sys.argv[1:] or ["llama2-13b"])
