"""The reproduction table: every row replayed, seed values beside ours, every row a prediction."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from primal_compiler.cli import main
from primal_compiler.report.reproduce import SEED, Study, reproduce

TINY = Study(model="tiny-llama", context=64, batch8_context=32, pipeline="lower-tiles,blocking,zcurve-order")


@pytest.fixture(scope="module")
def rows():
    return reproduce(TINY)


def test_rows_pair_ours_with_the_seed(rows):
    assert len(rows) >= 15
    for r in rows:
        assert set(r) == {"metric", "ours", "reading", "seed", "ratio", "note"}
        assert r["reading"] is not None
        if r["seed"] is None:  # the GPU baseline family: the seed has no such figure
            assert "baseline family" in r["note"] and r["ratio"] is None
            continue
        assert r["seed"] in SEED.values()
        assert r["ratio"] == pytest.approx(r["ours"] / r["seed"])


def test_baseline_family_rows_follow_the_default_members(rows):
    fam = [r for r in rows if r["seed"] is None]
    labels = ("vllm:fp16", "trtllm:fp16", "trtllm:fp8", "vllm:w4a16")
    for label in labels:
        assert any(f"throughput PRIMAL/h100 {label}, batch 1" in r["metric"] for r in fam)
        assert any(f"energy efficiency PRIMAL/h100 {label}, batch 1" in r["metric"] for r in fam)
    by = {r["metric"]: r["ours"] for r in fam}
    # W4A16 reads a quarter of the FP16 weights: the GPU is faster, so PRIMAL's ratio is smaller.
    assert by["throughput PRIMAL/h100 vllm:w4a16, batch 1"] < by["throughput PRIMAL/h100 vllm:fp16, batch 1"]


def test_ablations_move_the_way_the_mechanism_says(rows):
    by = {r["metric"]: r["ours"] for r in rows}
    assert 0 < by["SRPG power saved"] < 1
    assert 0 < by["KV storage bandwidth used (decode, bank-interleaved)"] <= 1
    assert 1 <= by["max hops, Z-curve (mapped legs)"] <= 62 and 1 <= by["max hops, naive row-major (mapped legs)"] <= 62
    mixed = next(v for k, v in by.items() if k.startswith("mixed precision"))
    assert mixed > 1


def test_the_reading_rewrites_lora_every_token_so_zero_blocks_and_pipelining_matter(rows):
    """The reading (primal-7nm-seed, codegen{lora_residency=per-token}) moves the rows that follow from
    reprogramming; with the adapters resident, skipping zero blocks gains nothing (no write to skip)."""
    by = {r["metric"]: r for r in rows}
    skip = next(r for k, r in by.items() if k.startswith("zero-LoRA-block skipping"))
    assert skip["ours"] == 0 and skip["reading"] > 0.005
    cut = by["pipelined LoRA reconfiguration: TTFT cut"]
    assert cut["reading"] > cut["ours"]
    share = by["SRAM-DCIM share of power (decode)"]
    assert share["reading"] > 5 * share["ours"]  # every token's writes, and every SRAM macro kept powered
    assert by["ITL PRIMAL (ms)"]["reading"] > by["ITL PRIMAL (ms)"]["ours"]  # central issue, per-token writes


def test_a_study_without_a_reading_has_none(capsys):
    from dataclasses import replace

    rows = reproduce(replace(TINY, reading_target=""))
    assert all(r["reading"] is None for r in rows)


def test_cli_json_rows(capsys):
    args = ["reproduce", "--model", "tiny-llama", "--context", "64", "--batch8-context", "32",
            "-p", "lower-tiles,blocking,zcurve-order", "--json"]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"metric", "ours", "reading", "seed", "ratio", "note"} == set(rows[0])


def test_no_constant_of_the_default_target_is_fitted():
    """The seed's system results are predicted, never inputs: no source comment says a value was fitted."""
    text = (Path(__file__).parents[2] / "targets" / "primal-7nm.toml").read_text(encoding="utf-8")
    fitted = [line for line in text.splitlines() if "#" in line and re.search(r"\b(calibrated|fitted)\b", line.split("#", 1)[1])]
    assert not fitted, fitted


@pytest.fixture(scope="module")
def solved():
    return reproduce(TINY, solve_budget_s=600)


def test_solve_names_a_constant_or_says_why_for_every_row_off_by_a_quarter(solved):
    from primal_compiler.report.solve import OFF, TOLERANCE

    off = [r for r in solved if r["seed"] and abs(r["ratio"] - 1) > OFF]
    assert off and all("solve" in r for r in off)
    assert all("solve" not in r for r in solved if r not in off)
    for r in off:
        s = r["solve"]
        if s["constant"] is None:
            assert s["why"].startswith("no stated-range constant")
            continue
        assert set(s) == {"constant", "value", "range", "plausible", "reached", "evaluations"}
        assert s["plausible"] == (s["range"][0] <= s["value"] <= s["range"][1])
        if s["reached"] != pytest.approx(r["seed"], rel=TOLERANCE):  # an integer key's nearest step
            assert isinstance(s["value"], int), s
    hops = next(r for r in off if r["metric"].startswith("max hops, Z-curve"))
    assert hops["solve"] == {"constant": None, "why": "no stated-range constant moves this row"}


def test_a_solved_value_reproduces_the_seed_when_compiled_for(solved, tmp_path):
    """The solve reprices kept replays; a fresh study on a target holding the solved value replays it all."""
    row = next(r for r in solved if r["metric"] == "SRPG power saved")
    s = row["solve"]
    assert s["constant"] is not None
    table, key = s["constant"].split(".")
    path = tmp_path / "solved.toml"
    path.write_text(f'extends = "primal-7nm"\nname = "solved"\n[{table}]\n{key} = {s["value"]!r}\n'
                    f'{key}_range = [{s["value"]!r}, {s["value"]!r}]\n')
    again = reproduce(Study(model=TINY.model, context=TINY.context, batch8_context=TINY.batch8_context,
                            pipeline=TINY.pipeline, target=str(path)))
    redone = next(r for r in again if r["metric"] == "SRPG power saved")
    assert redone["ours"] == pytest.approx(s["reached"], rel=1e-9)


def test_the_solve_budget_stops_the_search_and_says_so():
    from primal_compiler.errors import InputError
    from primal_compiler.report.solve import solve_rows

    rows = reproduce(TINY, solve_budget_s=1e-9)
    stopped = [r["solve"] for r in rows if "solve" in r]
    assert stopped and all("time budget" in s["why"] for s in stopped if s["constant"] is None)
    with pytest.raises(InputError, match="--solve: the time budget must be positive"):
        solve_rows(rows, None, lambda k, v: rows, 0)


def test_pe_rows_compare_with_the_all_digital_reference(rows):
    from primal_compiler.report.pe import compare
    from primal_compiler.target import load_primal_target

    by = {r["metric"]: r["ours"] for r in rows}
    pe = compare(load_primal_target("primal-7nm"), load_primal_target("digital-7nm"))
    assert by["static power saved vs all-digital PE (active)"] == pytest.approx(pe["static_saving"])
    assert by["compute density vs all-digital (base MACs/s per mm2)"] == pytest.approx(pe["compute_density_ratio"])
    # the whole machine: RRAM periphery gated with its CT, the digital base macros always kept
    assert by["static power saved vs all-digital PE (active)"] < by["static power saved vs all-digital machine (decode)"]
    assert by["static power saved vs all-digital machine (decode)"] < 1


def test_a_reference_that_is_not_all_digital_is_refused(capsys):
    assert main(["reproduce", "--model", "tiny-llama", "--digital", "primal-7nm"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "primal-7nm.toml: not an all-digital reference target" in err
