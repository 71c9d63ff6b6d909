"""``primal targets``: every bundled target validated, one line each; exit 2 when one is invalid."""

from __future__ import annotations

import argparse


def cmd_targets(args: argparse.Namespace) -> None:
    """Print each bundled target's name, ``ok`` or ``INVALID`` (with the one-line reason) and its file."""
    from primal_compiler.target import bundled_targets, validate_all

    paths = bundled_targets()
    bad, width = 0, max(map(len, paths), default=0)
    for name, ok, message in validate_all():
        bad += not ok
        print(f"{name:<{width}} {'ok' if ok else 'INVALID':<8} {paths.get(name, '')}" + ("" if ok else f"  {message}"))
    if bad:
        raise SystemExit(2)
