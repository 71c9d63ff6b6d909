"""A real local Dask cluster (scheduler + 2 worker processes on loopback) runs the same sweep as the pool."""

from __future__ import annotations

import pytest

from primal_compiler.sweep import ResultStore, load_spec, run_sweep
from primal_compiler.sweep.backends import open_backend
from tests.sweep.helpers import stable_rows, write_spec

distributed = pytest.importorskip("distributed")

#: the tiny sweep plus a GA point whose fitness runs on the cluster's executor (ga_executor = "sweep")
SPEC = """
[sweep]
model = "tiny-llama"
lora = "q,v:8"
context = 64
"ct.mesh_rows" = 8
"ct.mesh_cols" = 8
ga_executor = "sweep"
metrics = ["tokens_per_s", "tokens_per_j", "power_w", "weighted_hops", "power_breakdown_w"]

[[grid]]
name = "cheap"
batch = [1, 2, 1024]
"srpg.gating" = [true, false]

[[grid]]
name = "ga"
pipeline = ["lower-tiles,blocking,zcurve-order,ga-placement{generations=3,population=8},kv-ring,codegen,srpg"]
"""


@pytest.fixture(scope="module")
def cluster():
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None, silence_logs=40) as c:
        c.wait_for_workers(2, timeout=60)
        yield c


def test_dask_cluster_equals_process_pool_point_for_point(cluster, tmp_path):
    spec = load_spec(write_spec(tmp_path, SPEC))
    with open_backend(scheduler=cluster.scheduler_address) as backend:
        assert backend.client is not None and backend.slots == 2
        dask = run_sweep(spec, tmp_path / "dask", backend.executor, slots=backend.slots, progress=False)
    pool = run_sweep(spec, tmp_path / "pool", workers=2, progress=False)
    assert dask.ran == pool.ran == 7 and dask.failed == pool.failed == 2
    a, b = ResultStore(tmp_path / "dask").read(), ResultStore(tmp_path / "pool").read()
    assert stable_rows(a) == stable_rows(b)
    workers = {r["worker"] for r in a.to_pylist()}
    assert len(workers) == 2  # both Dask workers ran points
    ga = [r for r in a.to_pylist() if r["grid"] == "ga"]
    assert len(ga) == 1 and ga[0]["error"] is None
    # the GA point's fitness evaluation ran as tasks on the same cluster (ga_executor = "sweep")
    assert "solve" in cluster.scheduler.task_prefixes and "run_point" in cluster.scheduler.task_prefixes


def test_scheduler_file(cluster, tmp_path):
    import json

    f = tmp_path / "scheduler.json"
    f.write_text(json.dumps({"address": cluster.scheduler_address}))
    with open_backend(scheduler_file=str(f), workers=1) as backend:
        assert backend.slots == 1 and "scheduler file" in backend.description
