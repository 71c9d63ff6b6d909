"""docs/tutorial.md works as written: every ``sh`` block's commands and every ``python`` block, in order, in a
fresh directory holding a copy of ``examples/``; and ``examples/make_adapter.py`` writes the adapter committed
there."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from primal_compiler.cli import main

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```(sh|python)\n(.*?)^```", re.M | re.S)


def blocks() -> list[tuple[str, str]]:
    return [(m[1], m[2]) for m in BLOCK.finditer((ROOT / "docs" / "tutorial.md").read_text())]


def test_the_tutorial_has_its_steps():
    kinds = [kind for kind, _ in blocks()]
    assert kinds.count("sh") >= 6 and kinds.count("python") >= 3


def test_the_tutorial_runs_as_written(tmp_path, monkeypatch, capsys):
    pytest.importorskip("onnxruntime")
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    for kind, text in blocks():
        if kind == "python":
            exec(compile(text, "docs/tutorial.md", "exec"), {})  # noqa: S102 - the tutorial's own code
            continue
        for line in text.strip().splitlines():
            args = shlex.split(line)
            assert args[0] == "primal", line
            assert main(args[1:]) == 0, line
    out = capsys.readouterr().out
    assert "check examples/qwen2-tiny.onnx: OK" in out and "Pareto front" in out and "generated [" in out
    assert (tmp_path / "out" / "sweep" / "_plots" / "pareto.png").exists()


def test_the_example_adapter_is_what_its_script_writes(tmp_path):
    import runpy

    runpy.run_path(str(ROOT / "examples" / "make_adapter.py"))["write"](tmp_path / "lora")
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (tmp_path / "lora" / name).read_bytes() == (ROOT / "examples" / "qwen2-tiny-lora" / name).read_bytes()


def test_the_docs_index_names_every_page():
    """docs/README.md links every page of docs/, and nothing that is not there."""
    index = (ROOT / "docs" / "README.md").read_text()
    linked = set(re.findall(r"\]\(([\w-]+\.md)\)", index))
    assert linked == {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
