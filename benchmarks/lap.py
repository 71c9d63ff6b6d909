"""The polishers' linear assignment: SciPy's solver against OR-Tools' on Llama-2-13B's cost matrices.

For each distinct CT template of Llama-2-13B (LoRA r=8 on Q,V; the default
pipeline's placement problems, column bands and Q/K ties included), the hubs
are put at the weighted medians of the Z-curve placement and the (tiles x PEs)
cost matrix the polishers solve is built once (:func:`.lap.cost_matrix`). Each
solver then assigns it: SciPy's rectangular shortest-augmenting-path
``linear_sum_assignment`` (what :func:`.lap.assign` uses) and OR-Tools'
cost-scaling ``SimpleLinearSumAssignment`` on the matrix padded to a square,
arcs included. Prints each one's seconds (best of ``--repeat``) and checks that
both reach the same optimal cost.
Run: python benchmarks/lap.py [--repeat N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from scipy.optimize import linear_sum_assignment as scipy_lsa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from primal_compiler.frontend import load_model  # noqa: E402
from primal_compiler.ir.program import Program  # noqa: E402
from primal_compiler.mapping.ga import GaConfig, _Decoder  # noqa: E402
from primal_compiler.mapping.instance import hub_xy  # noqa: E402
from primal_compiler.mapping.lap import cost_matrix  # noqa: E402
from primal_compiler.passmgr import PassManager, resolve_pipeline  # noqa: E402
from primal_compiler.target import load_target  # noqa: E402
from primal_compiler.transforms.ga_placement import _first_identical, _template_bands, _tied  # noqa: E402
from tests.mapping.instances import ortools_optimum  # noqa: E402


def _best(fn, repeat: int) -> tuple[float, int]:
    times, cost = [], 0
    for _ in range(repeat):
        t = time.perf_counter()
        cost = fn()
        times.append(time.perf_counter() - t)
    return min(times), cost


def _scipy(C: np.ndarray) -> int:
    rows, cols = scipy_lsa(C)
    return int(C[rows, cols].sum())


def main(repeat: int) -> None:
    passes = resolve_pipeline("default")
    program = PassManager(passes[:3]).run(Program(model=load_model("llama2-13b", "q,v:8")), load_target("primal-7nm"))
    layout = program.need_layout()
    instances = [_tied(tp.instance) for tp in layout.templates]
    configs = [GaConfig(bands=_template_bands(program, tp)) for tp in layout.templates]
    print("| template | tiles x PEs | bands | SciPy s | OR-Tools s | ratio | same optimum |\n|---|---|---|---|---|---|---|")
    total = [0.0, 0.0]
    for k in sorted(set(_first_identical(instances, configs))):  # each distinct placement problem once
        inst, tp, bands = instances[k], layout.templates[k], configs[k].bands
        slots = tp.slots
        hx, hy = hub_xy(inst, (slots % inst.cols)[None, :], (slots // inst.cols)[None, :])
        regions = _Decoder(inst, 1, (), bands).regions  # the polishers' regions: each band's tiles on its PEs
        C = cost_matrix(inst, hx[0], hy[0], {}, regions=regions)
        s, cs = _best(lambda: _scipy(C), repeat)
        o, co = _best(lambda: ortools_optimum(C), repeat)
        total[0] += s
        total[1] += o
        print(f"| {k} | {C.shape[0]} x {C.shape[1]} | {'yes' if bands else 'no'} | {s:.3f} | {o:.3f} | "
              f"{o / s:.1f}x | {'yes' if cs == co else f'NO ({cs} vs {co})'} |")
    print(f"| all | | | {total[0]:.3f} | {total[1]:.3f} | {total[1] / total[0]:.1f}x | |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    main(parser.parse_args().repeat)
