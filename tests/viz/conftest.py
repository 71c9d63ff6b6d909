"""Two small compile outputs (tiny-llama, LoRA on q,v; one serving a second adapter) and their rendered viz."""

from __future__ import annotations

import pytest

from primal_compiler.api import compile_model
from primal_compiler.compiled import write_compiled
from primal_compiler.frontend import load_model

SWITCH = "lower-tiles,blocking,zcurve-order,kv-ring{context=64},codegen{requests=0;1},srpg"
NAIVE = "lower-tiles,blocking,row-major-order,kv-ring{context=64},codegen,srpg"


def _compile(path, pipeline, target):
    write_compiled(compile_model(load_model("tiny-llama", "q,v:8"), target, pipeline), target, path)
    return path


@pytest.fixture(scope="session")
def out_switch(tmp_path_factory, target):
    return _compile(tmp_path_factory.mktemp("viz") / "switch", SWITCH, target)


@pytest.fixture(scope="session")
def out_naive(tmp_path_factory, target):
    return _compile(tmp_path_factory.mktemp("viz") / "naive", NAIVE, target)


@pytest.fixture(scope="session")
def vdata(out_switch):
    from primal_compiler.viz import data

    return data.load(out_switch)


@pytest.fixture(scope="session")
def rendered(out_switch, out_naive):
    """render_all of the adapter-switch program with the naive one for comparison: its result dict."""
    from primal_compiler.viz.command import render_all

    return render_all(out_switch, compare=out_naive)
