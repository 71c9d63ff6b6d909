"""LoRA tiles with a PE of their own (no RRAM host): compiled, checked on load, replayed with hop validation."""

from __future__ import annotations

import numpy as np
import pytest

from primal_compiler.compiled import program_file
from primal_compiler.cli import main
from primal_compiler.ir.tiles import Macro
from primal_compiler.isa.schema import compiled_issue

FAST = "lower-tiles,blocking,zcurve-order,kv-ring,codegen,srpg"


@pytest.fixture(scope="module")
def own_pes(small_target):
    """tiny-llama, r=16 on q,k,v,o, on 8x8 CTs: (program, meta, arrays); 3 LoRA tiles per layer own a PE."""
    from primal_compiler.api import compile_model
    from primal_compiler.frontend import load_model

    program = compile_model(load_model("tiny-llama", "q,k,v,o:16"), small_target,
                            "lower-tiles,blocking,zcurve-order,kv-ring{context=64},codegen,srpg", verify=True)
    meta, arrays = program_file(program, small_target)
    return program, meta, arrays


def _own(arrays) -> np.ndarray:
    n = len(arrays["tile_macro"])
    return np.flatnonzero((arrays["tile_macro"] == Macro.SRAM) & (arrays["tile_host"] == np.arange(n)))


def test_the_program_passes_the_loader_checks(own_pes):
    program, meta, arrays = own_pes
    assert len(_own(arrays)) == 6
    assert compiled_issue(meta, arrays, program.stream) is None


def test_an_sram_tile_hosted_by_another_sram_tile_is_refused(own_pes):
    program, meta, arrays = own_pes
    a = {k: v.copy() for k, v in arrays.items()}
    own = _own(a)
    hosted = np.flatnonzero((a["tile_macro"] == Macro.SRAM) & (a["tile_host"] != np.arange(len(a["tile_host"]))))
    a["tile_host"][hosted[0]] = own[0]
    issue = compiled_issue(meta, a, program.stream)
    assert issue is not None and f"is {own[0]}, another SRAM tile" in issue.message


def test_a_self_hosted_sram_tile_on_an_rram_tiles_pe_is_refused(own_pes):
    program, meta, arrays = own_pes
    a = {k: v.copy() for k, v in arrays.items()}
    own = _own(a)[0]
    rram = int(np.flatnonzero((a["tile_macro"] == Macro.RRAM) & (a["tile_ct"] == a["tile_ct"][own]))[0])
    a["tile_pe"][own] = a["tile_pe"][rram]
    issue = compiled_issue(meta, a, program.stream)
    assert issue is not None and "places a second RRAM tile or self-hosted SRAM tile on one PE" in issue.message


def test_compile_and_run_with_hop_validation(tmp_path, capsys):
    """The issue's command: tiny-llama with r=16 on q,k,v,o on primal-7nm, fast pipeline, then ``primal run``."""
    out = tmp_path / "x"
    assert main(["compile", "tiny-llama", "--lora", "q,k,v,o:16", "-p", FAST, "-o", str(out)]) == 0
    assert main(["run", str(out)]) == 0
    text = capsys.readouterr().out
    assert "hop validation:" in text and "match the mapping" in text
