"""Shared fixtures: small compiled programs built in-process."""

from __future__ import annotations

import pytest

from primal_compiler.api import compile_model
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
