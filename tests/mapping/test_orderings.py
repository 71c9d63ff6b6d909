"""The ordering passes: every curve is a permutation with its characteristic locality."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from primal_compiler.ir.facts import Fact
from primal_compiler.mapping.curves import CURVES
from primal_compiler.passmgr import PassManager, parse_pipeline
from primal_compiler.verify import VERIFIERS


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.sampled_from(sorted(CURVES)))
def test_curve_is_a_permutation(rows, cols, name):
    order = CURVES[name](rows, cols)
    assert np.array_equal(np.sort(order), np.arange(rows * cols))


@pytest.mark.parametrize("name", ["snake", "spiral", "hilbert"])
def test_unit_step_curves(name):
    order = CURVES[name](16, 16)
    r, c = np.divmod(order, 16)
    assert (np.abs(np.diff(r)) + np.abs(np.diff(c)) == 1).all()


def test_spiral_and_zigzag_golden():
    assert CURVES["spiral"](4, 4).tolist() == [0, 1, 2, 3, 7, 11, 15, 14, 13, 12, 8, 4, 5, 6, 10, 9]
    assert CURVES["zigzag"](4, 4).tolist() == [0, 1, 4, 8, 5, 2, 3, 6, 9, 12, 13, 10, 7, 11, 14, 15]


@pytest.mark.parametrize("name", ["row-major", "snake", "spiral", "zigzag", "zcurve", "hilbert"])
def test_ordering_pass_places_every_tile_once(tiny_blocked, small_target, name):
    prog = PassManager(parse_pipeline(f"{name}-order"), verify=True).run(tiny_blocked, small_target)
    assert VERIFIERS[Fact.PLACED](prog) is None
    assert prog.records[-1].name == f"{name}-order"
    assert prog.records[-1].details["hops"]["max_hops"] > 0


def test_naive_row_major_reaches_the_mesh_diameter(target):
    from primal_compiler.api import compile_model
    from primal_compiler.frontend import load_model

    prog = compile_model(load_model("llama2-13b", "q,v:8"), target, "lower-tiles,blocking,row-major-order{hubs=port}")
    assert prog.records[-1].details["hops"]["max_hops"] == 62


def test_a_new_ordering_needs_its_curve_its_pass_module_and_nothing_else(tiny_blocked, small_target, monkeypatch):
    """docs/adding.md: a curve in CURVES and an OrderingPass subclass (which registers itself) are all it takes
    for the pass to run in a pipeline and to be compared by ``primal map --compare``."""
    from dataclasses import dataclass

    from primal_compiler.passmgr import REGISTRY
    from primal_compiler.report.hops import strategies
    from primal_compiler.transforms.ordering import OrderingPass

    def backwards(rows: int, cols: int) -> np.ndarray:
        return np.arange(rows * cols)[::-1].copy()

    monkeypatch.setitem(CURVES, "backwards", backwards)
    try:
        @dataclass(frozen=True)
        class BackwardsOrder(OrderingPass):
            name = "backwards-order"
            summary = "place tiles from the last PE back"
            curve = "backwards"

        prog = PassManager(parse_pipeline("backwards-order"), verify=True).run(tiny_blocked, small_target)
        pes = small_target.ct.mesh_rows * small_target.ct.mesh_cols
        assert prog.need_layout().templates[0].slots[0] == pes - 1
        assert strategies()["backwards"] == "backwards-order"
    finally:
        REGISTRY.pop("backwards-order", None)
