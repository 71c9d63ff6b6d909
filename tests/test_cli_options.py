"""Every bad option value ends in exit code 2 and one error line, with no traceback and before any work.

Two ways to end: an ``InputError`` (``primal: WHERE: PROBLEM``, exactly one line) or an argparse
type check of the flag (argparse's usage, then one ``primal VERB: error: argument FLAG: ...``
line). Each case is one a new user hit (issue 21), run in-process through ``cli.main``.
"""

from __future__ import annotations

import time

import pytest

from primal_compiler.cli import main
from primal_compiler.target import bundled_targets

SEVEN = bundled_targets()["primal-7nm"].read_text(encoding="utf-8")
FAST = "lower-tiles,blocking,zcurve-order,kv-ring,codegen,srpg"


def _files(tmp_path):
    (tmp_path / "notlist.toml").write_text("pass = 5\n", encoding="utf-8")
    (tmp_path / "latin1.toml").write_bytes(b'description = "d\xe9j\xe0 vu"\n[[pass]]\nname = "lower-tiles"\n')
    (tmp_path / "latin1-target.toml").write_bytes(SEVEN.encode("utf-8").replace(b"256x256", b"256\xd7256"))
    (tmp_path / "wide.toml").write_text(SEVEN.replace("mesh_cols = 32", "mesh_cols = 100000"), encoding="utf-8")
    (tmp_path / "many.toml").write_text(SEVEN.replace("num_cts = 0", "num_cts = 40000"), encoding="utf-8")
    (tmp_path / "huge.toml").write_text(SEVEN.replace("num_cts = 0", "num_cts = 10000000000"), encoding="utf-8")


def _exit(argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse refused a flag
        return exc.code


# (argv, text the error line holds); {tmp} is the test's directory.
INPUT_ERRORS = [
    (["run", "tiny-llama", "-p", "lower-tiles{base_bits=0},blocking,zcurve-order,kv-ring,codegen,srpg"],
     "pass lower-tiles: base_bits must be >= 1 and <= 32, got 0"),
    (["run", "tiny-llama", "-p", "fast", "--lora", "q:10000000000000000000000"], "--lora: 'q:1000000"),
    (["run", "tiny-llama", "-p", "fast", "--lora", "q:8:nan"], "need alpha > 0 and alpha <= 65504, got nan"),
    (["run", "tiny-llama", "-p", "fast", "--lora", "q:8:inf"], "got inf"),
    (["run", "tiny-llama", "-p", "fast", "--lora", "q:8:-2"], "need alpha > 0"),
    (["compile", "tiny-llama", "-p", "{tmp}/notlist.toml", "-o", "{tmp}/out"], "pass must be an array of tables"),
    (["compile", "tiny-llama", "-p", "{tmp}/latin1.toml", "-o", "{tmp}/out"], "latin1.toml: is not UTF-8 text"),
    (["run", "tiny-llama", "-p", "fast", "--target", "{tmp}/latin1-target.toml"], "is not UTF-8 text"),
    (["run", "tiny-llama", "-p", "fast", "--target", "h100"], "h100: is a gpu target"),
    (["compile", "tiny-llama", "-p", "fast", "--target", "h100", "-o", "{tmp}/out"], "needs a PRIMAL target"),
    (["inspect", "tiny-llama", "--target", "h100"], "h100: is a gpu target"),
    (["map", "tiny-llama", "--target", "h100"], "h100: is a gpu target"),
    (["reproduce", "--target", "h100"], "h100: is a gpu target"),
    (["reproduce", "--context", "100"], "pass kv-ring: context 100 is not a multiple of chunk_tokens 32"),
    (["run", "tiny-llama", "-p", "fast", "--target", "{tmp}/wide.toml"], "ct.mesh_cols: must be <= 255, got 100000"),
    (["run", "tiny-llama", "-p", "fast", "--target", "{tmp}/many.toml"], "exceeds the package limit"),
    (["inspect", "tiny-llama", "--target", "{tmp}/huge.toml"], "system.num_cts: must be <= 65534"),
    (["compile", "tiny-llama", "-p", " , ", "-o", "{tmp}/out"], "pipeline: empty pass name"),
]

FLAG_ERRORS = [
    (["run", "tiny-llama", "-p", "fast", "--batch", "0"], "argument --batch: must be >= 1 and <= 1024, got '0'"),
    (["run", "tiny-llama", "-p", "fast", "--context", "0"], "argument --context: must be >= 1"),
    (["run", "tiny-llama", "-p", "fast", "--context", "two"], "argument --context: expected an integer"),
    (["run", "tiny-llama", "-p", ""], "argument -p/--pipeline: empty pipeline"),
    (["compile", "tiny-llama", "-p", "", "-o", "{tmp}/out"], "argument -p/--pipeline: empty pipeline"),
    (["run", "tiny-llama", "--functional", "--generate", "0"], "argument --generate: must be >= 1"),
    (["map", "tiny-llama", "--generations", "1000000000"], "argument --generations: must be >= 1 and <= 10000"),
    (["map", "tiny-llama", "--generations", "0"], "argument --generations: must be >= 1"),
    (["map", "tiny-llama", "--seed", "-1"], "argument --seed: must be >= 0"),
    (["map", "tiny-llama", "--context", "0"], "argument --context: must be >= 1"),
    (["map", "tiny-llama", "--enforce", "rows"], "argument --enforce: unknown rule 'rows'; enforceable: columns"),
    (["reproduce", "--context", "0"], "argument --context: must be >= 1 and <= 131072, got '0'"),
    (["reproduce", "--batch8-context", "-5"], "argument --batch8-context: must be >= 1"),
    (["viz", "{tmp}/out", "--max-events", "0"], "argument --max-events: must be >= 1 and <= 2000000"),
]


@pytest.mark.parametrize("argv, message", INPUT_ERRORS, ids=[" ".join(a)[:60] for a, _ in INPUT_ERRORS])
def test_bad_values_are_one_input_error_line(tmp_path, capsys, argv, message):
    _files(tmp_path)
    start = time.perf_counter()
    assert _exit([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("primal: ") and err.count("\n") == 1 and message in err, err
    assert "Traceback" not in err and time.perf_counter() - start < 30
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, message", FLAG_ERRORS, ids=[" ".join(a)[:60] for a, _ in FLAG_ERRORS])
def test_bad_flags_are_refused_by_argparse(tmp_path, capsys, argv, message):
    assert _exit([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    last = err.rstrip("\n").splitlines()[-1]
    assert last.startswith(f"primal {argv[0]}: error: ") and message in last, err
    assert err.startswith("usage: ") and "Traceback" not in err
