"""The primal command: inspect, compile, map, passes, targets, and one-line errors."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from primal_compiler.cli import main


def test_inspect_json_llama2_13b(capsys):
    assert main(["inspect", "llama2-13b", "--lora", "q,v:8", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["num_layers"] == 40 and info["base_params"] == 13_015_864_320 and info["lora_params"] == 6_553_600
    for key in ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "vocab_size"):
        assert key in info
    q = info["layers"][0]["matrices"][0]
    assert q == {"role": "q", "shape": [5120, 5120], "bias": False, "lora_rank": 8, "lora_alpha": 8.0}
    assert info["needs"]["cts"] == 211


def test_compile_writes_deterministic_output(tmp_path, capsys):
    args = ["compile", "tiny-llama", "--lora", "q,v:8", "-p",
            "lower-tiles,blocking,zcurve-order,ga-placement{generations=4,population=8,executor=serial}"]
    assert main(args + ["-o", str(tmp_path / "a")]) == 0
    assert main(args + ["-o", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "hops per decode step" in out
    for name in ("placement.npz", "placement.txt", "summary.json", "records.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["cts"] >= 1 and summary["hops"]["max_hops"] >= 1


def test_run_keeps_its_numbers_beside_the_program(tmp_path, capsys):
    """primal run -o OUT writes report.json (the --json report) and report.txt (the table) beside the program, less
    the replay's wall times, so two runs write the same bytes and nobody replays again to keep the numbers."""
    args = ["run", "tiny-llama", "-p", "fast"]
    assert main(args + ["--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    for name in ("a", "b"):
        assert main(args + ["-o", str(tmp_path / name)]) == 0
    text = capsys.readouterr().out
    kept = json.loads((tmp_path / "a" / "report.json").read_text())
    assert "replay_s" in printed["metrics"] and "replay_s" not in kept["metrics"]
    assert kept["metrics"]["ttft_s"] == printed["metrics"]["ttft_s"] and kept["program"] == printed["program"]
    for name in ("report.json", "report.txt"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    saved = (tmp_path / "a" / "report.txt").read_text()
    assert saved.splitlines()[0] == text.splitlines()[0] and "replay:" in text and "replay:" not in saved
    assert kept["program_sha256"] == hashlib.sha256((tmp_path / "a" / "program.primal").read_bytes()[:-32]).hexdigest()


@pytest.mark.parametrize("args, message", [
    (["inspect", "llama9"], "llama9: unknown built-in model"),
    (["inspect", "llama2-7b", "--lora", "q:"], "--lora"),
    (["inspect", "llama2-7b", "--target", "nope"], "nope"),
    (["compile", "tiny-llama", "-p", "blocking{bogus=1}"], "pass blocking: unknown option 'bogus'"),
    (["compile", "tiny-llama", "-p", "blocking"], "pass blocking: requires tiles"),
])
def test_errors_are_one_line_and_write_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "out"
    if args[0] == "compile":
        args = args + ["-o", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_bad_onnx_file(tmp_path, capsys):
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"this is not onnx")
    assert main(["inspect", str(bad)]) == 2
    assert "model.onnx" in capsys.readouterr().err


def test_passes_and_targets_commands(capsys):
    assert main(["passes"]) == 0
    out = capsys.readouterr().out
    assert "ga-placement" in out and "generations = 30" in out
    assert main(["targets"]) == 0
    assert "primal-7nm" in capsys.readouterr().out


def test_console_script_entry_point():
    proc = subprocess.run([sys.executable, "-m", "primal_compiler.cli", "inspect", "gpt2"], capture_output=True, text=True)
    assert proc.returncode == 0 and "124,439,808" in proc.stdout


def test_every_verb_is_a_command():
    from primal_compiler.cli import build_parser
    from primal_compiler.sweep.command import cmd_sweep
    from primal_compiler.viz.command import cmd_viz

    parser = build_parser()
    assert parser.parse_args(["viz", "out"]).func is cmd_viz
    assert parser.parse_args(["sweep", "spec.toml", "-o", "r"]).func is cmd_sweep
    for verb in ("run", "reproduce", "compile", "map", "inspect", "disasm", "asm", "passes", "targets"):
        assert verb in parser._subparsers._group_actions[0].choices


def test_inspect_names_norm_activation_and_positions(capsys):
    assert main(["inspect", "llama2-7b"]) == 0
    assert "rmsnorm norm, silu MLP, rope positions (theta 10000, frequencies geometric in rope_theta)" in \
        capsys.readouterr().out
    assert main(["inspect", "gpt2", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["activation"] == "gelu_new" and info["positional"] == "learned" and info["embed_scale"] == 1.0


def test_help_imports_none_of_the_compiler():
    """``primal --help`` and every verb's ``--help`` answer before the heavy imports (issue 54): building the
    parser loads no pass, no executor, no ONNX and no numba."""
    code = ("import sys\nfrom primal_compiler.cli import build_parser\nbuild_parser()\n"
            "heavy = [m for m in ('onnx', 'numba', 'ortools', 'scipy', 'primal_compiler.transforms', "
            "'primal_compiler.executor.replay') if m in sys.modules]\nprint(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_an_option_flag_s_range_error_loads_no_solver_and_no_onnx():
    """``--context 0`` reads the range kv-ring declares, so it registers the passes, but none of them imports ONNX
    or OR-Tools until it runs (2.0 s to answer before, 0.5 s now; numba, which the executor's kernels need, still
    loads, and SciPy with it)."""
    code = ("import sys\nfrom primal_compiler.cli import main\nrc = main(['run', 'tiny-llama', '--context', '0'])\n"
            "heavy = [m for m in ('onnx', 'ortools') if m in sys.modules]\nprint(rc, heavy)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "2 []" and "--context: must be >= 1" in done.stderr


def test_a_progress_bar_only_on_a_terminal_and_the_passes_name_its_steps(small_target):
    """primal run's bar (issue 55): each pass, then the replay, is a named step; a pipe or a file gets no bar."""
    import io

    from primal_compiler.api import compile_model
    from primal_compiler.frontend import load_model
    from primal_compiler.terminal import steps

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    seen: list[str] = []
    compile_model(load_model("tiny-llama"), small_target, "lower-tiles,blocking,zcurve-order", progress=seen.append)
    assert seen == ["lower-tiles", "blocking", "zcurve-order"]
    shown, piped = Tty(), io.StringIO()
    for out in (shown, piped):
        with steps(2, "tiny-llama", out) as step:
            step("zcurve-order")
            step("replay")
    assert "tiny-llama" in shown.getvalue() and "replay" in shown.getvalue() and piped.getvalue() == ""
