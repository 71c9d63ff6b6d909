"""The library's public API: ``primal_compiler.compile``, ``run``, ``load_program``, ``load_target``.

The names are pinned; a compile, its run, the program file it writes and that file's run agree.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import primal_compiler
from primal_compiler.errors import InputError

FAST = "lower-tiles,blocking,zcurve-order,kv-ring{context=64},codegen,srpg"


def test_the_public_names_are_pinned():
    assert primal_compiler.__all__ == ["__version__", "compile", "load_program", "load_target", "run"]


def test_importing_the_package_imports_no_compiler():
    code = "import sys, primal_compiler; print(sorted(m for m in ('numpy', 'onnx', 'primal_compiler.api') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def compiled(small_target):
    return primal_compiler.compile("tiny-llama", "q,v:8", target=small_target, pipeline=FAST, verify=True)


def test_compile_run_and_the_program_file_agree(compiled, small_target, tmp_path):
    from primal_compiler.compiled import write_compiled

    report = primal_compiler.run(compiled, small_target)
    assert report["metrics"]["ttft_s"] > 0 and report["model"] == "tiny-llama"
    out = tmp_path / "tiny"
    write_compiled(compiled, small_target, out)
    again = primal_compiler.run(out, small_target)
    for key in ("ttft_s", "itl_s", "tokens_per_j", "max_hops"):
        assert again["metrics"][key] == report["metrics"][key]
    loaded = primal_compiler.load_program(out, small_target)
    assert (loaded.stream.records == compiled.stream.records).all() and loaded.model.name == "tiny-llama"


def test_load_target_by_name_and_a_program_without_its_compile_is_refused(compiled):
    assert primal_compiler.load_target("primal-7nm").name == "primal-7nm"
    with pytest.raises(InputError, match="runs with its target"):
        primal_compiler.run(compiled)
