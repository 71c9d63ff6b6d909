"""The library's public API: ``primal_compiler.compile``, ``run``, ``load_program``, ``load_target``.

The names are pinned; a compile, its run, the program file it writes and that file's run agree.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
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


def test_a_program_runs_on_its_own_target_and_one_without_a_target_is_refused(compiled, small_target, tmp_path):
    """compile and load_program leave the Program its target, so run needs it only to run elsewhere; a Program
    built without one is refused naming the need."""
    from primal_compiler.compiled import write_compiled

    assert primal_compiler.load_target("primal-7nm").name == "primal-7nm"
    assert compiled.target is small_target
    own, given = (primal_compiler.run(compiled, t)["metrics"] for t in (None, small_target))
    assert own.pop("replay_s") and given.pop("replay_s") and own == given  # (less the replays' wall times)
    write_compiled(compiled, small_target, tmp_path / "out")
    assert primal_compiler.load_program(tmp_path / "out", small_target).target is not None
    with pytest.raises(InputError, match="runs with its target"):
        primal_compiler.run(compiled.evolve(target=None))


def test_compile_takes_the_workload_as_primal_run_does(small_target):
    """batch, context and generate set kv-ring's and codegen's options, as --batch, --context and --generate do:
    a 64-token generation replays its first 3 decode steps and repeats the settled one."""
    from primal_compiler.api import pipeline_text

    p = primal_compiler.compile("tiny-llama", "q,v:8", target=small_target, pipeline="fast", batch=2, context=128,
                                generate=64)
    text = pipeline_text(p)
    assert "batch=2" in text and "context=128" in text and "steps=3" in text and "generate=64" in text
    report = primal_compiler.run(p)
    assert report["metrics"]["generation"]["replayed_steps"] == 3 and report["metrics"]["decode_steps"] == 64


def test_a_program_file_loads_into_the_program_it_was_written_from(compiled, small_target, tmp_path):
    from primal_compiler.api import pipeline_text
    from primal_compiler.compiled import placement_table, program_file, write_compiled

    write_compiled(compiled, small_target, tmp_path / "out")
    loaded = primal_compiler.load_program(tmp_path / "out", small_target)
    assert loaded.facts == compiled.facts and pipeline_text(loaded) == pipeline_text(compiled)
    assert placement_table(loaded) == placement_table(compiled)
    (meta, arrays), (meta0, arrays0) = program_file(loaded, small_target), program_file(compiled, small_target)
    assert meta == meta0 and sorted(arrays) == sorted(arrays0)
    for name in arrays0:
        np.testing.assert_array_equal(arrays[name], arrays0[name], err_msg=name)
    for a, b in zip(loaded.layout.templates, compiled.layout.templates, strict=True):
        for field in ("slots", "hubs", "rel_rows"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
        for field in ("src", "dst", "weight", "flow_class"):
            np.testing.assert_array_equal(getattr(a.instance, field), getattr(b.instance, field))
    np.testing.assert_array_equal(loaded.layout.inter_bytes, compiled.layout.inter_bytes)


def test_a_placement_the_file_disagrees_with_is_refused(compiled, small_target):
    from primal_compiler.compiled import Compiled

    c = Compiled.of(compiled, small_target, "out/program.primal")
    pe = c.arrays["tile_pe"].copy()
    rram = np.flatnonzero(c.arrays["tile_host"] < 0)[:2]
    pe[rram] = pe[rram[::-1]]  # two tiles swap PEs, the legs stay as they were
    tampered = Compiled(c.meta, c.arrays | {"tile_pe": pe}, c.stream, c.target, c.where)
    with pytest.raises(InputError, match=r"out/program.primal: .*map_src_pe.*not the legs of the stored placement"):
        tampered.program()
    seq = c.arrays["tile_seq"].copy()
    seq[rram] = seq[rram[::-1]]
    with pytest.raises(InputError, match=r"out/program.primal: tile_ct, tile_seq.*not the blocking"):
        Compiled(c.meta, c.arrays | {"tile_seq": seq}, c.stream, c.target, c.where).program()
