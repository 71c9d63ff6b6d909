"""A sweep killed half way (SIGKILL, no cleanup) resumes: no point lost, none run twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from primal_compiler.sweep import ResultStore, load_spec, run_sweep
from tests.sweep.helpers import write_spec

SPEC = """
[sweep]
model = "tiny-llama"
lora = "q,v:8"
metrics = ["tokens_per_s", "power_w"]

[axes]
context = [32, 64, 96, 128, 160, 192]
batch = [1, 2, 3, 4]
"""


def test_killed_sweep_resumes_without_loss_or_repeat(tmp_path):
    spec_path = write_spec(tmp_path, SPEC)
    out = tmp_path / "results"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "primal_compiler.sweep", str(spec_path), "-o", str(out),
                             "--workers", "1", "--no-progress", "--flush-every", "0"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    store = ResultStore(out)
    deadline = time.monotonic() + 60
    try:
        while len(store.parts()) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its pool worker, mid-point
        proc.wait()
    before = store.read().to_pylist()
    assert 3 <= len(before) < 24, "the sweep should have been killed half way"
    first_run = {r["run_id"] for r in before}
    assert len(first_run) == 1

    result = run_sweep(load_spec(spec_path), out, workers=2, progress=False)
    assert result.skipped == len(before) and result.ran == 24 - len(before) and result.complete
    after = store.read().to_pylist()
    ids = [r["point_id"] for r in after]
    assert len(ids) == 24 and len(set(ids)) == 24  # none lost, none twice
    assert {r["point_id"] for r in after if r["run_id"] in first_run} == {r["point_id"] for r in before}
    assert sum(r["run_id"] == result.run_id for r in after) == result.ran
    assert all(r["error"] is None for r in after)
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary files left behind
