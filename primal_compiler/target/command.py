"""``primal targets``: every bundled target validated, one line each; exit 2 when one is invalid."""

from __future__ import annotations

import argparse


def cmd_targets(args: argparse.Namespace) -> None:
    """Print each bundled target's name, ``ok`` or ``INVALID`` (with the one-line reason) and its file."""
    from primal_compiler.report.text import table
    from primal_compiler.target import bundled_targets, validate_all

    paths, results = bundled_targets(), validate_all()
    rows = [(name, "ok" if ok else "INVALID", str(paths.get(name, "")), "" if ok else message)
            for name, ok, message in results]
    print("\n".join(table(rows, ("target", "status", "file", "problem"), ("left",) * 4)))
    if any(not ok for _, ok, _ in results):
        raise SystemExit(2)
