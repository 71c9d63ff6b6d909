"""Small compiled programs with a stream, built in-process once per session."""

from __future__ import annotations

import pytest

from primal_compiler.api import compile_model
from primal_compiler.frontend import load_model

PLACE = "lower-tiles,blocking,zcurve-order"


@pytest.fixture(scope="session")
def emitted(small_target):
    """tiny-llama with LoRA on q,v: three requests (adapters 0, 1, 1), batch 2, 64-token context."""
    model = load_model("tiny-llama", "q,v:8")
    return compile_model(model, small_target, f"{PLACE},kv-ring{{context=64,batch=2}},codegen{{requests=0;1;1}}")


@pytest.fixture(scope="session")
def gated(emitted, small_target):
    from primal_compiler.passmgr import PassManager, parse_pipeline

    return PassManager(parse_pipeline("srpg")).run(emitted, small_target)
