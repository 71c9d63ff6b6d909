"""Shared fixtures: small compiled programs built in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from primal_compiler.api import compile_model
from primal_compiler.cli import main
from primal_compiler.frontend import load_model
from primal_compiler.target import load_target


@pytest.fixture(scope="session")
def target():
    return load_target("primal-7nm")


@pytest.fixture(scope="session")
def small_target():
    """primal-7nm with an 8x8 CT mesh, so tiny models span several CTs."""
    from primal_compiler.target import with_overrides

    return with_overrides(load_target("primal-7nm"), {"ct.mesh_rows": 8, "ct.mesh_cols": 8})


@pytest.fixture(scope="session")
def tiny_model():
    return load_model("tiny-llama", "q,v:8")


@pytest.fixture(scope="session")
def tiny_blocked(tiny_model, small_target):
    return compile_model(tiny_model, small_target, "lower-tiles,blocking")


@pytest.fixture(scope="session")
def compiled(tmp_path_factory) -> Path:
    """A compile output of tiny-llama with the fast pipeline (never modified by a test)."""
    out = tmp_path_factory.mktemp("compiled") / "out"
    assert main(["compile", "tiny-llama", "-p", "fast", "-o", str(out)]) == 0
    return out


@pytest.fixture(scope="session")
def program_text(compiled, tmp_path_factory) -> Path:
    """``compiled``'s program as assembly text."""
    text = tmp_path_factory.mktemp("text") / "prog.txt"
    assert main(["disasm", str(compiled), "-o", str(text)]) == 0
    return text


@pytest.fixture(autouse=True)
def replay_cache_home(tmp_path_factory, monkeypatch):
    """Every test's replay cache (``primal run``, ``viz``, ``thermal``) in a fresh directory of its own, never the
    user's ``~/.cache``, so no test reads a schedule another test (or a monkeypatched executor) kept."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
