"""Pipeline and Workload values: text round trips, the options a workload sets, no pass patched by name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import primal_compiler.transforms  # noqa: F401
from primal_compiler.passmgr import REGISTRY
from primal_compiler.pipeline import Pipeline, Workload
from primal_compiler.resources import bundled

ROOT = Path(__file__).resolve().parents[1] / "primal_compiler"


@pytest.mark.parametrize("spec", sorted(bundled("passes")) + [
    "lower-tiles{lora_bits=4},blocking{context=64},ga-placement{seed_curves=snake:zcurve,pins=q.0.0@1.1},"
    "kv-ring{context=64,bank_interleave=word},codegen{requests=0;1;0,steps=3},srpg{gating=false}"])
def test_a_pipeline_prints_text_that_parses_back_to_it(spec):
    p = Pipeline.parse(spec)
    assert Pipeline.parse(str(p)) == p and str(Pipeline.parse(str(p))) == str(p)


def test_a_workload_sets_each_pass_it_concerns_and_nothing_else():
    base = Pipeline.parse("default")
    p = base.for_workload(Workload(batch=4, context=256, prompt=100, steps=8, adapters=2))
    opts = {q.name: q for q in p.passes}
    assert (opts["kv-ring"].batch, opts["kv-ring"].context, opts["blocking"].context) == (4, 256, 256)
    assert (opts["codegen"].prompt, opts["codegen"].steps, opts["codegen"].requests) == (100, 8, "0;1")
    assert [q for q in p.passes if q.name not in ("kv-ring", "blocking", "codegen")] == \
           [q for q in base.passes if q.name not in ("kv-ring", "blocking", "codegen")]
    assert base.for_workload(Workload()) == base
    short = Pipeline.parse("lower-tiles,blocking,zcurve-order,kv-ring,codegen").for_workload(Workload(context=8))
    assert {q.name: q for q in short.passes}["kv-ring"].chunk_tokens == 8  # chunks no longer than the context


def test_the_functional_compile_places_for_the_context_it_replays(small_target):
    from primal_compiler.frontend import load_model
    from primal_compiler.functional import compile_for_replay

    program = compile_for_replay(load_model("tiny-llama"), small_target, 6, 2,
                                 "lower-tiles,blocking,zcurve-order,kv-ring,codegen", context=32)
    specs = {r.name: r.spec for r in program.records}
    assert specs["blocking"] == "blocking{context=32}" and specs["kv-ring"] == "kv-ring{context=32,pass_tokens=6}"


def test_no_module_looks_a_pass_up_by_name():
    names = "|".join(re.escape(n) for n in REGISTRY)
    pattern = re.compile(rf"""\.name\s*(==|!=)\s*["']({names})["']""")
    offenders = [f"{p.relative_to(ROOT)}:{i + 1}" for p in sorted(ROOT.rglob("*.py"))
                 for i, line in enumerate(p.read_text().splitlines()) if pattern.search(line)]
    assert offenders == []
