"""Fuzzed target and pipeline files through the CLI: the strategies of ``tests/test_option_fuzz.py``
(which checks the loaders directly) fed to ``inspect --target`` and ``compile -p``.

What is guaranteed: the streams and the scratch tree of :mod:`tests.fuzz.harness`. A pipeline that
searches for long (a GA, CP-SAT) meets the 1 s budget and ends as ``primal: terminated`` (exit 143),
an allowed outcome that must leave no temporaries.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hypothesis import given, settings

from tests.fuzz.harness import BUDGET_S, FUZZ, check_streams, check_tree, invoke, scratch, snapshot
from tests.test_option_fuzz import mutated_pipeline, mutated_target, pipeline_tables


def file_case(argv_of: Callable[[Path], list[str]], text: str, name: str | None, verb: str, budget_s: float) -> None:
    """``verb`` on ``text``, written to $S/``name`` (None: ``text`` is on the command line)."""
    with scratch() as root:
        if name:
            (root / name).write_text(text, encoding="utf-8")
        argv = argv_of(root)
        before = snapshot(root)
        r = invoke(argv, root, budget_s=budget_s)
        r.note = text
        check_streams(verb, r)
        check_tree(r, before, snapshot(root), ("out",))


@settings(max_examples=25, **FUZZ)
@given(text=mutated_target())
def test_target_files(text):
    file_case(lambda root: ["inspect", "tiny-llama", "--lora", "q,v:8", "--target", f"{root}/t.toml"], text, "t.toml",
              "inspect", BUDGET_S)


@settings(max_examples=20, **FUZZ)
@given(text=mutated_pipeline())
def test_pipeline_texts(text):
    """Pipelines that search for long (GA, CP-SAT) meet the budget and end as ``primal: terminated``."""
    file_case(lambda root: ["compile", "tiny-llama", "-p", text, "-o", f"{root}/out"], text, None, "compile", 1.0)


@settings(max_examples=20, **FUZZ)
@given(text=pipeline_tables())
def test_pipeline_files(text):
    file_case(lambda root: ["compile", "tiny-llama", "-p", f"{root}/p.toml", "-o", f"{root}/out"], text, "p.toml",
              "compile", 1.0)
