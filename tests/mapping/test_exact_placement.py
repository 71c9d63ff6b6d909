"""exact-placement: CP-SAT proves optima on small instances; the GA lands within 2% of them."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.mapping.exact import solve_exact, star_bound
from primal_compiler.mapping.ga import GaConfig, run_ga
from primal_compiler.mapping.instance import evaluate

from .instances import random_instance

SMALL_GA = dict(group_size=1, population=48, generations=100, polish_top=16, max_hop_slack=0.0)


def _instances():
    for k in range(20):
        if k < 10:
            yield k, random_instance(k, 4, 4, 7, 2)
        else:
            yield k, random_instance(k, 5, 5, 7, 3)


def test_ga_within_two_percent_of_proven_optimum_on_18_of_20():
    within, proven = 0, 0
    for k, inst in _instances():
        ga = run_ga(inst, GaConfig(seed=k, **SMALL_GA))
        ex = solve_exact(inst, 60.0, hint=ga.slots)
        assert ex.slots is not None
        proven += ex.optimal
        assert ex.cost <= ga.cost + 1e-9  # the optimum is never worse than the heuristic
        assert star_bound(inst).byte_hops <= ex.cost + 1e-9  # the bound is a bound
        assert evaluate(inst, ex.slots[None, :])[0][0] == pytest.approx(ex.cost)
        within += ga.cost <= 1.02 * ex.cost
    assert proven == 20
    assert within >= 18


def test_exact_solution_is_a_valid_placement():
    inst = random_instance(3, 4, 4, 8, 2)
    ex = solve_exact(inst, 30.0)
    assert ex.optimal
    assert len(np.unique(ex.slots)) == inst.num_tiles
    assert ex.slots.min() >= 0 and ex.slots.max() < 16


def test_star_bound_below_every_ordering_on_real_ct(tiny_blocked):
    from primal_compiler.mapping.curves import CURVES

    for tp in tiny_blocked.layout.templates:
        lb = star_bound(tp.instance).byte_hops
        for curve in CURVES.values():
            slots = curve(tp.instance.rows, tp.instance.cols)[: tp.instance.num_tiles]
            assert lb <= evaluate(tp.instance, slots[None, :])[0][0] + 1e-6


def test_an_interrupt_during_the_solve_is_not_swallowed():
    """CP-SAT catches SIGINT by default, ends its search and returns: the command then finished with what it
    had (exit 0). The solver leaves SIGINT to Python, so the interrupt lands when the solve returns."""
    import signal
    import subprocess
    import sys
    import textwrap
    import time
    from pathlib import Path

    child = textwrap.dedent("""
        from tests.mapping.instances import random_instance
        from primal_compiler.mapping.exact import solve_exact
        inst = random_instance(0, 6, 6, 20, 4)
        print("READY", flush=True)
        solve_exact(inst, 1.0)
        print("DONE", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    assert proc.stdout.readline().strip() == "READY"
    time.sleep(0.5)  # model built, the search running (it takes over a second)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert "DONE" not in out and "KeyboardInterrupt" in err, (proc.returncode, out, err[-300:])
