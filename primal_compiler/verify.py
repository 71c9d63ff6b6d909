"""``--verify``: one verifier per fact, run on the program after every pass that provides the fact.

A verifier returns the first broken invariant as one line, or None. They
are explicit checks (never ``assert``, which ``python -O`` removes); the
pass manager turns a problem into an InputError naming the pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from primal_compiler.errors import InputError
from primal_compiler.ir.facts import Fact
from primal_compiler.ir.program import Program
from primal_compiler.ir.tiles import Macro


def _tiles(program: Program) -> str | None:
    t = program.tiles
    if t is None:
        return "no tile table"
    sram = t.macro == Macro.SRAM
    rows = np.arange(len(t))
    if not (t.host[sram] >= 0).all():
        return "an SRAM tile has no host"
    own = sram & (t.host == rows)
    if not (t.macro[t.host[sram & ~own]] == Macro.RRAM).all():
        return "an SRAM tile is hosted by another SRAM tile"
    if np.unique(t.host[sram]).size != sram.sum():
        return "two SRAM tiles share a PE's SRAM macro"
    return None


def _placed(program: Program) -> str | None:
    t, layout = program.tiles, program.layout
    if t is None or layout is None:
        return "no tile table or layout"
    sram = t.macro == Macro.SRAM
    owners = ~sram | (sram & (t.host == np.arange(len(t))))  # RRAM tiles and self-hosted SRAM tiles: a PE each
    if not ((t.ct[owners] >= 0).all() and (t.ct < layout.num_cts).all()):
        return "a tile lies outside the CTs"
    placed = owners & (t.pe >= 0)
    if placed.sum() != owners.sum():
        return f"{int(owners.sum() - placed.sum())} PE-owning tiles have no PE"
    if not (t.pe[placed] < layout.rows * layout.cols).all():
        return "a tile's PE is off the mesh"
    key = t.ct[placed].astype(np.int64) * layout.rows * layout.cols + t.pe[placed]
    if np.unique(key).size != key.size:
        return "two tiles share a PE"
    return None


def _checked(check: Callable[[Program], None]) -> Callable[[Program], str | None]:
    def run(program: Program) -> str | None:
        try:
            check(program)
        except AssertionError as exc:  # the codegen invariants raise it explicitly, naming a record
            return str(exc)
        return None

    return run


def _kv(program: Program) -> None:
    from primal_compiler.codegen.check import check_kv_map

    layout = program.need_layout()
    check_kv_map(program.need_kv(), [np.flatnonzero(layout.ct_layer == n) for n in range(program.model.num_layers)])


def _stream(program: Program) -> None:
    from primal_compiler.codegen.check import check_configs, check_kv_appends

    check_configs(program.need_stream())
    check_kv_appends(program.need_stream())


def _power(program: Program) -> None:
    from primal_compiler.codegen.check import check_power

    check_power(program.need_stream())


VERIFIERS: dict[Fact, Callable[[Program], str | None]] = {
    Fact.TILES: _tiles,
    Fact.PLACED: _placed,
    Fact.KV: _checked(_kv),
    Fact.STREAM: _checked(_stream),
    Fact.POWER_SCHEDULE: _checked(_power),
}
"""Facts with a structural invariant to check; the others (blocked, searched, bounded, lora-sparsity) are
recorded choices that the facts above check the results of."""


def verify_provided(program: Program, p: Any) -> None:
    """Every fact pass ``p`` provides holds on ``program`` (its output); InputError naming the pass."""
    for fact in sorted(p.provides):
        check = VERIFIERS.get(fact)
        problem = check(program) if check else None
        if problem:
            done = ", ".join(r.name for r in program.records)
            raise InputError(f"pass {p.name}", f"--verify: {fact} does not hold: {problem} (passes run: {done})")
