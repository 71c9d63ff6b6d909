"""One point: the row, the program hash, the GA's executor wiring."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from primal_compiler.passmgr import parse_pipeline
from primal_compiler.sweep.point import run_point
from primal_compiler.sweep import spec_from_dict
from primal_compiler.transforms.ga_placement import GaPlacement


def points(axes, **sweep):
    return spec_from_dict({"sweep": {"model": "tiny-llama", "context": 64, **sweep}, "axes": axes}, "s.toml").points()


def test_program_hash_ignores_cost_only_constants():
    a, b = (run_point(p) for p in points({"rram.leakage_uw": [0.24, 1.0]}))
    assert a["error"] is None and b["error"] is None
    assert a["program_hash"] == b["program_hash"]  # same stream and arrays, different costs
    assert a["power_w"] != b["power_w"]
    c, d = (run_point(p) for p in points({"batch": [1, 2]}))
    assert c["program_hash"] != d["program_hash"]


def test_ga_executor_override_is_not_pipeline_text():
    with ThreadPoolExecutor(1) as ex:
        p = GaPlacement(seed=2, executor_override=ex)
        assert p.spec() == "ga-placement{seed=2}"
        assert parse_pipeline(p.spec())[0] == GaPlacement(seed=2)
