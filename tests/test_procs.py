"""Pool workers never outlive their parent; a signal ends a sweep or a GA compile in one line, at once.

Every test runs the parent in its own session (``start_new_session``), so the
processes left behind are exactly the live members of that session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from primal_compiler.procs import WorkerPool
from primal_compiler.sweep import ResultStore, load_spec, run_sweep
from tests.sweep.helpers import write_spec

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc to find processes")

POOL = textwrap.dedent("""
    import multiprocessing, os, sys, time
    from primal_compiler import procs


    def pid(_):
        time.sleep(0.05)
        return os.getpid()


    def nap(_):
        time.sleep(60)


    if __name__ == "__main__":
        method, death_signal = sys.argv[1], sys.argv[2] == "on"
        if not death_signal:  # only the watchdog is left (as where prctl is unavailable)
            procs._set_parent_death_signal = lambda: None
        pool = procs.WorkerPool(2, mp_context=multiprocessing.get_context(method))
        pids = set()
        while len(pids) < 2:
            pids |= set(pool.map(pid, range(8)))
        for _ in range(2):
            pool.submit(nap, 0)
        print(*sorted(pids), flush=True)
        time.sleep(60)
""")


def session_members(sid: int) -> set[int]:
    """Live (not zombie) processes of session ``sid``."""
    return {pid for pid, (state, _, session) in _processes().items() if state != "Z" and session == sid}


def pool_workers(parent: int) -> set[int]:
    """Live children of ``parent`` other than multiprocessing's resource tracker."""
    out = set()
    for pid, (state, ppid, _) in _processes().items():
        if state != "Z" and ppid == parent:
            try:
                if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                    out.add(pid)
            except OSError:
                pass
    return out


def _processes() -> dict[int, tuple[str, int, int]]:
    """pid -> (state, parent pid, session id) of every process."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[int(d.name)] = (fields[0], int(fields[1]), int(fields[3]))
    return out


def wait_gone(sid: int, timeout: float) -> set[int]:
    deadline = time.monotonic() + timeout
    while (alive := session_members(sid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def start(argv: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"), **kw)


@pytest.mark.parametrize("method, death_signal, sig", [
    ("fork", "on", signal.SIGKILL),
    ("fork", "on", signal.SIGTERM),
    ("fork", "off", signal.SIGKILL),  # the parent-alive watchdog alone
    ("spawn", "on", signal.SIGKILL),
])
def test_workers_die_with_their_parent(tmp_path, method, death_signal, sig):
    script = tmp_path / "pool.py"
    script.write_text(POOL)
    proc = start([sys.executable, str(script), method, death_signal])
    try:
        workers = {int(p) for p in proc.stdout.readline().split()}
        assert len(workers) == 2 and workers == pool_workers(proc.pid)
        os.kill(proc.pid, sig)  # the parent only, as the OOM killer or `kill PID` would
        proc.wait(timeout=5)
        assert not wait_gone(proc.pid, timeout=3.0), "pool workers outlived their parent"
    finally:
        cleanup(proc)


def test_workers_ignore_sigint_and_print_nothing(capfd):
    with WorkerPool(1) as pool:
        pid = pool.submit(os.getpid).result()
        os.kill(pid, signal.SIGINT)  # as Ctrl-C sends it to every process of the terminal's group
        time.sleep(0.2)
        assert pool.submit(os.getpid).result() == pid
    assert "Traceback" not in capfd.readouterr().err


def cleanup(proc: subprocess.Popen) -> None:
    for pid in session_members(proc.pid):
        os.kill(pid, signal.SIGKILL)
    proc.kill()
    proc.communicate()


SWEEP = """
[sweep]
model = "tiny-llama"
lora = "q,v:8"
metrics = ["tokens_per_s"]

[[grid]]
name = "quick"
context = [32, 64, 96, 128]

[[grid]]
name = "slow"  # a GA of ~40 s per point: an interrupt must not wait for it
pipeline = ["lower-tiles,blocking,zcurve-order,ga-placement{generations=10000,executor=serial},kv-ring,codegen"]
context = [32, 64]
"""


def test_sigint_during_a_sweep_is_one_line_and_leaves_it_resumable(tmp_path):
    spec = write_spec(tmp_path, SWEEP)
    out = tmp_path / "results"
    proc = start([sys.executable, "-m", "primal_compiler.sweep", str(spec), "-o", str(out), "--workers", "2",
                  "--no-progress", "--flush-every", "0"])
    store = ResultStore(out)
    try:
        deadline = time.monotonic() + 30
        while len(store.done()) < 4 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # both workers are now inside a slow point
        assert proc.poll() is None and len(pool_workers(proc.pid)) == 2
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole process group
        start_s = time.monotonic()
        _, err = proc.communicate(timeout=10)
        assert time.monotonic() - start_s < 5.0, "the interrupt waited for the running points (~40 s each)"
        assert proc.returncode == 130 and err == "primal: interrupted\n"
        assert not wait_gone(proc.pid, timeout=3.0)
    finally:
        cleanup(proc)
    rows = store.read().to_pylist()
    assert sorted(r["context"] for r in rows) == [32, 64, 96, 128] and {r["grid"] for r in rows} == {"quick"}
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    quick = load_spec(spec)
    quick = quick.__class__(**{**quick.__dict__, "grids": quick.grids[:1]})
    assert run_sweep(quick, out, workers=1, progress=False).skipped == 4  # resumes: nothing to redo


@pytest.mark.parametrize("sig, group, code, last_line", [
    (signal.SIGINT, True, 130, "primal: interrupted\n"),  # Ctrl-C: the terminal signals the whole group
    (signal.SIGTERM, False, 143, "primal: terminated\n"),
    (signal.SIGKILL, False, -signal.SIGKILL, ""),
])
def test_a_signal_during_ga_placement_ends_it_at_once_without_orphans(tmp_path, sig, group, code, last_line):
    proc = start([sys.executable, "-m", "primal_compiler.cli", "compile", "tiny-llama", "-o", str(tmp_path / "out"),
                  "-p", "lower-tiles,blocking,ga-placement{generations=10000,workers=2},kv-ring,codegen"])
    try:
        deadline = time.monotonic() + 30
        while len(pool_workers(proc.pid)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(pool_workers(proc.pid)) == 2, "the GA pool did not start"
        time.sleep(0.3)
        os.killpg(proc.pid, sig) if group else os.kill(proc.pid, sig)
        start_s = time.monotonic()
        _, err = proc.communicate(timeout=10)
        assert time.monotonic() - start_s < 5.0, "the signal waited for the GA (~40 s)"
        assert proc.returncode == code and err.endswith(last_line) and "Traceback" not in err
        assert not wait_gone(proc.pid, timeout=3.0)
    finally:
        cleanup(proc)



BLAS = textwrap.dedent("""
    import multiprocessing, sys
    from primal_compiler import procs


    def blas_threads(_):
        import numpy  # noqa: F401  (a task's work loads numpy's BLAS, if nothing did before)
        from threadpoolctl import threadpool_info
        return max((p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"), default=1)


    if __name__ == "__main__":
        method, workers, preload = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "numpy"
        if preload:  # the parent's BLAS is loaded before the workers start (forked workers inherit it)
            import numpy  # noqa: F401
        with procs.WorkerPool(workers, mp_context=multiprocessing.get_context(method)) as pool:
            print(sorted(set(pool.map(blas_threads, range(2 * workers)))))
""")


def _workers_blas_threads(tmp_path: Path, method: str, workers: int, preload: str, **env: str) -> list[int]:
    script = tmp_path / "blas.py"
    script.write_text(BLAS)
    out = subprocess.run([sys.executable, str(script), method, str(workers), preload], capture_output=True, text=True,
                         env={**os.environ, **env}, cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert out.returncode == 0, out.stderr
    return eval(out.stdout)  # a printed list of ints


@pytest.mark.parametrize("method, preload", [("fork", "numpy"), ("fork", "-"), ("spawn", "-")])
def test_workers_blas_shares_the_cores_under_every_start_method(tmp_path, method, preload):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    assert _workers_blas_threads(tmp_path, method, cores, preload) == [1]  # one worker per core: one thread each


def test_a_users_lower_blas_setting_is_kept(tmp_path):
    assert _workers_blas_threads(tmp_path, "fork", 1, "numpy", OPENBLAS_NUM_THREADS="1") == [1]
