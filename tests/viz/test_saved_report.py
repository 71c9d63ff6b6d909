"""``primal viz OUT`` reads the run report saved beside the program, and only when it is that program's."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from primal_compiler.cli import main
from primal_compiler.isa.container import program_sha256


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """``primal run tiny-llama -p fast -o OUT``, and a run of another pipeline beside it."""
    base = tmp_path_factory.mktemp("saved")
    assert main(["run", "tiny-llama", "-p", "fast", "-o", str(base / "out")]) == 0
    assert main(["run", "tiny-llama", "-p", "lower-tiles,blocking,snake-order,kv-ring{context=64},codegen",
                 "-o", str(base / "other")]) == 0
    return base


def _copy(ran, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(ran / "out", out)
    return out


def test_the_saved_report_names_its_program(ran):
    saved = json.loads((ran / "out" / "report.json").read_text())
    data = (ran / "out" / "program.primal").read_bytes()
    assert saved["program_sha256"] == program_sha256(ran / "out" / "program.primal") \
        == hashlib.sha256(data[:-32]).hexdigest()


def test_viz_shows_the_saved_report(ran, tmp_path, capsys):
    out = _copy(ran, tmp_path)
    assert main(["viz", str(out), "-o", str(tmp_path / "viz")]) == 0
    page = (tmp_path / "viz" / "report.html").read_text()
    assert "GPU baselines" in page  # the saved run's GPU family, which the replay alone does not price


def test_a_report_of_another_program_is_refused_before_the_replay(ran, tmp_path, capsys):
    out = _copy(ran, tmp_path)
    shutil.copy(ran / "other" / "report.json", out / "report.json")
    assert main(["viz", str(out), "-o", str(tmp_path / "viz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(out / "report.json") in err and "made from another program" in err
    assert not (tmp_path / "viz").exists()


@pytest.mark.parametrize("text, said", [("{not json", "not a run report"), ("[1, 2]", "not a run report")])
def test_an_unreadable_report_is_one_line(ran, tmp_path, capsys, text, said):
    out = _copy(ran, tmp_path)
    (out / "report.json").write_text(text)
    assert main(["viz", str(out), "-o", str(tmp_path / "viz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err and "Traceback" not in err


def test_a_report_naming_no_program_is_set_aside(ran, tmp_path, capsys):
    out = _copy(ran, tmp_path)
    saved = json.loads((out / "report.json").read_text())
    del saved["program_sha256"]
    (out / "report.json").write_text(json.dumps(saved))
    assert main(["viz", str(out), "-o", str(tmp_path / "viz")]) == 0
    assert "names no program" in capsys.readouterr().err
    assert "GPU baselines" not in (tmp_path / "viz" / "report.html").read_text()


def test_the_page_breaks_the_time_down_along_the_critical_path(ran, tmp_path, capsys):
    """Asked for, the critical path is computed on a full replay; kept by ``run --critical-path -o``, it is read
    from the saved report (the replay then comes from the cache); otherwise the page says how to get it."""
    out = _copy(ran, tmp_path)
    assert main(["viz", str(out), "-o", str(tmp_path / "plain")]) == 0
    assert "Not computed" in (tmp_path / "plain" / "report.html").read_text()
    assert main(["viz", str(out), "-o", str(tmp_path / "asked"), "--critical-path"]) == 0
    asked = (tmp_path / "asked" / "report.html").read_text()
    assert "<th>TTFT share (%)</th>" in asked and "Not computed" not in asked and "bound by" in asked
    kept = tmp_path / "kept"
    assert main(["run", "tiny-llama", "-p", "fast", "--critical-path", "-o", str(kept)]) == 0
    saved = json.loads((kept / "report.json").read_text())["metrics"]["critical_path"]
    capsys.readouterr()
    assert main(["viz", str(kept), "-o", str(tmp_path / "from-saved")]) == 0
    page = (tmp_path / "from-saved" / "report.html").read_text()
    assert f"TTFT {saved['ttft']['total_s']:.4g} s" in page and "Not computed" not in page
    assert f"TTFT {saved['ttft']['total_s']:.4g} s" in asked  # the same program: the same path


def test_a_saved_report_of_another_control_mode_is_not_shown(tmp_path, capsys):
    """``run --control central --critical-path -o OUT`` saved a central run; viz replays under the target's own
    (distributed) control, so the page shows neither that critical path nor that text report."""
    out = tmp_path / "central"
    assert main(["run", "tiny-llama", "-p", "fast", "--control", "central", "--critical-path", "-o", str(out)]) == 0
    assert main(["viz", str(out), "-o", str(tmp_path / "viz")]) == 0
    page = (tmp_path / "viz" / "report.html").read_text()
    assert "Not computed" in page and "GPU baselines" not in page
