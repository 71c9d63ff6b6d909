"""Per-template placement cost, bound and gap as `primal map --json` reports them."""

from __future__ import annotations

import pytest

from primal_compiler.mapping.exact import star_bound
from primal_compiler.mapping.hops import template_hops
from primal_compiler.passmgr import PassManager, parse_pipeline
from primal_compiler.report.hops import render_comparison, template_gaps


def test_template_gaps_are_cost_over_bound_minus_one(tiny_blocked, small_target):
    prog = PassManager(parse_pipeline("ga-placement{generations=4,population=8,executor=serial,progress=false}")).run(
        tiny_blocked, small_target)
    rows = template_gaps(prog.layout)
    assert [r["template"] for r in rows] == list(range(len(prog.layout.templates)))
    for r, tp in zip(rows, prog.layout.templates):
        cost = float(template_hops(tp) @ tp.instance.weight)
        bound = star_bound(tp.instance).byte_hops
        assert 0 < bound <= cost + 1e-9  # no placement is below the bound
        assert r["gap"] == pytest.approx(cost / bound - 1, abs=1e-4)
        assert r["gap"] >= 0
        assert r["weighted_bound"] <= r["weighted_hops"]


def test_compare_strategies_reports_gap_per_template(tiny_model, small_target):
    from primal_compiler.report.hops import compare_strategies

    table = compare_strategies(tiny_model, small_target, context=256, generations=2)
    ga = table["ga"]
    assert len(ga["templates"]) >= 1 and ga["gap"] >= 0
    assert ga["max_hops_all_legs"] == max(ga["max_hops"], ga["kv_max_hops"]) and ga["kv_max_hops"] >= 1
    text = render_comparison(table)
    assert "ga per CT template" in text and "gap" in text and f"all legs at most {ga['max_hops_all_legs']}" in text


def test_compare_strategies_says_when_the_kv_cache_does_not_fit(tiny_model, small_target):
    from primal_compiler.report.hops import compare_strategies

    table = compare_strategies(tiny_model, small_target, context=65536, generations=2)
    assert "needs" in table["ga"]["kv_problem"] and "max_hops_all_legs" not in table["ga"]
    assert "no KV placement at this context" in render_comparison(table)


def test_compare_strategies_passes_enforced_rules_to_the_ga(small_target):
    from primal_compiler.frontend.builtin import ArchConfig, build_model
    from primal_compiler.frontend.lora_spec import attach_lora
    from primal_compiler.report.hops import compare_strategies

    model = attach_lora(build_model(ArchConfig("llama", 512, 1, 8, 8, 512, 256, 256), "band-test"), "q,v:8")
    table = compare_strategies(model, small_target, context=256, generations=2, enforce=("columns",))
    bands = [v["holds"] for t in table["ga"]["templates"] for n, v in t["rules"].items() if n.startswith("column")]
    assert len(bands) == 4 and all(bands)
    assert "seed layout rules broken" in render_comparison(table)
