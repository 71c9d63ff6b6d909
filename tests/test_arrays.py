"""arrays.distinct is np.unique, by sorting; arrays.ranges is the concatenation of aranges."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.arrays import distinct, ranges


@pytest.mark.parametrize("a", [np.zeros(0, np.int64), np.array([3, -1, 3, 2, -1]), np.arange(10, dtype=np.uint16)[::-1],
                               np.random.default_rng(0).integers(-5, 50, 10_000)])
def test_distinct_equals_unique(a):
    got = distinct(a)
    assert got.dtype == a.dtype and np.array_equal(got, np.unique(a))


@pytest.mark.parametrize("start, size", [([], []), ([5], [0]), ([3, -2, 7, 0], [2, 0, 3, 1]),
                                         (np.random.default_rng(1).integers(-100, 100, 50),
                                          np.random.default_rng(2).integers(0, 6, 50))])
def test_ranges_concatenates_aranges(start, size):
    want = [x for s, n in zip(start, size) for x in range(int(s), int(s) + int(n))]
    got = ranges(np.asarray(start, np.int64), np.asarray(size, np.int64))
    assert got.dtype == np.int64 and got.tolist() == want
