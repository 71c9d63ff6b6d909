"""A small compiled program and its replay for the thermal tests, built once per session."""

from __future__ import annotations

import pytest

from primal_compiler.api import compile_model
from primal_compiler.compiled import Compiled
from primal_compiler.executor.replay import replay
from primal_compiler.frontend import load_model

PIPELINE = "lower-tiles,blocking,zcurve-order,kv-ring{context=64},codegen{steps=2},srpg"


@pytest.fixture(scope="session")
def thermal_compiled(small_target) -> Compiled:
    """tiny-llama with LoRA on q,v on 8x8 CTs, as its program file holds it."""
    return Compiled.of(compile_model(load_model("tiny-llama", "q,v:8"), small_target, PIPELINE), small_target)


@pytest.fixture(scope="session")
def thermal_replay(thermal_compiled):
    c = thermal_compiled
    return replay(c.meta, c.arrays, c.stream, c.target)
