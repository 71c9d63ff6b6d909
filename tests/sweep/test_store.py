"""Damaged results directories and directories that are not ours: one line, never a traceback, nothing of a user's lost.

The sweeps here run a stand-in task (a row without compiling) on a thread pool:
what is tested is the results directory.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from primal_compiler.cli import main as cli_main
from primal_compiler.errors import InputError
from primal_compiler.sweep import ResultStore, load_spec, run_sweep
from primal_compiler.sweep.point import row
from primal_compiler.sweep.store import DAMAGED, FORMAT, MANIFEST
from tests.sweep.helpers import write_spec

SPEC = """
[sweep]
model = "tiny-llama"
metrics = ["tokens_per_s", "power_w"]

[axes]
batch = [1, 2, 3, 4]
context = [32, 64]
"""


def fake(point):
    return row(point, {"tokens_per_s": float(point.batch), "power_w": 1.0}, "hash", None, 0.0)


def sweep(spec, out, **kw):
    with ThreadPoolExecutor(1) as ex:
        return run_sweep(spec, out, ex, slots=1, progress=False, task=fake, flush_s=0, **kw)


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` and its bytes (None for a directory or FIFO)."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.fixture
def half_done(tmp_path):
    """A spec of 8 points and a results directory holding 4 of them in several parts."""
    spec = load_spec(write_spec(tmp_path, SPEC))
    out = tmp_path / "results"
    sweep(spec, out, limit=4)
    assert len(ResultStore(out).parts()) >= 2
    return spec, out


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _empty(p: Path) -> None:
    p.write_bytes(b"")


def _foreign(p: Path) -> None:
    pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), p)


def _wrong_type(p: Path) -> None:  # an axis column of another type than the sweep's
    pq.write_table(pa.table({"point_id": ["x"], "batch": ["one"]}), p)


@pytest.mark.parametrize("damage, reason", [
    (_truncate, "Parquet magic bytes not found"),
    (_empty, "Parquet file size is 0 bytes"),
    (_foreign, "no point_id column"),
    (_wrong_type, "column batch is string, not int64"),
])
def test_a_damaged_part_is_set_aside_and_its_points_rerun(half_done, capsys, damage, reason):
    spec, out = half_done
    (out / "notes.txt").write_text("mine")
    bad = ResultStore(out).parts()[0]
    lost = pq.read_table(bad).num_rows
    damage(bad)
    damaged = bad.read_bytes()
    with pytest.raises(InputError, match=rf"^{out}"):  # read alone refuses in one line, never a traceback
        ResultStore(out).read()
    result = sweep(spec, out)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"primal: warning: {bad}: damaged results part (")
    assert reason in err and f"moved to {out / DAMAGED / bad.name}, its points run again" in err
    assert (result.skipped, result.ran) == (4 - lost, 4 + lost) and result.complete
    rows = ResultStore(out).read().to_pylist()
    assert len(rows) == 8 and len({r["point_id"] for r in rows}) == 8
    assert (out / DAMAGED / bad.name).read_bytes() == damaged  # moved aside, not deleted
    assert (out / "notes.txt").read_text() == "mine"
    sweep(spec, out)
    assert capsys.readouterr().err == ""  # the set-aside part is never read again


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_part_that_is_not_a_file_is_never_opened(half_done, capsys, kind):
    spec, out = half_done
    odd = out / "part-000099-ffff.parquet"
    os.mkfifo(odd) if kind == "fifo" else odd.mkdir()
    result = sweep(spec, out)  # opening the FIFO would block forever
    assert result.skipped == 4 and result.complete
    assert "part-000099-ffff.parquet: damaged results part (not a regular file)" in capsys.readouterr().err
    assert not odd.exists() and (out / DAMAGED / odd.name).exists()


def _manifest(text: str):
    def write(path: Path) -> None:
        path.write_text(text)
    return write


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _missing(path: Path) -> None:
    path.unlink()


@pytest.mark.parametrize("damage, message", [
    (_manifest("{"), "damaged sweep manifest (not JSON: Expecting property name"),
    (_manifest("[1, 2]"), f"not a {FORMAT} manifest"),
    (_manifest('{"format": "someone-elses"}'), f"not a {FORMAT} manifest"),
    (_manifest(json.dumps({"format": FORMAT, "version": 1, "metrics": 5})), "metrics is not a list of names"),
    (_manifest(json.dumps({"format": FORMAT, "version": 9, "metrics": []})), "results format version 9"),
    (_fifo, "is a FIFO, not a regular sweep manifest"),
    (_missing, "missing: the directory holds result parts but no manifest"),
])
def test_a_bad_manifest_refuses_in_one_line_and_changes_nothing(half_done, tmp_path, capsys, damage, message):
    _, out = half_done
    damage(out / MANIFEST)
    before = snapshot(out)
    code = cli_main(["sweep", str(tmp_path / "spec.toml"), "-o", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"primal: {out / MANIFEST}: ") and message in err and err.count("\n") == 1
    assert snapshot(out) == before


def test_a_users_directory_is_never_touched(tmp_path, capsys):
    spec = write_spec(tmp_path, SPEC)
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    (mine / "sub" / "data.parquet").write_bytes(b"not yours")
    before = snapshot(mine)
    assert cli_main(["sweep", str(spec), "-o", str(mine), "--no-progress"]) == 2
    assert capsys.readouterr().err == (f"primal: {mine}: is a non-empty directory that is not a sweep's results; "
                                       "choose another -o\n")
    (tmp_path / "file.txt").write_text("mine too")
    assert cli_main(["sweep", str(spec), "-o", str(tmp_path / "file.txt"), "--no-progress"]) == 2
    assert capsys.readouterr().err == f"primal: {tmp_path / 'file.txt'}: exists and is not a results directory\n"
    assert cli_main(["sweep", str(spec), "-o", "", "--no-progress"]) == 2
    assert capsys.readouterr().err == "primal: '': empty path where a results directory was expected\n"
    assert snapshot(mine) == before and (tmp_path / "file.txt").read_text() == "mine too"


def test_results_an_earlier_version_wrote_resume_from_their_sweep_json(half_done):
    """Before the manifest was named _sweep.json (so pyarrow and pandas skip it when they read the directory) it
    was sweep.json: such a directory still resumes, its manifest read where it is and never renamed."""
    spec, out = half_done
    (out / MANIFEST).rename(out / "sweep.json")
    sweep(spec, out)
    assert len(ResultStore(out).read()) == 8 and (out / "sweep.json").exists() and not (out / MANIFEST).exists()
