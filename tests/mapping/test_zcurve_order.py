"""zcurve-order: Morton order keeps aligned 2^k blocks contiguous."""

from __future__ import annotations

import numpy as np

from primal_compiler.mapping.curves import zcurve
from primal_compiler.passmgr import PassManager, parse_pipeline


def test_morton_golden_4x4():
    assert zcurve(4, 4).tolist() == [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15]


def test_aligned_blocks_are_contiguous():
    order = zcurve(32, 32)
    r, c = np.divmod(order, 32)
    for size in (2, 4, 8, 16):
        chunk = size * size
        for k in range(0, 1024, chunk):
            assert r[k : k + chunk].max() - r[k : k + chunk].min() == size - 1
            assert c[k : k + chunk].max() - c[k : k + chunk].min() == size - 1


def test_zcurve_beats_naive_on_weighted_hops(tiny_blocked, small_target):
    z = PassManager(parse_pipeline("zcurve-order")).run(tiny_blocked, small_target)
    naive = PassManager(parse_pipeline("row-major-order{hubs=port}")).run(tiny_blocked, small_target)
    assert z.records[-1].details["hops"]["weighted_hops"] < naive.records[-1].details["hops"]["weighted_hops"]
