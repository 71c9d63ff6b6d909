"""Every bad option value ends in exit code 2 and one error line, with no traceback and before any work.

Two ways to end, each exactly one line: an ``InputError`` (``primal: WHERE: PROBLEM``) or an argparse
type check of the flag (``primal: VERB: argument FLAG: ...``, no usage block: issue 47). Each case is
one a new user hit (issue 21), run in-process through ``cli.main``.
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
    (tmp_path / "spec.toml").write_text('[sweep]\nmodel = "tiny-llama"\npipeline = "fast"\n[axes]\nbatch = [1]\n')


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
    # issue 47: sizes, combinations and addresses refused before any work
    (["reproduce", "--batch8-context", "131072"], "--batch8-context: context 131072 x batch 1 needs"),
    (["reproduce", "--batch8-context", "512"], "--batch8-context: 8 sequences of 512 tokens do not fit"),
    (["reproduce", "--solve-budget-s", "5"], "--solve-budget-s: has no effect without --solve"),
    (["run", "tiny-llama", "--functional", "--weights", "m.onnx", "--prompt", "1", "-o", "{tmp}/out"],
     "-o: applies to the cost replay only; --functional would ignore it"),
    (["run", "tiny-llama", "-p", "fast", "--save-logits", "{tmp}/l.npy"],
     "--save-logits: applies to --functional only; the cost replay would ignore it"),
    (["disasm", "{tmp}", "--force"], "--force: has no effect without -o FILE"),
    (["trace", "-o", "{tmp}/t.jsonl", "--adapters", "a", "--requests", "2", "--rate", "1", "--think", "5"],
     "--think: has no effect without --turns above 1:1"),
    (["baseline", "tiny-llama", "--gpu", "h100", "--precision", "fp16", "--batch", "1", "--prompt", "8",
      "--generate", "8", "--lora-mode", "merged"], "--lora-mode: has no effect without --lora"),
    (["sweep", "{tmp}/spec.toml", "-o", "{tmp}/out", "--x", "itl_s"], "--x: has no effect without --plot"),
    (["sweep", "{tmp}/spec.toml", "-o", "{tmp}/out", "--scheduler", "tcp://127.0.0.1:1"],
     "--scheduler: cannot reach the Dask scheduler tcp://127.0.0.1:1"),
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
    (["sweep", "{tmp}/spec.toml", "-o", "{tmp}/out", "--scheduler", "notaurl"],
     "argument --scheduler: expected a Dask scheduler address"),
    (["run", ""], "argument model: empty path"),
    (["disasm", ""], "argument program: empty path"),
    (["viz", ""], "argument out: empty path"),
    (["thermal", ""], "argument out: empty path"),
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
    _files(tmp_path)
    assert _exit([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"primal: {argv[0]}: ") and err.count("\n") == 1 and message in err, err
    assert "Traceback" not in err


def test_a_flag_is_taken_only_by_its_whole_name(tmp_path, capsys):
    """``--forc`` is not ``--force``: an abbreviation argparse would accept could replace a file by accident."""
    assert _exit(["disasm", str(tmp_path / "nothing"), "--forc"]) == 2
    assert capsys.readouterr().err == ("primal: command line: unrecognized arguments: --forc "
                                       "(primal --help lists the options)\n")
