"""A small compiled program and its replay, built once per session."""

from __future__ import annotations

import pytest

from primal_compiler.api import compile_model
from primal_compiler.compiled import program_file
from primal_compiler.executor.replay import replay
from primal_compiler.frontend import load_model

PIPELINE = "lower-tiles,blocking,zcurve-order,kv-ring{context=64,batch=2},codegen{requests=0;1},srpg"


@pytest.fixture(scope="session")
def compiled(small_target):
    """tiny-llama with LoRA on q,v on 8x8 CTs: (program, meta, arrays)."""
    program = compile_model(load_model("tiny-llama", "q,v:8"), small_target, PIPELINE)
    meta, arrays = program_file(program, small_target)
    return program, meta, arrays


@pytest.fixture(scope="session")
def replayed(compiled, small_target):
    program, meta, arrays = compiled
    return replay(meta, arrays, program.stream, small_target)
