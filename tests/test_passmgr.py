"""Pass manager: pipeline text round-trips, TOML pipelines, contracts and option errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import primal_compiler.transforms  # noqa: F401
from primal_compiler.errors import InputError
from primal_compiler.passmgr import REGISTRY, parse_pipeline, print_pipeline, resolve_pipeline
from primal_compiler.resources import bundled


def test_all_passes_registered():
    assert {"lower-tiles", "blocking", "row-major-order", "snake-order", "spiral-order", "zigzag-order",
            "zcurve-order", "hilbert-order", "ga-placement", "exact-placement"} <= set(REGISTRY)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 10**6), st.integers(4, 500), st.floats(0, 100, allow_nan=False), st.booleans(),
       st.sampled_from(["median", "port"]))
def test_print_parse_round_trip(seed, pop, budget, progress, hubs):
    text = (f"lower-tiles,blocking{{context=512}},zcurve-order{{hubs={hubs}}},"
            f"ga-placement{{seed={seed},population={pop},time_limit_s={budget},progress={str(progress).lower()}}}")
    passes = parse_pipeline(text)
    assert parse_pipeline(print_pipeline(passes)) == passes


def test_defaults_are_not_printed():
    assert print_pipeline(parse_pipeline("blocking{context=2048},ga-placement{seed=0}")) == "blocking,ga-placement"


@pytest.mark.parametrize("name", ["default", "fast", "thorough"])
def test_bundled_pipelines_load(name):
    assert name in bundled("passes")
    assert resolve_pipeline(name)[0].name == "lower-tiles"


@pytest.mark.parametrize("text, message", [
    ("lower-tiles,frobnicate", r"pass frobnicate: unknown pass"),
    ("ga-placement{colour=red}", r"pass ga-placement: unknown option 'colour'"),
    ("ga-placement{seed=abc}", r"pass ga-placement: option seed='abc' is not a valid int"),
    ("ga-placement{progress=maybe}", r"option progress='maybe'"),
    ("blocking{context=0}", r"pass blocking: context must be >= 1"),
    ("zcurve-order{hubs=nowhere}", r"pass zcurve-order: hubs must be one of"),
    ("blocking{context", r"unclosed"),
])
def test_bad_pipelines(text, message):
    with pytest.raises(InputError, match=message):
        parse_pipeline(text)


def test_bad_toml_pipeline(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('[[pass]]\nname = "blocking"\ncontext = "long"\n')
    with pytest.raises(InputError, match=r"p\.toml.*context"):
        resolve_pipeline(str(path))
    path.write_text('colour = 1\n')
    with pytest.raises(InputError, match=r"unknown key"):
        resolve_pipeline(str(path))


def test_records_replay_the_pipeline(tiny_model, small_target):
    from primal_compiler.api import compile_model

    prog = compile_model(tiny_model, small_target, "lower-tiles{lora_bits=4},blocking,snake-order", verify=True)
    assert [r.name for r in prog.records] == ["lower-tiles", "blocking", "snake-order"]
    replay = ",".join(r.spec for r in prog.records)
    assert replay == "lower-tiles{lora_bits=4},blocking,snake-order"
    assert {"tiles", "blocked", "placed"} <= prog.facts
