"""The one output rule (``docs/outputs.md``), finding by finding of issue 47, on every path option.

Each case names a destination that is not a regular file or one of our output directories, or is a
verb's own input: it is refused in one line (exit 2) with ``--force`` too, and stays exactly what it was.
"""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from primal_compiler.cli import main

ROOT = Path(__file__).resolve().parents[1]


def file_verbs(compiled: Path, program_text: Path, work: Path) -> dict[str, list[str]]:
    """Every verb with a file output, as argv lacking only that path (appended last), then ``--force``."""
    (work / "t.jsonl").write_text('{"arrival_s": 0, "adapter": "a", "prompt_tokens": 4, "generate_tokens": 2}\n')
    return {
        "disasm": ["disasm", str(compiled), "-o"],
        "asm": ["asm", str(program_text), "-o"],
        "trace": ["trace", "--adapters", "a", "--requests", "2", "--rate", "1", "-o"],
        "serve": ["serve", "tiny-llama", "--adapters", "a", "--trace", str(work / "t.jsonl"), "--context", "64",
                  "--perfetto"],
    }


def node(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    else:
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("mknod needs CAP_MKNOD")


def fingerprint(path: Path) -> tuple:
    st = path.lstat()
    return stat.S_IFMT(st.st_mode), st.st_rdev, st.st_ino


@pytest.mark.parametrize("kind", ["device", "fifo", "socket"])
@pytest.mark.parametrize("verb", ["disasm", "asm", "trace", "serve"])
def test_force_never_replaces_a_device_fifo_or_socket(verb, kind, compiled, program_text, tmp_path, capsys):
    dest = tmp_path / ("n.jsonl" if verb == "trace" else "n")
    node(dest, kind)
    link = tmp_path / ("l.jsonl" if verb == "trace" else "l")
    link.symlink_to(dest)
    before = fingerprint(dest)
    argv = file_verbs(compiled, program_text, tmp_path)[verb]
    for target in (dest, link):
        assert main([*argv, str(target), "--force"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and ("is a" in err and "never replaced" in err), err
    assert fingerprint(dest) == before and link.is_symlink()


def test_save_logits_never_replaces_a_device(tmp_path, capsys):
    dest = tmp_path / "n.npy"
    node(dest, "device")
    model = ROOT / "tests" / "fixtures" / "onnx" / "llama_torchscript.onnx"
    argv = ["run", str(model), "--functional", "--weights", str(model), "--prompt", "1,2", "--save-logits", str(dest)]
    assert main([*argv, "--force"]) == 2
    assert "a character device" in capsys.readouterr().err and stat.S_ISCHR(dest.lstat().st_mode)


def test_a_verb_never_writes_over_its_own_input(compiled, program_text, capsys):
    program = (compiled / "program.primal").read_bytes()
    for argv in (["disasm", str(compiled), "-o", str(compiled / "program.primal"), "--force"],
                 ["disasm", str(compiled), "-o", str(compiled / "new.txt")],
                 ["disasm", str(compiled / "program.primal"), "-o", str(compiled / "program.primal"), "--force"],
                 ["asm", str(program_text), "-o", str(program_text), "--force"]):
        assert main(argv) == 2, argv
        assert "input" in capsys.readouterr().err
    assert (compiled / "program.primal").read_bytes() == program and not (compiled / "new.txt").exists()


def test_a_second_name_of_an_input_is_the_input(program_text, tmp_path, capsys):
    twin = tmp_path / "twin.txt"
    os.link(program_text, twin)
    assert main(["asm", str(program_text), "-o", str(twin), "--force"]) == 2
    assert "input" in capsys.readouterr().err and twin.read_bytes() == program_text.read_bytes()


def test_a_users_regular_file_is_replaced_only_with_force(compiled, tmp_path, capsys):
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    assert main(["disasm", str(compiled), "-o", str(mine)]) == 2
    assert "pass --force to replace it" in capsys.readouterr().err and mine.read_text() == "mine"
    assert main(["disasm", str(compiled), "-o", str(mine), "--force"]) == 0 and mine.read_text() != "mine"


def test_a_symbolic_link_loop_is_one_line(compiled, tmp_path, capsys):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for dest in (loop, loop / "x.txt"):
        assert main(["disasm", str(compiled), "-o", str(dest), "--force"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "symbolic link" in err, err


def test_a_sweep_never_writes_through_a_symbolic_link(tmp_path, capsys):
    (tmp_path / "spec.toml").write_text('[sweep]\nmodel = "tiny-llama"\npipeline = "fast"\n[axes]\nbatch = [1]\n')
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    argv = ["sweep", str(tmp_path / "spec.toml"), "-o", str(tmp_path / "link"), "--workers", "1", "--no-progress"]
    assert main(argv) == 2
    assert "symbolic link" in capsys.readouterr().err and list((tmp_path / "empty").iterdir()) == []


def test_the_readme_states_the_rule_of_the_docs_word_for_word():
    docs = (ROOT / "docs" / "outputs.md").read_text(encoding="utf-8")
    rule = re.search(r"## The one output rule\n\n(.+?)\n\n", docs, re.S)
    assert rule is not None
    words = " ".join(rule.group(1).split())
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert words in readme and "--force" in words and "symbolic link" in words


@pytest.mark.parametrize("closed", [">&-", "2>&-", ">&- 2>&-"])
def test_a_closed_standard_stream_reads_as_dev_null(closed):
    proc = subprocess.run(f"{sys.executable} -m primal_compiler.cli passes {closed}", shell=True,
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    bad = subprocess.run(f"{sys.executable} -m primal_compiler.cli inspect no-such-model >&-", shell=True,
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.startswith("primal: no-such-model:") and bad.stdout == ""


def test_asm_needs_what_it_reads_not_its_size_limit(program_text, tmp_path):
    """An address-space limit of 1.5 GB, far below the 8 GiB program-text limit, is enough for ``asm``."""
    code = f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({3 << 29}, {3 << 29})); " \
           "from primal_compiler.cli import main; import sys; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, "asm", str(program_text), "-o", str(tmp_path / "p.primal")],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and (tmp_path / "p.primal").exists(), proc.stderr
