"""``primal thermal``: the report of a compiled program, its JSON, and one-line errors."""

from __future__ import annotations

import json

import pytest

from primal_compiler.cli import main


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    path = tmp_path_factory.mktemp("thermal") / "tiny"
    assert main(["compile", "tiny-llama", "--lora", "q,v:8", "-p", "fast", "-o", str(path)]) == 0
    return path


def test_thermal_prints_the_report(out, capsys):
    capsys.readouterr()
    assert main(["thermal", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("thermal: decode power sustained") and "ambient 45 degC" in text


def test_thermal_json_with_another_ambient(out, capsys):
    capsys.readouterr()
    assert main(["thermal", str(out), "--phase", "prefill", "--ambient-c", "85", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["phase"] == "prefill" and rep["ambient_c"] == 85.0 and rep["die_c"]["min"] > 85.0
    assert len(rep["per_ct"]["die_c"]) == rep["num_cts"] and rep["program"].endswith("program.primal")


def test_thermal_limit_prints_the_policy(out, capsys):
    capsys.readouterr()
    assert main(["thermal", str(out), "--limit-c", "100", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["policy"]["met"] and rep["policy"]["throughput_cost"] == 0.0
    assert main(["thermal", str(out), "--limit-c", "100"]) == 0
    assert "thermal policy: hottest die at most 100 degC" in capsys.readouterr().out


def test_thermal_reads_the_runs_report_and_refuses_another_programs(tmp_path, capsys):
    """``run -o OUT`` saves report.json: thermal gives the run's decode power beside its own dies' and finds they
    add up (the generation the program plans, 64 tokens from 3 replayed steps); with --ambient-c it does not
    compare; another program's report.json is refused in one line naming it."""
    import shutil

    out, other = tmp_path / "out", tmp_path / "other"
    assert main(["run", "tiny-llama", "--lora", "q,v:8", "-p", "fast", "-o", str(out)]) == 0
    assert main(["run", "tiny-llama", "--lora", "q:4", "-p", "fast", "-o", str(other)]) == 0
    capsys.readouterr()
    assert main(["thermal", str(out), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    saved = json.loads((out / "report.json").read_text())
    assert rep["run"] == {"report": str(out / "report.json"), "power_w": saved["metrics"]["power_w"],
                          "compared": True, "agrees": True}
    assert rep["power_w"] + rep["offdie_w"] == pytest.approx(saved["metrics"]["power_w"], rel=1e-9)
    assert main(["thermal", str(out), "--ambient-c", "80"]) == 0
    assert "not compared: another target, control, ambient or generation" in capsys.readouterr().out
    saved["metrics"].pop("power_w")
    (out / "report.json").write_text(json.dumps(saved))
    assert main(["thermal", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a run report: its metrics need numbers power_w" in err
    shutil.copy(other / "report.json", out / "report.json")
    assert main(["thermal", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(out / "report.json") in err and "made from another program" in err


@pytest.mark.parametrize("args, message", [
    (["thermal", "{out}/nope"], "primal: {out}/nope: no such program file"),
    (["thermal", "{out}", "--ambient-c", "200"], "primal: thermal: argument --ambient-c:"),
    (["thermal", "{out}", "--phase", "idle"], "primal: thermal: argument --phase:"),
    (["thermal", "{out}", "--limit-c", "-50"], "primal: thermal: argument --limit-c:"),
])
def test_thermal_errors_end_in_one_line_and_exit_2(out, capsys, args, message):
    """An InputError and an argparse refusal are each one line."""
    capsys.readouterr()
    try:
        code = main([a.format(out=out) for a in args])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message.format(out=out)) and "Traceback" not in err[0]
