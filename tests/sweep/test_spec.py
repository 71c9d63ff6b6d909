"""Spec validation (one-line errors before anything runs), expansion and stable point ids."""

from __future__ import annotations

import os
import time

import pytest

from primal_compiler.errors import InputError
from primal_compiler.sweep import load_spec, spec_from_dict

BASE = {"sweep": {"model": "tiny-llama", "context": 64}}


def spec(axes, sweep=None):
    return spec_from_dict({"sweep": {**BASE["sweep"], **(sweep or {})}, "axes": axes}, "s.toml")


@pytest.mark.parametrize("axes, sweep, message", [
    ({"rram.nonsense": [1]}, None, "rram.nonsense: unknown key"),
    ({"nonsense": [1]}, None, "axes.nonsense: unknown axis key"),
    ({"rram.adc_bits": [5, "6"]}, None, "axes.rram.adc_bits[1]: rram.adc_bits: expected an integer, got string"),
    ({"rram.adc_bits": []}, None, "axes.rram.adc_bits: empty axis"),
    ({"batch": []}, None, "axes.batch: empty axis"),
    ({"batch": [1, "two"]}, None, "axes.batch[1]: expected a positive integer"),
    ({"batch": [1, True]}, None, "axes.batch[1]: expected a positive integer"),
    ({"batch": 4}, None, "axes.batch: expected an array"),
    ({"seed": [-1]}, None, "axes.seed[0]: expected a non-negative integer, got -1"),
    ({"model": ["  "]}, None, "axes.model[0]: expected a non-empty string, got '  '"),
    ({"batch": [1]}, {"metrics": []}, "sweep.metrics: expected a non-empty array of metric names, got []"),
    ({"batch": [1]}, {"metrics": ["power_w", 3]}, "sweep.metrics: expected a non-empty array of metric names"),
    ({"batch": [1]}, {"validate": 1}, "sweep.validate: expected a boolean, got 1"),
    ({"batch": [1]}, {"ga_executor": "threads"}, "sweep.ga_executor: must be one of serial, pipeline, sweep, got 'threads'"),
    ({"srpg.gating": [True, "perhaps"]}, None, "axes.srpg.gating[1]: option gating='perhaps' is not a valid bool"),
    ({"srpg.nonsense": [1]}, None, "axes.srpg.nonsense[0]: unknown option 'nonsense'"),
    ({"ga-placement.seed": [1]}, None, "has no ga-placement pass"),
    ({"model": ["tiny-llama", "no-such-model"]}, None, "model 'no-such-model'"),
    ({"lora": ["q,v:eight"]}, None, "lora 'q,v:eight'"),
    ({"batch": [1]}, {"metrics": ["tokens_per_fortnight"]}, "unknown metric 'tokens_per_fortnight'"),
    ({"batch": [1]}, {"colour": "red"}, "sweep.colour: unknown key"),
    ({"batch": [1]}, {"target": "no-such-target"}, "unknown target 'no-such-target'"),
    ({"batch": [1, 1]}, None, "axes.batch: repeated value"),
    ({"seed": [1]}, None, "has no pass with a seed option"),
    ({"srpg.gating": [[True]]}, None, "axes.srpg.gating[0]: option gating=[True] is not a scalar"),
    ({"context": [64, 48]}, None,
     "grid 'axes': point context=48: pass kv-ring: context 48 is not a multiple of chunk_tokens 32"),
    ({"model": ["tiny-llama", "gpt2"]}, {"lora": "q,v:8"}, "model 'gpt2' with lora 'q,v:8': --lora: model gpt2"),
])
def test_bad_input_is_one_line_naming_the_spec(axes, sweep, message):
    with pytest.raises(InputError) as err:
        spec(axes, sweep)
    text = str(err.value)
    assert text.startswith("s.toml: ") and message in text and "\n" not in text


def test_file_errors(tmp_path):
    with pytest.raises(InputError, match="no such sweep spec"):
        load_spec(tmp_path / "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[axes\n")
    with pytest.raises(InputError, match="invalid TOML"):
        load_spec(bad)
    empty = tmp_path / "empty.toml"
    empty.write_text("[sweep]\n")
    with pytest.raises(InputError, match="no axes"):
        load_spec(empty)


@pytest.mark.parametrize("kind, message", [
    ("fifo", "is a FIFO, not a regular sweep spec"),
    ("device", "is a device or socket, not a regular sweep spec"),
    ("latin1", "is not UTF-8 text (byte 24: b'\\xe9')"),
    ("directory", "is a directory, not a sweep spec"),
])
def test_spec_file_that_is_not_text_is_refused_without_reading_it(tmp_path, kind, message):
    path = tmp_path / "s.toml"
    if kind == "fifo":
        os.mkfifo(path)  # opening it would block: it must never be opened
    elif kind == "device":
        path = "/dev/zero"
    elif kind == "latin1":
        path.write_bytes("[axes]\nbatch = [1]\n# caf\u00e9\n".encode("latin-1"))
    else:
        path.mkdir()
    with pytest.raises(InputError) as err:
        load_spec(path)
    assert str(err.value) == f"{path}: {message}"


def test_astronomical_spec_is_refused_before_expansion(tmp_path):
    values = "[" + ", ".join(str(v) for v in range(1, 1001)) + "]"
    text = "[axes]\nbatch = " + values + "\n" + "".join(f'"srpg.k{i}" = {values}\n' for i in range(9))
    (tmp_path / "huge.toml").write_text(text)
    start = time.perf_counter()
    with pytest.raises(InputError) as err:
        load_spec(tmp_path / "huge.toml")
    assert time.perf_counter() - start < 2.0
    assert str(err.value) == (f"{tmp_path / 'huge.toml'}: about 10^30 points (grid 'axes': 1000 x 1000 x 1000 x "
                              "1000 x 1000 x 1000 x 1000 x 1000 x 1000 x 1000 values), more than the limit of "
                              "100,000; raise it with --max-points N to run them anyway")


def test_max_points_counts_every_grid_and_can_be_raised():
    raw = {"sweep": BASE["sweep"], "grid": [{"batch": [1, 2, 3]}, {"srpg.gating": [True, False]}]}
    with pytest.raises(InputError, match=r"^s.toml: 5 points \(grid 'grid0': 3 values\), more than the limit of 4;"):
        spec_from_dict(raw, "s.toml", max_points=4)
    assert len(spec_from_dict(raw, "s.toml", max_points=5).points()) == 4  # batch=1 with gating on is in both
    with pytest.raises(InputError, match="^--max-points: must be a positive integer, got 0$"):
        spec_from_dict(raw, "s.toml", max_points=0)


def test_expansion_resolves_every_axis_column():
    s = spec({"batch": [1, 2], "rram.adc_bits": [4, 5], "srpg.gating": [True, False]})
    points = s.points()
    assert len(points) == 8 and len({p.point_id for p in points}) == 8
    p = points[-1]  # last axis fastest
    axes = dict(p.axes)
    assert axes["batch"] == 2 and axes["rram.adc_bits"] == 5 and axes["srpg.gating"] is False
    assert p.overrides == (("rram.adc_bits", 5),)
    assert "kv-ring{context=64,batch=2}" in p.pipeline and "srpg{gating=false}" in p.pipeline


def test_point_id_depends_on_configuration_only():
    a = spec({"batch": [1, 2], "rram.adc_bits": [4, 6]}).points()
    b = spec({"rram.adc_bits": [6, 4], "batch": [2, 1]}).points()
    assert {p.point_id for p in a} == {p.point_id for p in b}
    # a value equal to the default is the same configuration as not sweeping it
    c = spec({"batch": [1]}).points()
    d = spec({"context": [64]}).points()
    e = spec({"rram.leakage_uw": [0.24]}).points()  # the target's own value
    f = spec({"srpg.gating": [True]}).points()  # the pass's own value
    assert c[0].point_id == d[0].point_id == e[0].point_id == f[0].point_id
    assert dict(e[0].axes)["rram.leakage_uw"] == 0.24 and e[0].overrides == ()


def test_grids_union_and_unswept_columns_show_their_value():
    s = spec_from_dict({"sweep": BASE["sweep"], "grid": [
        {"name": "g1", "batch": [1, 2]},
        {"name": "g2", "srpg.gating": [True, False]},
    ]}, "s.toml")
    points = s.points()
    assert len(points) == 3  # batch=1 with gating=true is in both grids: runs once, under g1
    assert [p.grid for p in points] == ["g1", "g1", "g2"]
    assert dict(points[0].axes)["srpg.gating"] is True  # the pipeline's own value
    assert dict(points[2].axes)["batch"] == 1


def test_seed_axis_sets_every_seeded_pass():
    s = spec({"seed": [3]}, {"pipeline": "lower-tiles,blocking,zcurve-order,ga-placement,kv-ring,codegen,srpg"})
    assert "ga-placement{seed=3}" in s.points()[0].pipeline


def test_large_grid_expands_to_distinct_points():
    s = spec({"batch": list(range(1, 11)), "context": [32 * i for i in range(1, 11)], "srpg.gating": [True, False]})
    points = s.points()
    assert len(points) == 200 and len({p.point_id for p in points}) == 200
