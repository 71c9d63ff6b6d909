"""numba caching falls back to an uncached compile where nothing can be written (a read-only install)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import numba
import pytest

from primal_compiler import jit

ROOT = Path(__file__).resolve().parents[1]
NOBODY = 65534


def _module(path: Path):
    path.write_text("def triple(x):\n    return 3 * x\n")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_njit_compiles_uncached_where_no_cache_can_be_written(tmp_path, monkeypatch):
    mod = _module(tmp_path / "primal_jit_probe.py")
    # every place numba looks is unusable, as for a read-only install and no writable home: the package's
    # __pycache__ cannot be created (a file holds its name) and the user cache directory is under a file
    (tmp_path / "__pycache__").write_text("")
    (tmp_path / "home").write_text("")
    monkeypatch.setenv("HOME", str(tmp_path / "home" / "user"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home" / "cache"))
    monkeypatch.setattr(numba.config, "CACHE_DIR", "")
    with pytest.raises(RuntimeError, match="cannot cache function 'triple'"):
        numba.njit(cache=True)(mod.triple)  # what the decorators did before
    fn = jit.njit(nogil=True)(mod.triple)
    assert fn(14) == 42 and type(fn._cache).__name__ == "NullCache"


def test_njit_caches_where_it_can(tmp_path):
    fn = jit.njit()(_module(tmp_path / "primal_jit_cached.py").triple)
    assert fn(2) == 6 and type(fn._cache).__name__ == "FunctionCache"
    assert list((tmp_path / "__pycache__").glob("primal_jit_cached.triple-*.nbi"))


@pytest.mark.parametrize("declared", [True, False])
def test_a_change_to_a_declared_dependency_recompiles(tmp_path, declared):
    """``main.total`` calls ``helper.scale``; after ``helper.py`` changes, a new process gets the new result
    from ``total`` only when ``helper`` is declared in ``depends`` (else numba's cache serves the old one)."""
    (tmp_path / "helper.py").write_text("from primal_compiler.jit import njit\n\n@njit()\ndef scale(x):\n"
                                        "    return 2 * x\n")
    deps = "(helper,)" if declared else "()"
    (tmp_path / "main.py").write_text(f"import helper\nfrom primal_compiler.jit import njit\n\n@njit(depends={deps})\n"
                                      "def total(x):\n    return helper.scale(x) + 1\n")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])

    def run() -> str:
        res = subprocess.run([sys.executable, "-c", "import main; print(main.total(20))"], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr[-2000:]
        return res.stdout.strip()

    assert run() == "41"
    (tmp_path / "helper.py").write_text((tmp_path / "helper.py").read_text().replace("2 * x", "30 * x"))
    assert run() == ("601" if declared else "41")


def test_replay_from_a_read_only_install():
    """Replay from a copy of the package that cannot be written to, with no writable home directory.

    As a user without write permission (nobody, if we are root: root writes anywhere), the failure a
    system-wide install meets; where no such user can be had (root without ``setpriv``), each
    ``__pycache__`` name and the home directory are taken by files, so creating them fails the same way
    inside numba. One compile-and-replay, uncached (~45 s of CPU, most of it compiling the link events).
    """
    how = "unprivileged" if os.geteuid() != 0 or shutil.which("setpriv") else "blocked"
    base = Path(tempfile.mkdtemp(prefix="primal-ro-"))  # not under tmp_path: nobody must be able to read it
    prefix: list[str] = []
    try:
        os.chmod(base, 0o755)
        install = base / "site"
        shutil.copytree(ROOT / "primal_compiler", install / "primal_compiler",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for data in ("targets", "passes"):
            shutil.copytree(ROOT / data, install / data)
        env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "XDG_CACHE_HOME", "PYTHONPATH")}
        env |= {"PYTHONPATH": str(install), "PYTHONDONTWRITEBYTECODE": "1"}
        if how == "blocked":
            for d in [p for p in install.rglob("*") if p.is_dir()]:
                (d / "__pycache__").write_text("")
            (base / "home").write_text("")
            env["HOME"] = str(base / "home" / "user")
        else:
            (base / "home").mkdir()
            env["HOME"] = str(base / "home")
            if os.geteuid() == 0:
                prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
            _read_only(base)
        script = (
            "import sys, primal_compiler\n"
            f"assert primal_compiler.__file__.startswith({str(install)!r}), primal_compiler.__file__\n"
            "import primal_compiler.executor.kernel as k, primal_compiler.executor.topology as t\n"
            "import primal_compiler.viz.traffic as v\n"
            "assert {type(f._cache).__name__ for f in (k.schedule, t._steps, t._grid, t.walk, t._plan, v._link_bytes)}"
            " == {'NullCache'}\n"
            "from primal_compiler.cli import main\n"
            "sys.exit(main(['run', 'tiny-llama', '-p', 'lower-tiles,blocking,zcurve-order,kv-ring,codegen',"
            " '--context', '64', '--json']))\n"
        )
        res = subprocess.run([*prefix, sys.executable, "-c", script], env=env, capture_output=True, text=True,
                             timeout=600, cwd=str(base))
        assert res.returncode == 0, res.stderr[-2000:]
        assert "cannot cache" not in res.stderr and '"tokens_per_s"' in res.stdout
        assert "replay cache not written" in res.stderr  # no writable home: the replay ran without its cache
        assert not list(install.rglob("*.nbi"))  # nothing was cached into the install
    finally:
        for p in [base, *base.rglob("*")]:
            os.chmod(p, p.stat().st_mode | stat.S_IWUSR)
        shutil.rmtree(base)


def _read_only(base: Path) -> None:
    """Everything under ``base`` readable by all and writable by none (``base`` itself stays writable)."""
    for p in base.rglob("*"):
        mode = p.stat().st_mode | stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
        if p.is_dir():
            mode |= stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
        os.chmod(p, mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
