"""The house rules a reviewer would otherwise check by eye: module size and who may import what.

* every module of ``primal_compiler/`` stays under :data:`LINE_BUDGET` lines;
* only ``frontend/`` imports ``onnx`` (the rest of the compiler sees the IR, never a graph);
* ``executor/`` imports nothing from ``transforms/`` or ``frontend/`` (it replays a stream and a target);
* no two modules import each other, directly or round a longer loop (imports only for type checking
  aside): a cycle hidden behind a function-level import is still a cycle;
* ``ruff check`` with the rule set of ``pyproject.toml`` finds nothing in the code, tests and benchmarks.

Imports are read from the syntax tree, so an import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "primal_compiler"
LINE_BUDGET = 400
MODULES = sorted(ROOT.rglob("*.py"))


def imports(source: str) -> set[str]:
    """Every absolute module an import statement in ``source`` names, wherever it stands."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_imports(source: str, known: set[str]) -> set[str]:
    """The package's modules ``source`` imports when it runs: ``from pkg import mod`` names ``pkg.mod``,
    ``from mod import name`` names ``mod``; imports under ``if TYPE_CHECKING:`` do not count."""
    tree = ast.parse(source)
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
               for n in ast.walk(node)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            found |= subs or ({node.module} & known)
    return found


def _stage(path: Path) -> str:
    return path.relative_to(ROOT).parts[0]


def test_the_import_reader_sees_imports_inside_functions():
    source = "import numpy\n\ndef f():\n    from onnx import helper\n    import primal_compiler.frontend.weights\n"
    assert imports(source) == {"numpy", "onnx", "primal_compiler.frontend.weights"}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_stays_under_the_line_budget(path):
    lines = len(path.read_text().splitlines())
    assert lines < LINE_BUDGET, f"{path.relative_to(ROOT)} has {lines} lines; split it by concept"


def test_only_the_frontend_imports_onnx():
    offenders = {str(p.relative_to(ROOT)): sorted(m for m in imports(p.read_text()) if m.split(".")[0] == "onnx")
                 for p in MODULES if _stage(p) != "frontend"}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_executor_imports_no_compiler_stage():
    stages = ("primal_compiler.transforms", "primal_compiler.frontend")
    offenders = {str(p.relative_to(ROOT)): sorted(m for m in imports(p.read_text()) if m.startswith(stages))
                 for p in MODULES if _stage(p) == "executor"}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_module_imports_itself_round_a_loop():
    import networkx as nx

    names = {module_name(p): p for p in MODULES}
    graph = nx.DiGraph()
    for name, path in names.items():
        graph.add_edges_from((name, m) for m in runtime_imports(path.read_text(), set(names)) if m != name)
    loops = sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)
    assert loops == []


def test_the_cycle_reader_sees_a_loop_behind_a_function_import():
    known = {"primal_compiler.a", "primal_compiler.b", "primal_compiler"}
    source = "from primal_compiler import a\n\ndef f():\n    from primal_compiler.b import x\n"
    assert runtime_imports(source, known) == {"primal_compiler.a", "primal_compiler.b"}
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from primal_compiler.b import x\n"
    assert runtime_imports(typed, known) == set()


def test_ruff_finds_nothing():
    """pyflakes' rules and syntax errors (``[tool.ruff.lint]``): unused imports and names, undefined names."""
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "primal_compiler", "tests",
                           "benchmarks"], cwd=ROOT.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
