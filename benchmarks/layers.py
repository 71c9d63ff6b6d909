"""Are a model's identical layers replayed as time shifts of one another? (issue 54 item 2's ground)

Compiles a model with the default pipeline (LoRA r=8 on Q,V, ``--context``, three decode steps replayed, as
``primal run`` replays them), replays it, and for every pass
(the prefill, each decode step) compares each decoder layer's records with the previous layer's: the pair
is a *shift* when both lists have the same length and every record starts and finishes exactly ``P`` cycles
after its counterpart, one ``P`` for the pair (and, weaker, the pairs whose starts alone shift alike). Prints
per pass the pairs that are shifts (of the layers
from 2 on: layer 1 follows the embedding, not a layer like itself), their periods, and for the rest the
spread of their records' shifts. A replay that reuses layers would be exact where every pair is a shift.
Run: python benchmarks/layers.py [--context L] [model]   (llama2-13b: about 20 s and 3 GiB on 2 cores)
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from primal_compiler.api import compile_model, for_workload
from primal_compiler.compiled import program_file
from primal_compiler.executor.replay import replay
from primal_compiler.frontend import load_model
from primal_compiler.isa.opcodes import ActFn, Opcode
from primal_compiler.pipeline import Workload
from primal_compiler.target import load_target


def passes(records: np.ndarray, section: np.ndarray) -> list[np.ndarray]:
    """The record indices of each pass of ``section``: up to and including each controller ARGMAX (none in a
    section without one)."""
    part = records[section]
    ends = np.flatnonzero((part["op"] == Opcode.ACT) & (part["arg"] == ActFn.ARGMAX)) + 1
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64) if len(ends) else ends  # the adapter load: none
    return [section[lo:hi] for lo, hi in zip(starts, ends, strict=True)]


def shifts(layer: np.ndarray, start: np.ndarray, finish: np.ndarray, rec: np.ndarray, layers: int) -> list[tuple]:
    """(layer n, shift or None, smallest and largest record shift, whether the starts alone shift alike) for
    n = 2 .. layers-1 of one pass."""
    out = []
    for n in range(2, layers):
        a, b = rec[layer[rec] == n - 1], rec[layer[rec] == n]
        if len(a) != len(b) or not len(a):
            out.append((n, None, 0, 0, False))
            continue
        starts = start[b] - start[a]
        d = np.concatenate([starts, finish[b] - finish[a]])
        out.append((n, int(d[0]) if d.min() == d.max() else None, int(d.min()), int(d.max()),
                    bool(starts.min() == starts.max())))
    return out


def main(name: str, context: int) -> None:
    target = load_target("primal-7nm")
    pipeline = for_workload("default", Workload(context=context, steps=3, generate=3))  # as primal run replays
    program = compile_model(load_model(name, "q,v:8"), target, pipeline)
    meta, arrays = program_file(program, target)
    t = time.perf_counter()
    rp = replay(meta, arrays, program.stream, target, rows=False)
    layers, records = program.model.num_layers, program.stream.records
    print(f"{name}, context {context}: {len(records):,} records, {layers} layers, replayed in "
          f"{time.perf_counter() - t:.1f} s")
    for s in program.stream.sections:
        for k, rec in enumerate(passes(records, np.arange(s.start, s.stop))):
            rows = shifts(records["layer"].astype(np.int64), rp.start, rp.finish, rec, layers)
            exact = [r for r in rows if r[1] is not None]
            periods = sorted({r[1] for r in exact})
            rest = [r for r in rows if r[1] is None]
            spread = f"; the others' records shift by {min(r[2] for r in rest):,} to {max(r[3] for r in rest):,}" \
                if rest else ""
            print(f"  {s.name} pass {k}: {len(exact)} of {len(rows)} layer pairs are shifts, periods "
                  f"{', '.join(f'{p:,}' for p in periods) or '-'} cycles; {sum(r[4] for r in rows)} with every "
                  f"start shifted alike{spread}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="llama2-13b")
    ap.add_argument("--context", type=int, default=2048)
    args = ap.parse_args()
    main(args.model, args.context)
