"""No verb deletes or overwrites what it did not write; output paths fail in one line; signals leave whole outputs.

Guarantees under test are listed in ``primal_compiler/outdir.py`` and ``docs/outputs.md``.
"""

from __future__ import annotations

import errno
import json
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from primal_compiler import outdir
from primal_compiler.cli import main
from primal_compiler.errors import InputError

FAST = ["-p", "fast"]


def verbs(compiled: Path, program_text: Path) -> dict[str, list[str]]:
    """Every verb that writes, as argv lacking only its output path (appended after ``-o``)."""
    return {
        "compile": ["compile", "tiny-llama", *FAST, "-o"],
        "run": ["run", "tiny-llama", *FAST, "-o"],
        "viz": ["viz", str(compiled), "-o"],
        "disasm": ["disasm", str(compiled), "-o"],
        "asm": ["asm", str(program_text), "-o"],
    }


def one_line_error(capsys, code: int) -> str:
    """The error line; ``primal run MODEL`` may print its "compiled ..." progress line before it."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("compiled ")]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("primal: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("verb", ["compile", "run", "viz", "disasm", "asm"])
@pytest.mark.parametrize("where", ["dir", "dir-force", ".", "..", "../..", "home", "file"])
def test_user_files_survive_every_verb(verb, where, compiled, program_text, tmp_path, monkeypatch, capsys):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    for d in (tmp_path, tmp_path / "a", work):
        (d / "user.txt").write_text("keep me")
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "a"))
    argv = verbs(compiled, program_text)[verb]
    dest = {"dir": str(work), "dir-force": str(work), ".": ".", "..": "..", "../..": "../..",
            "home": str(Path.home()), "file": "user.txt"}[where]
    extra = ["--force"] if where.endswith("force") else []
    err = one_line_error(capsys, main([*argv, dest, *extra]))
    assert dest in err or str(Path(dest)) in err
    for d in (tmp_path, tmp_path / "a", work):
        assert (d / "user.txt").read_text() == "keep me"
    assert sorted(p.name for p in work.iterdir()) == ["user.txt"]


@pytest.mark.parametrize("case", ["empty", "under-file", "symlink", "proc", "exists-file"])
def test_output_path_classes_are_one_line(case, compiled, program_text, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plain").write_text("x")
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    dest = {"empty": "", "under-file": "plain/sub", "symlink": "link", "proc": "/proc/primal-test/x",
            "exists-file": "plain"}[case]
    for verb, argv in verbs(compiled, program_text).items():
        if case == "exists-file" and verb in ("disasm", "asm"):
            continue  # a file verb may replace a file, with --force (below)
        one_line_error(capsys, main([*argv, dest]))
    assert (tmp_path / "plain").read_text() == "x" and list((tmp_path / "real").iterdir()) == []


def test_file_verbs_replace_a_file_only_with_force(compiled, tmp_path, capsys):
    text = tmp_path / "prog.txt"
    text.write_text("mine")
    one_line_error(capsys, main(["disasm", str(compiled), "-o", str(text)]))
    assert text.read_text() == "mine"
    assert main(["disasm", str(compiled), "-o", str(text), "--force"]) == 0
    assert text.read_text().startswith(";") or len(text.read_text()) > 100


def test_force_replaces_only_our_own_output(compiled, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["compile", "tiny-llama", *FAST, "-o", str(out)]) == 0
    marker = json.loads((out / outdir.MARKER).read_text())
    assert marker["tool"] == outdir.TOOL and "program.primal" in marker["entries"]
    one_line_error(capsys, main(["compile", "tiny-llama", *FAST, "-o", str(out)]))  # ours, but no --force
    assert main(["viz", str(out)]) == 0  # OUT/viz: a nested output of ours
    assert main(["compile", "tiny-llama", *FAST, "-o", str(out), "--force"]) == 0
    assert not (out / "viz").exists()
    (out / "notes.md").write_text("mine")
    err = one_line_error(capsys, main(["compile", "tiny-llama", *FAST, "-o", str(out), "--force"]))
    assert "notes.md" in err and (out / "notes.md").read_text() == "mine"
    (out / "notes.md").unlink()
    (out / "placement.txt").write_text("edited")  # an edited file of ours is still ours
    assert main(["compile", "tiny-llama", *FAST, "-o", str(out), "--force"]) == 0
    assert (out / "placement.txt").read_text() != "edited"


def test_viz_never_replaces_its_input(compiled, tmp_path, capsys):
    for dest in (compiled, compiled.parent):
        err = one_line_error(capsys, main(["viz", str(compiled), "-o", str(dest), "--force"]))
        assert "input" in err or "not written by primal" in err
    assert (compiled / "program.primal").exists()


def test_unwritable_parent_and_free_space(tmp_path, monkeypatch):
    monkeypatch.setattr(outdir.os, "access", lambda path, mode: False)
    with pytest.raises(InputError, match="permission denied"):
        outdir.check_destination(tmp_path / "x", False, directory=True)
    monkeypatch.undo()
    monkeypatch.setattr(outdir.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(100, 90, 10))
    with pytest.raises(InputError, match="needs about 1,000 bytes"):
        outdir.check_destination(tmp_path / "x", False, directory=True, need_bytes=1000)


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    with pytest.raises(InputError, match="no space left on device"):
        with outdir.output_directory(tmp_path / "out", "test"):
            raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(InputError, match="no space left on device"):
        with outdir.output_file(tmp_path / "f"):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_stale_temporaries_are_tidied_and_an_aside_version_restored(tmp_path):
    dead = 2 ** 22 + 12345  # above the default pid_max, so never a live process
    (tmp_path / f".out.primal-tmp.{dead}.0123456789ab").mkdir()
    (tmp_path / f".out.primal-tmp.{dead}.ba9876543210").write_text("half")
    (tmp_path / f".other.primal-tmp.{dead}.0123456789ab").mkdir()  # another destination's: left alone
    aside = tmp_path / f".out.primal-old.{dead}.0123456789ab"
    with outdir.output_directory(aside, "test") as tmp:
        (tmp / "v1").write_text("old version")
    with outdir.output_directory(tmp_path / "new", "test") as tmp:
        (tmp / "x").write_text("x")
    assert outdir.check_destination(tmp_path / "out", True, directory=True)
    assert (tmp_path / "out" / "v1").read_text() == "old version"
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [f".other.primal-tmp.{dead}.0123456789ab", "new", "out"]


CHILD = textwrap.dedent("""
    import os, sys, time
    import primal_compiler.outdir as od
    moment = sys.argv[1]
    if moment == "filling":  # the temporary directory is complete, not yet swapped in
        install = od._install_directory
        def slow(tmp, dest):
            print("READY", flush=True); time.sleep(60); install(tmp, dest)
        od._install_directory = slow
    elif moment == "aside":  # no atomic exchange: the old version renamed aside, the new one not yet in
        od._exchange = lambda a, b: False
        rename = os.rename
        def slow_rename(a, b):
            rename(a, b)
            if ".primal-old." in str(b):
                print("READY", flush=True); time.sleep(60)
        od.os.rename = slow_rename
    else:
        print("READY", flush=True)
    from primal_compiler.cli import main
    sys.exit(main(sys.argv[2:]))
""")


def run_child(moment: str, argv: list[str], sig: int) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, moment, *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "READY"
    if moment == "early":
        time.sleep(0.3)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def temporaries(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".primal-" in p.name)


@pytest.mark.parametrize("sig, code, line", [(signal.SIGTERM, 143, "primal: terminated"),
                                             (signal.SIGINT, 130, "primal: interrupted")])
def test_a_caught_signal_keeps_the_old_output_and_removes_the_new(sig, code, line, tmp_path):
    out = tmp_path / "out"
    assert main(["compile", "tiny-llama", *FAST, "-o", str(out)]) == 0
    before = (out / "program.primal").read_bytes()
    res = run_child("filling", ["compile", "tiny-llama", "--lora", "q:4", *FAST, "-o", str(out), "--force"], sig)
    assert res.returncode == code and res.stderr == line + "\n", res.stderr
    assert (out / "program.primal").read_bytes() == before and temporaries(tmp_path) == []


def test_sigint_early_in_compile_is_one_line(tmp_path):
    res = run_child("early", ["compile", "tiny-llama", "-o", str(tmp_path / "out")], signal.SIGINT)
    assert res.returncode == 130 and res.stderr == "primal: interrupted\n", res.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("sig, code, line", [(signal.SIGINT, 130, "primal: interrupted"),
                                             (signal.SIGTERM, 143, "primal: terminated")])
def test_a_signal_something_swallowed_still_ends_the_command_and_commits_nothing(sig, code, line, tmp_path,
                                                                                 monkeypatch, capsys):
    """A library that catches the signal's exception broadly (or an extension import that turns it into an
    error it then ignores) let the command finish as a success: the interrupt is still its end, before the
    output is committed."""
    import os

    walk = outdir._walk

    def swallowing(tmp):  # runs inside output_directory, before the commit
        try:
            os.kill(os.getpid(), sig)
            time.sleep(0.2)
        except BaseException:  # noqa: BLE001 - what the misbehaving library does
            pass
        return walk(tmp)

    monkeypatch.setattr(outdir, "_walk", swallowing)
    assert main(["compile", "tiny-llama", *FAST, "-o", str(tmp_path / "out")]) == code
    assert capsys.readouterr().err == line + "\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("moment", ["filling", "aside"])
def test_sigkill_leaves_a_whole_version_and_the_next_run_tidies(moment, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["compile", "tiny-llama", *FAST, "-o", str(out)]) == 0
    before = (out / "program.primal").read_bytes()
    res = run_child(moment, ["compile", "tiny-llama", "--lora", "q:4", *FAST, "-o", str(out), "--force"],
                    signal.SIGKILL)
    assert res.returncode == -signal.SIGKILL and temporaries(tmp_path)
    # the old version is under the name, or (renamed aside with no exchange) is restored by the next look
    outdir.check_destination(out, True, directory=True)
    assert (out / "program.primal").read_bytes() == before and temporaries(tmp_path) == []
    assert main(["compile", "tiny-llama", "--lora", "q:4", *FAST, "-o", str(out), "--force"]) == 0
    assert (out / "program.primal").read_bytes() != before and temporaries(tmp_path) == []


def test_broken_pipe_is_quiet():
    proc = subprocess.run(f"{sys.executable} -m primal_compiler.cli inspect tiny-llama --json | head -1",
                          shell=True, capture_output=True, text=True)
    assert proc.stdout.strip() == "{" and proc.stderr == ""


def test_an_internal_error_is_one_line_and_debug_shows_the_traceback(monkeypatch, capsys):
    import primal_compiler.cli as cli

    def boom(args):
        raise ZeroDivisionError("division by zero\nsecond line")

    monkeypatch.setattr(cli, "cmd_passes", boom)
    assert main(["passes"]) == 70
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error (ZeroDivisionError: division by zero second line)" in err
    assert "--debug" in err and "Traceback" not in err
    assert main(["--debug", "passes"]) == 70
    assert "Traceback" in capsys.readouterr().err


def test_a_signal_that_surfaces_as_another_error_is_still_an_interruption(monkeypatch, capsys):
    """SIGINT inside an extension module's import can come out as ImportError("initialization failed")."""
    import argparse

    from primal_compiler import cli, signals

    def cut_short(args) -> None:
        try:
            signals.on_sigint(signal.SIGINT, None)
        except KeyboardInterrupt:
            raise ImportError("initialization failed") from None

    parser = argparse.ArgumentParser()
    parser.set_defaults(func=cut_short)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    assert cli.main([]) == 130
    assert capsys.readouterr().err == "primal: interrupted\n"
    parser.set_defaults(func=lambda args: 1 / 0)  # without a signal, the same kind of error is a bug
    assert cli.main([]) == 70
