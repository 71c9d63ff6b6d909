"""Local process-pool sweeps: rows, failures as rows, resume without recomputation, the store."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import pytest

from primal_compiler.errors import InputError
from primal_compiler.sweep import ResultStore, load_spec, run_sweep
from primal_compiler.sweep.point import run_point
from tests.sweep.helpers import stable_rows


def test_sweep_rows_failures_and_resume(tiny_spec, tmp_path):
    spec = load_spec(tiny_spec)
    out = tmp_path / "results"
    first = run_sweep(spec, out, workers=2, progress=False, limit=2)
    assert (first.total, first.skipped, first.ran) == (6, 0, 2)
    second = run_sweep(spec, out, workers=2, progress=False)
    assert (second.skipped, second.ran) == (2, 4) and second.complete
    table = ResultStore(out).read()
    rows = table.to_pylist()
    assert len(rows) == 6 and len({r["point_id"] for r in rows}) == 6
    # none ran twice: each run wrote exactly the points it reported
    runs = [r["run_id"] for r in rows]
    assert runs.count(first.run_id) == 2 and runs.count(second.run_id) == 4
    # the batch that does not fit is an error row; the sweep went on
    bad = [r for r in rows if r["batch"] == 1024]
    assert len(bad) == 2 and second.failed + first.failed == 2
    assert all("InputError: kv-ring" in r["error"] and r["tokens_per_s"] is None for r in bad)
    good = [r for r in rows if r["error"] is None]
    assert all(r["tokens_per_s"] > 0 and len(r["program_hash"]) == 64 for r in good)
    assert all(r["power_breakdown_w.static"] > 0 and r["h100.tokens_per_j"] > 0 for r in good)
    assert table.schema.field("tokens_per_s").type == "double"
    assert table.schema.field("srpg.gating").type == "bool" and table.schema.field("batch").type == "int64"
    # gating changes the program (PG_OFF/PG_ON records); batch changes it too
    assert len({r["program_hash"] for r in good}) == 4
    # finished sweeps are compacted into one part; a third run does nothing
    assert len(ResultStore(out).parts()) == 1
    third = run_sweep(spec, out, workers=1, progress=False)
    assert third.ran == 0 and third.skipped == 6


def test_any_executor_gives_the_same_rows(tiny_spec, tmp_path):
    spec = load_spec(tiny_spec)
    run_sweep(spec, tmp_path / "a", workers=2, progress=False)
    with ThreadPoolExecutor(2) as ex:
        run_sweep(spec, tmp_path / "b", ex, slots=2, progress=False)
    assert stable_rows(ResultStore(tmp_path / "a").read()) == stable_rows(ResultStore(tmp_path / "b").read())


def test_task_failure_is_a_row(tiny_spec, tmp_path):
    def flaky(point):
        if dict(point.axes)["batch"] == 2:
            raise RuntimeError("worker lost")
        return run_point(point)

    with ThreadPoolExecutor(2) as ex:
        res = run_sweep(load_spec(tiny_spec), tmp_path / "r", ex, slots=2, progress=False, task=flaky)
    rows = ResultStore(tmp_path / "r").read().to_pylist()
    assert res.failed == 4 and len(rows) == 6
    lost = [r for r in rows if r["batch"] == 2]
    assert all(r["error"] == "RuntimeError: worker lost" and math.isnan(r["wall_s"]) for r in lost)


def test_results_directory_guards(tiny_spec, tmp_path):
    spec = load_spec(tiny_spec)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="non-empty directory"):
        run_sweep(spec, other, workers=1, progress=False)
    out = tmp_path / "r"
    run_sweep(spec, out, workers=1, progress=False, limit=1)
    changed = spec.__class__(**{**spec.__dict__, "metrics": ("power_w",)})
    with pytest.raises(InputError, match="write to a new directory"):
        run_sweep(changed, out, workers=1, progress=False)


def test_store_reads_one_row_per_point(tmp_path):
    store = ResultStore(tmp_path / "s")
    store.open({"metrics": ["x"]})
    store.append([{"point_id": "a", "x": 1.0}, {"point_id": "b", "x": 2.0}], {"x": "float"})
    store.append([{"point_id": "a", "x": 9.0}], {"x": "float"})  # as a crash inside compact() could leave
    rows = store.read().to_pylist()
    assert [(r["point_id"], r["x"]) for r in rows] == [("a", 1.0), ("b", 2.0)]
    assert store.done() == {"a", "b"}
    store.compact()
    assert len(store.parts()) == 1 and store.read().num_rows == 2
    assert not [p for p in (tmp_path / "s").iterdir() if p.name.startswith(".")]


def _die_on_batch_2(point):
    """A task whose worker process dies (as on out-of-memory) for the batch-2 points."""
    import os

    if dict(point.axes)["batch"] == 2:
        os._exit(3)
    return run_point(point)


def test_a_point_that_kills_its_worker_is_the_only_failure(tiny_spec, tmp_path):
    res = run_sweep(load_spec(tiny_spec), tmp_path / "r", workers=2, progress=False, task=_die_on_batch_2)
    rows = ResultStore(tmp_path / "r").read().to_pylist()
    assert res.complete and len(rows) == 6
    died = {r["point_id"] for r in rows if (r["error"] or "").startswith("WorkerDied")}
    assert died == {r["point_id"] for r in rows if r["batch"] == 2}
    assert all(r["tokens_per_s"] > 0 for r in rows if r["batch"] == 1)
