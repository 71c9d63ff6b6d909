"""The polishers' linear assignment against OR-Tools' solver, an independent implementation of the same optimum."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.mapping.lap import FORBIDDEN, assign, cost_matrix
from tests.mapping.instances import ortools_optimum, random_instance


@pytest.mark.parametrize("seed", range(6))
def test_assignment_is_optimal_and_keeps_pins(seed):
    inst = random_instance(seed, 6, 6, 30, 5)
    rng = np.random.default_rng(seed)
    hx, hy = rng.integers(0, 6, 5).astype(float), rng.integers(0, 6, 5).astype(float)
    pins = {0: 35, 7: 0}
    out = assign(inst, hx, hy, pins)
    assert out is not None and len(set(out.tolist())) == 30 and out[0] == 35 and out[7] == 0
    C = cost_matrix(inst, hx, hy, pins)
    assert C[np.arange(30), out].sum() == ortools_optimum(C)


def test_a_cap_no_placement_meets_is_refused_and_regions_are_kept():
    inst = random_instance(1, 6, 6, 30, 5)
    hx, hy = np.zeros(5), np.zeros(5)  # every hub in a corner: 30 tiles cannot all sit within 2 hops
    assert assign(inst, hx, hy, {}, cap=2) is None
    regions = (np.arange(30) % 2, np.arange(36) % 2)
    out = assign(inst, hx, hy, {}, regions=regions)
    assert out is not None and (regions[1][out] == regions[0]).all()
    C = cost_matrix(inst, hx, hy, {}, regions=regions)
    assert C[np.arange(30), out].max() < FORBIDDEN and C[np.arange(30), out].sum() == ortools_optimum(C)
