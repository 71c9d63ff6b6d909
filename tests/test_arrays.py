"""arrays.distinct is np.unique, by sorting."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.arrays import distinct


@pytest.mark.parametrize("a", [np.zeros(0, np.int64), np.array([3, -1, 3, 2, -1]), np.arange(10, dtype=np.uint16)[::-1],
                               np.random.default_rng(0).integers(-5, 50, 10_000)])
def test_distinct_equals_unique(a):
    got = distinct(a)
    assert got.dtype == a.dtype and np.array_equal(got, np.unique(a))
