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


# --------------------------------------------------------------------------- contracts: stale facts, --verify

FULL = "lower-tiles,blocking,zcurve-order,kv-ring{context=64},codegen,srpg"


@pytest.fixture
def nothing_runs(monkeypatch):
    """Make every pass fail if it runs, so a refusal is shown to come before any pass."""
    from primal_compiler.transforms.lower_tiles import LowerTiles

    def boom(self, program, target):
        raise RuntimeError("a pass ran")

    monkeypatch.setattr(LowerTiles, "run", boom)


def test_invalidation_follows_from_what_each_fact_was_built_on():
    """Every pass invalidates the facts built on what it provides, transitively, and nothing else: a placement
    invalidates the KV map, the stream and the power schedule (and how an earlier placement was found)."""
    from primal_compiler.ir.facts import DEPENDS, Fact, invalidated_by
    from primal_compiler.passmgr import REGISTRY

    assert invalidated_by(frozenset({Fact.PLACED})) == {Fact.SEARCHED, Fact.BOUNDED, Fact.KV, Fact.STREAM,
                                                        Fact.POWER_SCHEDULE}
    assert invalidated_by(frozenset({Fact.STREAM})) == {Fact.POWER_SCHEDULE}
    assert invalidated_by(frozenset({Fact.TILES})) == set(DEPENDS)
    for cls in REGISTRY.values():
        stale = cls.invalidates
        assert not stale & cls.provides and all(DEPENDS[f] & (cls.provides | stale) for f in stale), cls.name
    assert REGISTRY["snake-order"].invalidates >= {Fact.KV} and REGISTRY["srpg"].invalidates == frozenset()


@pytest.mark.parametrize("pipeline, message", [
    (FULL + ",snake-order", r"pass snake-order: invalidates kv, which pass kv-ring provided, and no later pass "
                            r"provides it again, so the program would end with a stale kv \(run kv-ring after "
                            r"snake-order\)"),
    # a placement after kv-ring: the near KV units sat beside the old placement's roots (it had been accepted)
    ("lower-tiles,blocking,zcurve-order,kv-ring{context=64},snake-order,codegen",
     r"pass codegen: requires kv, which pass snake-order invalidated after pass kv-ring provided it \(run kv-ring "
     r"after snake-order\)"),
    ("lower-tiles,blocking,zcurve-order,kv-ring{context=64},blocking,codegen",
     r"pass codegen: requires kv, which pass blocking invalidated after pass kv-ring provided it \(run kv-ring after "
     r"blocking\)"),
    ("lower-tiles,codegen", r"pass codegen: requires kv, placed, which no earlier pass provides \(earlier passes: "
                            r"lower-tiles\)"),
])
def test_stale_or_missing_facts_are_refused_before_any_pass_runs(tiny_model, small_target, nothing_runs, pipeline,
                                                                 message):
    from primal_compiler.api import compile_model

    with pytest.raises(InputError, match=message):
        compile_model(tiny_model, small_target, pipeline, verify=True)


def test_a_pass_drops_the_facts_it_invalidates_and_a_rerun_makes_them_fresh(tiny_model, small_target):
    from primal_compiler.api import compile_model

    prog = compile_model(tiny_model, small_target, "lower-tiles,blocking,ga-placement{population=8,generations=2},"
                                                   "zcurve-order,kv-ring{context=64},codegen,srpg")
    assert "searched" not in prog.facts and {"placed", "kv", "stream", "power-schedule"} <= prog.facts
    again = compile_model(tiny_model, small_target, FULL + ",zcurve-order,kv-ring{context=64},codegen,srpg")
    assert (again.stream.records == compile_model(tiny_model, small_target, FULL).stream.records).all()


def test_verify_names_the_pass_whose_output_breaks_a_fact(tiny_model, small_target, monkeypatch):
    from primal_compiler.api import compile_model
    from primal_compiler.transforms.zcurve_order import ZcurveOrder

    real = ZcurveOrder.run

    def clash(self, program, target):  # two tiles on one PE
        out = real(self, program, target)
        pe = out.tiles.pe.copy()
        pe[1] = pe[0]
        ct = out.tiles.ct.copy()
        ct[1] = ct[0]
        return out.evolve(tiles=out.tiles.with_columns(pe=pe, ct=ct))

    monkeypatch.setattr(ZcurveOrder, "run", clash)
    compile_model(tiny_model, small_target, "lower-tiles,blocking,zcurve-order")  # unverified: accepted
    with pytest.raises(InputError, match=r"pass zcurve-order: --verify: placed does not hold: two tiles share a PE "
                                         r"\(passes run: lower-tiles, blocking, zcurve-order\)"):
        compile_model(tiny_model, small_target, "lower-tiles,blocking,zcurve-order", verify=True)


# --------------------------------------------------------------------------- declared ranges


def _options():
    from primal_compiler.passmgr import option_fields

    return [(name, f, kind) for name in sorted(REGISTRY) for f, kind in option_fields(REGISTRY[name])]


def test_every_number_option_declares_a_range_or_choices_holding_its_default():
    for name, f, kind in _options():
        if kind in (int, float) and "choices" not in f.metadata:
            assert "range" in f.metadata, f"{name}.{f.name} has no declared range"
            lo, hi = f.metadata["range"]
            assert lo <= f.default <= hi and isinstance(lo, kind) and isinstance(hi, kind), (name, f.name)
        elif "choices" in f.metadata:
            assert f.default in f.metadata["choices"] and all(isinstance(c, kind) for c in f.metadata["choices"])


def test_passes_lists_every_range_and_choice():
    from primal_compiler.report.inspect import render_passes

    text = render_passes()
    assert "batch = 1  (range 1..1024)" in text and "generations = 30  (range 1..10000)" in text
    assert "hubs = 'median'  (one of median, port)" in text and "executor_override" not in text


@pytest.mark.parametrize("text, message", [
    ("lower-tiles{base_bits=0}", "pass lower-tiles: base_bits must be >= 1 and <= 32, got 0"),
    ("lower-tiles{lm_head_bits=33}", "pass lower-tiles: lm_head_bits must be >= 1 and <= 32, got 33"),
    ("kv-ring{batch=0}", "pass kv-ring: batch must be >= 1 and <= 1024, got 0"),
    ("kv-ring{context=1000000}", "pass kv-ring: context must be >= 1 and <= 131072, got 1000000"),
    ("kv-ring{reserve_bytes=-1}", "pass kv-ring: reserve_bytes must be >= 0 and <= 16777216, got -1"),
    ("ga-placement{generations=1000000000}", "pass ga-placement: generations must be >= 1 and <= 10000"),
    ("ga-placement{generations=0}", "pass ga-placement: generations must be >= 1"),
    ("ga-placement{population=3}", "pass ga-placement: population must be >= 4 and <= 1024, got 3"),
    ("ga-placement{seed=-1}", "pass ga-placement: seed must be >= 0 and <= 4294967295, got -1"),
    ("ga-placement{time_limit_s=nan}", "pass ga-placement: time_limit_s must be >= 0.0 and <= 86400.0, got nan"),
    ("ga-placement{time_limit_s=inf}", "got inf"),
    ("ga-placement{workers=100000}", "pass ga-placement: workers must be >= 0 and <= 1024"),
    ("ga-placement{group_size=3}", "pass ga-placement: group_size must be one of 1, 2, 4, got 3"),
    ("ga-placement{executor=gpu}", "pass ga-placement: executor must be one of process, thread, serial"),
    ("ga-placement{executor_override=x}", "pass ga-placement: unknown option 'executor_override'"),
    ("exact-placement{deterministic_time=-1}", "pass exact-placement: deterministic_time must be >= 0.0"),
    ("lora-sparsity{zero_fraction=1.5}", "pass lora-sparsity: zero_fraction must be >= 0.0 and <= 1.0, got 1.5"),
    ("codegen{steps=0}", "pass codegen: steps must be >= 1 and <= 4096, got 0"),
    ("codegen{prompt=-5}", "pass codegen: prompt must be >= 0"),
    ("codegen{requests=" + ";".join(["0"] * 65) + "}", "pass codegen: requests lists 65 requests; at most 64"),
    ("codegen{requests=70000}", "pass codegen: requests must be adapter ids in 0..65535"),
    ("lower-tiles{base_bits=1e400}", "option base_bits='1e400' is not a valid int"),
    ("lower-tiles{base_bits=4.5}", "option base_bits='4.5' is not a valid int"),
    ("lower-tiles{base_bits=" + "9" * 5000 + "}", "is not a valid int"),
    ("ga-placement{seed=1,seed=2}", "pass ga-placement: option 'seed' given twice"),
    ("blocking{context=64}zcurve-order", "expected ',' after the options of pass 'blocking'"),
    ("", "pipeline: empty pipeline"),
    ("  \t ", "pipeline: empty pipeline"),
    (",", "pipeline: empty pass name"),
])
def test_range_and_syntax_errors_name_the_pass_the_option_and_what_is_allowed(text, message):
    with pytest.raises(InputError) as err:
        parse_pipeline(text)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_passes_built_in_code_are_checked_too():
    from dataclasses import replace

    from primal_compiler.transforms.ga_placement import GaPlacement
    from primal_compiler.transforms.kv_ring import KvRing

    with pytest.raises(InputError, match="pass kv-ring: batch must be >= 1"):
        KvRing(batch=0)
    with pytest.raises(InputError, match="pass kv-ring: batch must be >= 1"):
        replace(KvRing(), batch=0)
    with pytest.raises(InputError, match="pass kv-ring: context 100 is not a multiple of chunk_tokens 32"):
        replace(KvRing(), context=100)
    with pytest.raises(InputError, match=r"option batch=1.0 is not a valid int"):
        KvRing(batch=1.0)
    with pytest.raises(InputError, match=r"option seed='7' is not a valid int"):
        GaPlacement(seed="7")
    with pytest.raises(InputError, match=r"option progress=1 is not a valid bool"):
        GaPlacement(progress=1)
    with pytest.raises(InputError, match=r"option pins=\['q.0.0@0.0'\] is not a valid list of strings"):
        GaPlacement(pins=["q.0.0@0.0"])
    assert GaPlacement(time_limit_s=5).spec() == "ga-placement{time_limit_s=5}"  # an int is a valid float


def test_sweep_examples_and_bundled_pipelines_are_within_range():
    import tomllib
    from pathlib import Path

    from primal_compiler.api import for_workload
    from primal_compiler.passmgr import make_pass
    from primal_compiler.pipeline import Workload

    for name in bundled("passes"):
        resolve_pipeline(name)
    for path in sorted((Path(__file__).resolve().parents[1] / "examples").glob("sweep-*.toml")):
        spec = tomllib.loads(path.read_text(encoding="utf-8"))
        tables = [spec["sweep"], spec.get("axes", {})] + spec.get("grid", [])
        pipeline = spec["sweep"]["pipeline"]
        for table in tables:
            for batch in table.get("batch", [1]) if isinstance(table.get("batch", [1]), list) else [table["batch"]]:
                contexts = table.get("context", [2048])
                for context in contexts if isinstance(contexts, list) else [contexts]:
                    parse_pipeline(for_workload(pipeline, Workload(batch=batch, context=context)))
            for key, values in table.items():
                head, _, opt = key.partition(".")
                if head in REGISTRY:
                    for v in values:
                        make_pass(head, {opt: v})
    # The seed's workloads: Llama-2 context 4096, batch 8, the GA budgets of the docs and tests.
    parse_pipeline("blocking{context=4096},ga-placement{generations=10000,population=500,time_limit_s=0.5},"
                   "kv-ring{context=4096,batch=8},codegen{prompt=4095,steps=4096}")


# --------------------------------------------------------------------------- TOML schema and files


@pytest.mark.parametrize("text, message", [
    ("pass = 5\n", "pass must be an array of tables"),
    ('pass = "lower-tiles"\n', "pass must be an array of tables"),
    ("pass = [1, 2]\n", "pass must be an array of tables"),
    ("description = 3\n[[pass]]\nname = \"blocking\"\n", "description must be a string"),
    ("[[pass]]\ncontext = 5\n", "[[pass]] number 1 needs a name string"),
    ("[[pass]]\nname = 5\n", "[[pass]] number 1 needs a name string"),
    ('[[pass]]\nname = "blocking"\ncontext = [1, 2]\n', "option context=[1, 2] is not a valid int"),
    ('[[pass]]\nname = "blocking"\ncontext = {a = 1}\n', "option context={'a': 1} is not a valid int"),
    ('[[pass]]\nname = "blocking"\ncontext = 1979-05-27\n', "is not a valid int"),
    ('[[pass]]\nname = "blocking"\ncontext = inf\n', "is not a valid int"),
    ('[[pass]]\nname = "blocking"\ncontext = 2048.5\n', "is not a valid int"),
    ('[[pass]]\nname = "blocking"\ncontext = 0\n', "pass blocking: context must be >= 1"),
    ('[[pass]]\nname = "ga-placement"\npins = [[1]]\n', "is not a valid list of strings"),
    ('[[pass]]\nname = "ga-placement"\ntime_limit_s = nan\n', "time_limit_s must be >= 0.0"),
    ('[[pass]]\nname = "srpg"\ngating = "perhaps"\n', "option gating='perhaps' is not a valid bool"),
    ("colour = 1\n", "unknown key(s) colour"),
    ("description = \"x\"\n", "pipeline has no [[pass]] entries"),
    ("pass = = 1\n", "invalid TOML"),
    ("a = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
])
def test_toml_pipeline_schema_errors_are_one_line(tmp_path, text, message):
    path = tmp_path / "p.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as err:
        resolve_pipeline(str(path))
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value) and "\n" not in str(err.value)


def test_pipeline_files_are_read_as_regular_utf8_files(tmp_path, monkeypatch):
    import os


    bad = tmp_path / "bad.toml"
    bad.write_bytes(b'[[pass]]\nname = "\xff"\n')
    with pytest.raises(InputError, match="bad.toml: is not UTF-8 text"):
        resolve_pipeline(str(bad))
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(InputError, match="is a directory"):
        resolve_pipeline(str(tmp_path / "dir.toml"))
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="is a FIFO"):
        resolve_pipeline(str(fifo))  # refused by stat, never opened (which would block)
    with pytest.raises(InputError, match="no such pipeline file"):
        resolve_pipeline(str(tmp_path / "missing.toml"))
    big = tmp_path / "big.toml"
    big.write_text('[[pass]]\nname = "lower-tiles"\n' + "#" * 200 + "\n")
    from primal_compiler import inputs

    monkeypatch.setattr(inputs, "TEXT_LIMIT_BYTES", 100)
    with pytest.raises(InputError, match="a pipeline file may be at most 100 bytes"):
        resolve_pipeline(str(big))


def test_the_manager_refuses_a_gpu_target(tiny_model):
    from primal_compiler.api import compile_model
    from primal_compiler.target import load_target

    with pytest.raises(InputError, match=r"target h100: is a gpu target.*needs a PRIMAL target"):
        compile_model(tiny_model, load_target("h100"), "lower-tiles")
